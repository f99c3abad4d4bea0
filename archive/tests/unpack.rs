//! Tests for `unpack`: writing archives out without letting entries escape the destination.

mod common;

use std::fs;
use std::path::Path;

use archive::{ArchiveError, unpack};
use common::{Raw, gzip, pack, paths, raw_targz, write};
use tempfile::tempdir;

/// Unpacks into `root/dest`, so anything escaping by one level lands visibly in `root`.
fn unpack_into(root: &Path, bytes: &[u8]) -> Result<Vec<std::path::PathBuf>, ArchiveError> {
    unpack(bytes, &root.join("dest"))
}

fn assert_unsafe(result: Result<Vec<std::path::PathBuf>, ArchiveError>, path: &str) {
    match result {
        Err(ArchiveError::UnsafeEntry { path: p, .. }) => assert_eq!(p, Path::new(path)),
        other => panic!("expected UnsafeEntry for {path}, got {other:?}"),
    }
}

#[test]
fn unpack_creates_the_destination_and_returns_sorted_files() {
    let root = tempdir().unwrap();
    let bytes = raw_targz(&[
        Raw::File(b"z.txt", b"z"),
        Raw::Dir(b"sub"),
        Raw::File(b"sub/a.txt", b"a"),
        Raw::File(b"B.txt", b"b"),
    ]);

    let written = unpack(&bytes[..], &root.path().join("new/dest")).unwrap();
    assert_eq!(written, paths(&["B.txt", "sub/a.txt", "z.txt"]));
    assert_eq!(
        fs::read_to_string(root.path().join("new/dest/sub/a.txt")).unwrap(),
        "a"
    );
}

#[test]
fn unpack_overwrites_files_left_by_an_earlier_unpack() {
    let root = tempdir().unwrap();
    let src = tempdir().unwrap();
    write(src.path(), "result.txt", "first");
    unpack_into(root.path(), &pack(src.path()).0).unwrap();
    write(src.path(), "result.txt", "second");
    unpack_into(root.path(), &pack(src.path()).0).unwrap();

    assert_eq!(
        fs::read_to_string(root.path().join("dest/result.txt")).unwrap(),
        "second"
    );
}

#[test]
fn unpack_rejects_parent_dir_entries() {
    let root = tempdir().unwrap();
    let bytes = raw_targz(&[
        Raw::File(b"ok.txt", b"fine"),
        Raw::File(b"../evil", b"pwned"),
    ]);

    let result = unpack_into(root.path(), &bytes);
    let err = result.as_ref().unwrap_err().to_string();
    assert!(err.starts_with("refusing to unpack ../evil: "), "{err}");
    assert_unsafe(result, "../evil");
    assert!(!root.path().join("evil").exists());
}

#[test]
fn unpack_rejects_parent_dir_components_in_the_middle() {
    let root = tempdir().unwrap();
    let bytes = raw_targz(&[Raw::File(b"a/../../evil", b"pwned")]);

    assert_unsafe(unpack_into(root.path(), &bytes), "a/../../evil");
    assert!(!root.path().join("evil").exists());
}

#[test]
fn unpack_rejects_absolute_paths() {
    let root = tempdir().unwrap();
    let target = root.path().join("abs-evil");
    let name = target.to_str().unwrap().as_bytes();
    let bytes = raw_targz(&[Raw::File(name, b"pwned")]);

    assert_unsafe(unpack_into(root.path(), &bytes), target.to_str().unwrap());
    assert!(!target.exists());
    assert!(
        !root
            .path()
            .join("dest")
            .join(target.strip_prefix("/").unwrap())
            .exists()
    );
}

#[cfg(unix)]
#[test]
fn unpack_rejects_symlinks_pointing_outside() {
    let root = tempdir().unwrap();
    for (name, target) in [
        (&b"abs"[..], &b"/etc/passwd"[..]),
        (b"up", b"../outside"),
        (b"sub/up2", b"../../outside"),
        (b"sneaky", b"sub/../../outside"),
    ] {
        let bytes = raw_targz(&[Raw::Symlink(name, target)]);
        let shown = std::str::from_utf8(name).unwrap();
        assert_unsafe(unpack_into(root.path(), &bytes), shown);
        assert!(fs::symlink_metadata(root.path().join("dest").join(shown)).is_err());
    }
}

