//! Tests for `verify`: the server's check of an uploaded source, writing nothing, by the
//! rules `unpack` applies again on the worker.

mod common;

use archive::{ArchiveError, Contents, Limits, verify};
use common::{Raw, pack, raw_targz, write};
use tempfile::tempdir;

fn refused(bytes: &[u8], limits: Limits) -> (String, String) {
    match verify(bytes, limits) {
        Err(ArchiveError::UnsafeEntry { path, reason }) => (path.display().to_string(), reason),
        other => panic!("expected UnsafeEntry, got {other:?}"),
    }
}

#[test]
fn a_packed_source_passes_and_is_counted() {
    let src = tempdir().unwrap();
    write(src.path(), "train.py", "print(1)\n");
    write(src.path(), "data/x.csv", "a,b\n1,2\n");
    let (bytes, _) = pack(src.path());
    assert_eq!(
        verify(&bytes[..], Limits::default()).unwrap(),
        Contents {
            files: 2,
            bytes: 17
        }
    );
}

#[test]
fn every_kind_of_crafted_entry_is_refused_with_its_path_and_why() {
    let d = Limits::default();
    let cases: Vec<(Vec<Raw<'_>>, &str, &str)> = vec![
        (vec![Raw::File(b"../evil", b"x")], "../evil", "climbs out"),
        (
            vec![Raw::File(b"a/../../evil", b"x")],
            "a/../../evil",
            "climbs out",
        ),
        (
            vec![Raw::File(b"/etc/cron.d/x", b"x")],
            "/etc/cron.d/x",
            "absolute",
        ),
        (
            vec![Raw::Symlink(b"up", b"../../etc")],
            "up",
            "points outside the destination",
        ),
        (
            vec![Raw::Symlink(b"abs", b"/etc/passwd")],
            "abs",
            "points outside the destination",
        ),
        (
            vec![
                Raw::Dir(b"sub"),
                Raw::Symlink(b"link", b"sub"),
                Raw::File(b"link/x", b"x"),
            ],
            "link/x",
            "written through the symlink link",
        ),
        (
            vec![Raw::File(b"a", b"x"), Raw::HardLink(b"b", b"a")],
            "b",
            "Link entry",
        ),
        (vec![Raw::Device(b"null")], "null", "Char entry"),
    ];
    for (entries, path, why) in cases {
        let (p, reason) = refused(&raw_targz(&entries), d);
        assert_eq!(p, path);
        assert!(reason.contains(why), "{path}: {reason}");
    }
}

#[test]
fn archives_over_the_limits_are_refused() {
    let bytes = raw_targz(&[Raw::File(b"a", b"12345"), Raw::File(b"b", b"67890")]);
    let (path, reason) = refused(
        &bytes,
        Limits {
            max_bytes: 9,
            max_entries: 100,
        },
    );
    assert_eq!(path, "b");
    assert!(reason.contains("more than 9 bytes unpacked"), "{reason}");
    let (path, reason) = refused(
        &bytes,
        Limits {
            max_bytes: 100,
            max_entries: 1,
        },
    );
    assert_eq!(path, "b");
    assert!(reason.contains("more than 1 entries"), "{reason}");
    assert!(
        verify(
            &bytes[..],
            Limits {
                max_bytes: 10,
                max_entries: 2
            }
        )
        .is_ok()
    );
}

#[test]
fn what_is_not_a_tar_gz_is_corrupt() {
    for bytes in [
        &b""[..],
        b"\x80\x04pickle",
        &common::gzip(b"not a tar at all"),
    ] {
        assert!(
            matches!(
                verify(bytes, Limits::default()),
                Err(ArchiveError::Corrupt(_))
            ),
            "{bytes:?}"
        );
    }
}
