//! Tests for `list_source_files`: which files of a source directory get packed.

mod common;

use std::fs;

use archive::{ArchiveError, list_source_files};
use common::{paths, write};
use tempfile::tempdir;

#[test]
fn gitignored_files_are_left_out() {
    let dir = tempdir().unwrap();
    write(dir.path(), ".gitignore", "*.log\ntarget/\n");
    write(dir.path(), "main.py", "print(1)");
    write(dir.path(), "debug.log", "noise");
    write(dir.path(), "target/big.bin", "xx");

    let files = list_source_files(dir.path()).unwrap();
    assert_eq!(files, paths(&[".gitignore", "main.py"]));
}

#[test]
fn gitignore_also_applies_inside_a_git_repository() {
    let dir = tempdir().unwrap();
    fs::create_dir(dir.path().join(".git")).unwrap();
    write(dir.path(), ".gitignore", "*.log\n");
    write(dir.path(), "debug.log", "noise");
    write(dir.path(), "main.py", "print(1)");

    let files = list_source_files(dir.path()).unwrap();
    assert_eq!(files, paths(&[".gitignore", "main.py"]));
}

#[test]
fn nested_gitignore_negation_brings_files_back() {
    let dir = tempdir().unwrap();
    write(dir.path(), ".gitignore", "*.log\n");
    write(dir.path(), "root.log", "x");
    write(dir.path(), "sub/.gitignore", "!keep.log\nlocal.txt\n");
    write(dir.path(), "sub/keep.log", "kept");
    write(dir.path(), "sub/other.log", "x");
    write(dir.path(), "sub/local.txt", "x");
    write(dir.path(), "local.txt", "only ignored in sub/");

    let files = list_source_files(dir.path()).unwrap();
    assert_eq!(
        files,
        paths(&[".gitignore", "local.txt", "sub/.gitignore", "sub/keep.log"])
    );
}

#[test]
fn gpulayerignore_and_dot_ignore_files_are_honoured() {
    let dir = tempdir().unwrap();
    write(dir.path(), ".gpulayerignore", "data/\n*.ckpt\n");
    write(dir.path(), ".ignore", "scratch.txt\n");
    write(dir.path(), "data/train.csv", "1,2");
    write(dir.path(), "models/last.ckpt", "weights");
    write(dir.path(), "scratch.txt", "x");
    write(dir.path(), "train.py", "x");
    write(dir.path(), "nested/.gpulayerignore", "secret.env\n");
    write(dir.path(), "nested/secret.env", "TOKEN=1");
    write(dir.path(), "nested/ok.env", "A=1");

    let files = list_source_files(dir.path()).unwrap();
    assert_eq!(
        files,
        paths(&[
            ".gpulayerignore",
            ".ignore",
            "nested/.gpulayerignore",
            "nested/ok.env",
            "train.py",
        ])
    );
}

#[test]
fn git_directory_is_skipped_but_other_hidden_files_are_kept() {
    let dir = tempdir().unwrap();
    write(dir.path(), ".git/HEAD", "ref: refs/heads/main");
    write(dir.path(), ".git/objects/ab/cdef", "blob");
    write(
        dir.path(),
        "vendor/lib/.git",
        "gitdir: ../../.git/modules/lib",
    );
    write(dir.path(), ".env", "A=1");
    write(dir.path(), ".github/workflows/ci.yml", "on: push");
    write(dir.path(), "vendor/lib/code.c", "int x;");

    let files = list_source_files(dir.path()).unwrap();
    assert_eq!(
        files,
        paths(&[".env", ".github/workflows/ci.yml", "vendor/lib/code.c"])
    );
}

#[test]
fn files_are_listed_in_bytewise_order() {
    let dir = tempdir().unwrap();
    for name in ["a/b.txt", "a.txt", "B.txt", "a-b.txt"] {
        write(dir.path(), name, name);
    }

    let files = list_source_files(dir.path()).unwrap();
    // Bytewise: '-' < '.' < '/' and uppercase before lowercase, unlike `Path`'s component order.
    assert_eq!(files, paths(&["B.txt", "a-b.txt", "a.txt", "a/b.txt"]));
}

#[test]
fn empty_directories_are_not_listed() {
    let dir = tempdir().unwrap();
    fs::create_dir_all(dir.path().join("empty/deeper")).unwrap();
    write(dir.path(), "x.txt", "x");

    assert_eq!(list_source_files(dir.path()).unwrap(), paths(&["x.txt"]));
}

#[cfg(unix)]
#[test]
fn symlinks_are_listed_but_not_followed() {
    let dir = tempdir().unwrap();
    let elsewhere = tempdir().unwrap();
    write(elsewhere.path(), "inside-target.txt", "x");
    write(dir.path(), "real.txt", "x");
    std::os::unix::fs::symlink("real.txt", dir.path().join("alias.txt")).unwrap();
    std::os::unix::fs::symlink(elsewhere.path(), dir.path().join("linked-dir")).unwrap();

    let files = list_source_files(dir.path()).unwrap();
    assert_eq!(files, paths(&["alias.txt", "linked-dir", "real.txt"]));
}

#[test]
fn missing_directory_is_reported_as_not_found() {
    let dir = tempdir().unwrap();
    let missing = dir.path().join("nope");

    let err = list_source_files(&missing).unwrap_err();
    assert!(
        matches!(err, ArchiveError::NotFound(ref p) if *p == missing),
        "{err:?}"
    );
    let message = err.to_string();
    assert!(
        message.contains(&missing.display().to_string()),
        "{message}"
    );
    assert!(message.contains("does not exist"), "{message}");
}

#[test]
fn file_instead_of_directory_is_reported_as_not_a_directory() {
    let dir = tempdir().unwrap();
    let file = write(dir.path(), "job.py", "x");

    let err = list_source_files(&file).unwrap_err();
    assert!(
        matches!(err, ArchiveError::NotADirectory(ref p) if *p == file),
        "{err:?}"
    );
    let message = err.to_string();
    assert!(message.contains(&file.display().to_string()), "{message}");
    assert!(message.contains("is not a directory"), "{message}");
}

#[cfg(unix)]
#[test]
fn a_symlinked_source_directory_is_walked() {
    let dir = tempdir().unwrap();
    let real = dir.path().join("real");
    write(&real, "main.py", "x");
    write(&real, "pkg/mod.py", "x");
    let link = dir.path().join("link");
    std::os::unix::fs::symlink(&real, &link).unwrap();

    assert_eq!(
        list_source_files(&link).unwrap(),
        paths(&["main.py", "pkg/mod.py"])
    );
}

#[cfg(unix)]
#[test]
fn unreadable_directory_error_names_the_directory() {
    let dir = tempdir().unwrap();
    write(dir.path(), "ok.py", "x");
    let locked = dir.path().join("locked");
    write(&locked, "inside.txt", "x");
    common::set_mode(&locked, 0o000);
    if fs::read_dir(&locked).is_ok() {
        common::set_mode(&locked, 0o755);
        eprintln!(
            "skipping unreadable_directory_error_names_the_directory: running as root, where \
             chmod 000 does not stop reads"
        );
        return;
    }

    let result = list_source_files(dir.path());
    // Let tempdir clean up.
    common::set_mode(&locked, 0o755);
    let err = result.unwrap_err();
    assert!(matches!(err, ArchiveError::Unreadable { .. }), "{err:?}");
    let message = err.to_string();
    assert!(message.starts_with("cannot read locked: "), "{message}");
}
