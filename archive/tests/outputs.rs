//! Tests for `collect_outputs`: which files of a finished job become its outputs.

mod common;

use std::fs;
use std::path::{Path, PathBuf};

use archive::{ArchiveError, collect_outputs, pack_files, unpack};
use common::{paths, write};
use tempfile::tempdir;

fn globs(list: &[&str]) -> Vec<String> {
    list.iter().map(|g| g.to_string()).collect()
}

fn archive_paths(outputs: &[(PathBuf, PathBuf)]) -> Vec<PathBuf> {
    outputs.iter().map(|(_, inside)| inside.clone()).collect()
}

#[test]
fn output_dir_files_are_collected_recursively() {
    let job = tempdir().unwrap();
    let out = job.path().join("outputs");
    write(&out, "model.pt", "w");
    write(&out, "plots/loss.png", "p");
    write(&out, "plots/deep/more.csv", "c");

    let outputs = collect_outputs(&out, &job.path().join("work"), &[]).unwrap();
    assert_eq!(
        archive_paths(&outputs),
        paths(&["model.pt", "plots/deep/more.csv", "plots/loss.png"])
    );
    assert_eq!(outputs[0].0, out.join("model.pt"));
}

#[test]
fn single_star_does_not_cross_directories() {
    let job = tempdir().unwrap();
    let work = job.path().join("work");
    write(&work, "a.txt", "a");
    write(&work, "sub/b.txt", "b");
    write(&work, "c.log", "c");

    let outputs =
        collect_outputs(&job.path().join("no-outputs"), &work, &globs(&["*.txt"])).unwrap();
    assert_eq!(archive_paths(&outputs), paths(&["a.txt"]));
}

#[test]
fn double_star_matches_at_any_depth() {
    let job = tempdir().unwrap();
    let work = job.path().join("work");
    write(&work, "a.txt", "a");
    write(&work, "sub/b.txt", "b");
    write(&work, "sub/deeper/c.txt", "c");
    write(&work, "sub/d.log", "d");

    let outputs = collect_outputs(&job.path().join("none"), &work, &globs(&["**/*.txt"])).unwrap();
    assert_eq!(
        archive_paths(&outputs),
        paths(&["a.txt", "sub/b.txt", "sub/deeper/c.txt"])
    );
    assert_eq!(outputs[2].0, work.join("sub/deeper/c.txt"));
}

#[test]
fn several_globs_and_leading_dot_slash_work_together() {
    let job = tempdir().unwrap();
    let work = job.path().join("work");
    write(&work, "ckpt/last.pt", "w");
    write(&work, "metrics.json", "{}");
    write(&work, "train.py", "x");

    let outputs = collect_outputs(
        &job.path().join("none"),
        &work,
        &globs(&["./ckpt/*.pt", "metrics.json"]),
    )
    .unwrap();
    assert_eq!(
        archive_paths(&outputs),
        paths(&["ckpt/last.pt", "metrics.json"])
    );
}

#[test]
fn output_dir_wins_over_a_glob_match_with_the_same_archive_path() {
    let job = tempdir().unwrap();
    let work = job.path().join("work");
    let out = job.path().join("outputs");
    write(&work, "result.txt", "from work");
    write(&work, "other.txt", "only in work");
    write(&out, "result.txt", "from outputs");

    let outputs = collect_outputs(&out, &work, &globs(&["*.txt"])).unwrap();
    assert_eq!(
        outputs,
        vec![
            (work.join("other.txt"), PathBuf::from("other.txt")),
            (out.join("result.txt"), PathBuf::from("result.txt")),
        ]
    );
}

#[test]
fn output_dir_inside_the_work_dir_is_collected_under_both_names() {
    // The precedence rule is per archive path; the same file reached two ways is two paths.
    let work = tempdir().unwrap();
    let out = work.path().join("outputs");
    write(&out, "r.txt", "r");

    let outputs = collect_outputs(&out, work.path(), &globs(&["**/*.txt"])).unwrap();
    assert_eq!(archive_paths(&outputs), paths(&["outputs/r.txt", "r.txt"]));
}

#[test]
fn missing_output_dir_contributes_nothing() {
    let job = tempdir().unwrap();
    let outputs = collect_outputs(&job.path().join("missing"), job.path(), &[]).unwrap();
    assert!(outputs.is_empty());
}

#[test]
fn results_are_sorted_bytewise_by_archive_path() {
    let job = tempdir().unwrap();
    let out = job.path().join("outputs");
    let work = job.path().join("work");
    write(&out, "a/b.txt", "x");
    write(&out, "a.txt", "x");
    write(&work, "B.txt", "x");
    write(&work, "a-b.txt", "x");

    let outputs = collect_outputs(&out, &work, &globs(&["*.txt"])).unwrap();
    assert_eq!(
        archive_paths(&outputs),
        paths(&["B.txt", "a-b.txt", "a.txt", "a/b.txt"])
    );
}

#[test]
fn invalid_glob_is_reported_with_the_pattern() {
    let job = tempdir().unwrap();
    let err =
        collect_outputs(job.path(), job.path(), &globs(&["ok/*.txt", "bad/[.txt"])).unwrap_err();
    assert!(matches!(err, ArchiveError::InvalidGlob { ref pattern, .. } if pattern == "bad/[.txt"));
    let message = err.to_string();
    assert!(
        message.starts_with("output glob \"bad/[.txt\" is invalid: "),
        "{message}"
    );
}

#[cfg(unix)]
#[test]
fn symlinks_are_neither_followed_nor_collected() {
    let job = tempdir().unwrap();
    let secrets = tempdir().unwrap();
    write(secrets.path(), "key.txt", "secret");
    let out = job.path().join("outputs");
    let work = job.path().join("work");
    write(&out, "real.txt", "r");
    write(&work, "w.txt", "w");
    std::os::unix::fs::symlink(secrets.path().join("key.txt"), out.join("link.txt")).unwrap();
    std::os::unix::fs::symlink(secrets.path(), out.join("linked-dir")).unwrap();
    std::os::unix::fs::symlink(secrets.path(), work.join("linked-dir")).unwrap();

    let outputs = collect_outputs(&out, &work, &globs(&["**/*.txt"])).unwrap();
    assert_eq!(archive_paths(&outputs), paths(&["real.txt", "w.txt"]));
}

#[test]
fn collected_outputs_pack_and_unpack_as_listed() {
    let job = tempdir().unwrap();
    let out = job.path().join("outputs");
    let work = job.path().join("work");
    write(&out, "model/weights.bin", "weights");
    write(&work, "logs/run.log", "log");

    let outputs = collect_outputs(&out, &work, &globs(&["logs/*.log"])).unwrap();
    let mut bytes = Vec::new();
    let summary = pack_files(&outputs, &mut bytes).unwrap();
    assert_eq!(summary.files, 2);

    let client = tempdir().unwrap();
    let written = unpack(&bytes[..], client.path()).unwrap();
    assert_eq!(written, archive_paths(&outputs));
    assert_eq!(
        fs::read_to_string(client.path().join(Path::new("model/weights.bin"))).unwrap(),
        "weights"
    );
}