#[cfg(unix)]
#[test]
fn unpack_keeps_symlinks_that_stay_inside() {
    let root = tempdir().unwrap();
    let bytes = raw_targz(&[
        Raw::File(b"data/real.txt", b"real"),
        Raw::Symlink(b"data/alias.txt", b"real.txt"),
        Raw::Symlink(b"top/link.txt", b"../data/real.txt"),
    ]);

    let written = unpack_into(root.path(), &bytes).unwrap();
    assert_eq!(
        written,
        paths(&["data/alias.txt", "data/real.txt", "top/link.txt"])
    );
    assert_eq!(
        fs::read_to_string(root.path().join("dest/top/link.txt")).unwrap(),
        "real"
    );
}

#[cfg(unix)]
#[test]
fn unpack_refuses_to_write_through_a_symlink() {
    let root = tempdir().unwrap();
    // `dir -> .` stays inside on its own, but `dir/x -> ..` would then really sit in the root
    // of the destination and point above it.
    let bytes = raw_targz(&[Raw::Symlink(b"dir", b"."), Raw::Symlink(b"dir/x", b"..")]);

    assert_unsafe(unpack_into(root.path(), &bytes), "dir/x");
    assert!(fs::symlink_metadata(root.path().join("dest/x")).is_err());
}

#[cfg(unix)]
#[test]
fn unpack_replaces_a_symlink_already_in_the_destination_instead_of_following_it() {
    let root = tempdir().unwrap();
    let outside = write(root.path(), "outside.txt", "untouched");
    fs::create_dir(root.path().join("dest")).unwrap();
    std::os::unix::fs::symlink(&outside, root.path().join("dest/result.txt")).unwrap();
    let bytes = raw_targz(&[Raw::File(b"result.txt", b"new")]);

    unpack_into(root.path(), &bytes).unwrap();
    assert_eq!(fs::read_to_string(&outside).unwrap(), "untouched");
    let meta = fs::symlink_metadata(root.path().join("dest/result.txt")).unwrap();
    assert!(meta.is_file());
    assert_eq!(
        fs::read_to_string(root.path().join("dest/result.txt")).unwrap(),
        "new"
    );
}

#[test]
fn unpack_refuses_hard_links() {
    let root = tempdir().unwrap();
    let bytes = raw_targz(&[Raw::File(b"a.txt", b"a"), Raw::HardLink(b"b.txt", b"a.txt")]);

    let result = unpack_into(root.path(), &bytes);
    let message = result.as_ref().unwrap_err().to_string();
    assert!(
        message.contains("only files, directories and symlinks"),
        "{message}"
    );
    assert_unsafe(result, "b.txt");
}

#[test]
fn garbage_input_is_reported_as_corrupt() {
    let root = tempdir().unwrap();
    let err = unpack_into(root.path(), b"this is not a tar.gz at all").unwrap_err();
    assert!(matches!(err, ArchiveError::Corrupt(_)), "{err:?}");
    assert!(
        err.to_string()
            .starts_with("the archive is corrupt or not a tar.gz: ")
    );
}

#[test]
fn gzip_of_something_that_is_not_a_tar_is_reported_as_corrupt() {
    let root = tempdir().unwrap();
    let err = unpack_into(root.path(), &gzip(&[b'x'; 2000])).unwrap_err();
    assert!(matches!(err, ArchiveError::Corrupt(_)), "{err:?}");
}

#[test]
fn empty_input_is_reported_as_corrupt() {
    let root = tempdir().unwrap();
    let err = unpack_into(root.path(), b"").unwrap_err();
    assert!(matches!(err, ArchiveError::Corrupt(_)), "{err:?}");
}

#[test]
fn truncated_archive_is_reported_as_corrupt() {
    let src = tempdir().unwrap();
    // Incompressible-ish content so the cut lands inside file data.
    let noise: String = (0..200_000u32)
        .map(|i| char::from(b'a' + (i.wrapping_mul(2_654_435_761) >> 27) as u8 % 26))
        .collect();
    write(src.path(), "big.txt", &noise);
    write(src.path(), "small.txt", "s");
    let (bytes, _) = pack(src.path());

    for cut in [bytes.len() / 2, bytes.len() - 4] {
        let root = tempdir().unwrap();
        let err = unpack_into(root.path(), &bytes[..cut]).unwrap_err();
        assert!(
            matches!(err, ArchiveError::Corrupt(_)),
            "cut at {cut}: {err:?}"
        );
    }
}

#[test]
fn flipped_byte_is_reported_as_corrupt() {
    let src = tempdir().unwrap();
    write(src.path(), "a.txt", &"hello ".repeat(1000));
    let (mut bytes, _) = pack(src.path());
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0xff;

    let root = tempdir().unwrap();
    let err = unpack_into(root.path(), &bytes).unwrap_err();
    assert!(matches!(err, ArchiveError::Corrupt(_)), "{err:?}");
}
