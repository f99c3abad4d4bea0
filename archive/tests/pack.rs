//! Tests for `pack_dir`, `pack_files` and `sha256_hex`: the deterministic tar.gz format.

mod common;

use std::fs::{self, File, FileTimes};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use archive::{ArchiveError, pack_dir, pack_files, sha256_hex, unpack};
use common::{pack, paths, write};
use flate2::read::GzDecoder;
use tempfile::tempdir;

fn sample_tree(root: &Path) {
    write(root, "train.py", "print('train')\n");
    write(root, "lib/util.py", "def f(): pass\n");
    write(root, "lib/data/config.json", "{\"lr\": 0.1}\n");
    write(root, ".env", "SEED=1\n");
}

#[test]
fn packing_twice_gives_identical_bytes_and_digest() {
    let dir = tempdir().unwrap();
    sample_tree(dir.path());

    let (first, first_summary) = pack(dir.path());
    let (second, second_summary) = pack(dir.path());
    assert_eq!(first, second);
    assert_eq!(first_summary, second_summary);
}

#[cfg(unix)]
#[test]
fn mtimes_and_non_exec_permission_bits_do_not_change_the_digest() {
    let dir = tempdir().unwrap();
    sample_tree(dir.path());
    let (_, before) = pack(dir.path());

    let old = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000_000);
    let file = File::options()
        .write(true)
        .open(dir.path().join("train.py"))
        .unwrap();
    file.set_times(FileTimes::new().set_modified(old).set_accessed(old))
        .unwrap();
    drop(file);
    common::set_mode(&dir.path().join("lib/util.py"), 0o600);

    let (_, after) = pack(dir.path());
    assert_eq!(before.digest, after.digest);
}

#[test]
fn the_same_tree_in_two_places_has_the_same_digest() {
    let one = tempdir().unwrap();
    let two = tempdir().unwrap();
    sample_tree(one.path());
    sample_tree(two.path());

    assert_eq!(pack(one.path()).1.digest, pack(two.path()).1.digest);
}

#[test]
fn changing_a_file_changes_the_digest() {
    let dir = tempdir().unwrap();
    sample_tree(dir.path());
    let (_, before) = pack(dir.path());
    write(dir.path(), "train.py", "print('changed')\n");

    assert_ne!(before.digest, pack(dir.path()).1.digest);
}

#[test]
fn summary_counts_files_and_bytes_and_matches_the_output() {
    let dir = tempdir().unwrap();
    sample_tree(dir.path());
    write(dir.path(), ".gitignore", "*.tmp\n");
    write(dir.path(), "ignored.tmp", "not counted");

    let (bytes, summary) = pack(dir.path());
    let raw: u64 = [
        "train.py",
        "lib/util.py",
        "lib/data/config.json",
        ".env",
        ".gitignore",
    ]
    .iter()
    .map(|f| fs::metadata(dir.path().join(f)).unwrap().len())
    .sum();
    assert_eq!(summary.files, 5);
    assert_eq!(summary.raw_bytes, raw);
    assert_eq!(summary.bytes, bytes.len() as u64);
    assert_eq!(summary.digest, sha256_hex(&bytes[..]).unwrap());
    assert_eq!(summary.digest.len(), 64);
    assert!(
        summary
            .digest
            .chars()
            .all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c))
    );
}

#[test]
fn progress_reaches_the_raw_total_and_never_goes_backwards() {
    let dir = tempdir().unwrap();
    sample_tree(dir.path());
    // Bigger than one progress step, so progress is also reported within the file.
    write(dir.path(), "big.bin", &"x".repeat(3 << 20));

    let mut calls = Vec::new();
    let summary = pack_dir(dir.path(), std::io::sink(), |done, total| {
        calls.push((done, total))
    })
    .unwrap();

    assert_eq!(calls.first(), Some(&(0, summary.raw_bytes)));
    assert_eq!(calls.last(), Some(&(summary.raw_bytes, summary.raw_bytes)));
    assert!(
        calls.len() > 5,
        "expected progress within big.bin: {calls:?}"
    );
    assert!(calls.windows(2).all(|w| w[0].0 <= w[1].0));
    assert!(calls.iter().all(|&(done, total)| done <= total));
}

#[test]
fn entries_are_sorted_with_pinned_metadata() {
    let dir = tempdir().unwrap();
    sample_tree(dir.path());
    #[cfg(unix)]
    common::set_mode(&dir.path().join("train.py"), 0o750);

    let (bytes, _) = pack(dir.path());
    let mut tar = tar::Archive::new(GzDecoder::new(&bytes[..]));
    let mut names = Vec::new();
    for entry in tar.entries().unwrap() {
        let entry = entry.unwrap();
        let header = entry.header();
        let name = entry.path().unwrap().into_owned();
        assert_eq!(header.mtime().unwrap(), 0, "{name:?}");
        assert_eq!(header.uid().unwrap(), 0, "{name:?}");
        assert_eq!(header.gid().unwrap(), 0, "{name:?}");
        assert_eq!(header.username_bytes(), Some(&b""[..]), "{name:?}");
        assert_eq!(header.groupname_bytes(), Some(&b""[..]), "{name:?}");
        let expected_mode = match name.to_str().unwrap() {
            "lib" | "lib/data" => 0o755,
            #[cfg(unix)]
            "train.py" => 0o755,
            _ => 0o644,
        };
        assert_eq!(header.mode().unwrap(), expected_mode, "{name:?}");
        names.push(name);
    }
    assert_eq!(
        names,
        paths(&[
            ".env",
            "lib",
            "lib/data",
            "lib/data/config.json",
            "lib/util.py",
            "train.py"
        ])
    );
}

#[test]
fn gzip_header_carries_no_file_name_or_mtime() {
    let dir = tempdir().unwrap();
    sample_tree(dir.path());

    let (bytes, _) = pack(dir.path());
    assert_eq!(&bytes[..3], &[0x1f, 0x8b, 8], "gzip magic and deflate");
    assert_eq!(bytes[3], 0, "no FNAME/FCOMMENT/FEXTRA flags");
    assert_eq!(&bytes[4..8], &[0, 0, 0, 0], "mtime is zero");
}

#[cfg(unix)]
#[test]
fn round_trip_preserves_contents_exec_bit_and_symlinks() {
    let src = tempdir().unwrap();
    sample_tree(src.path());
    let script = write(src.path(), "bin/run.sh", "#!/bin/sh\necho hi\n");
    common::set_mode(&script, 0o755);
    std::os::unix::fs::symlink("../train.py", src.path().join("lib/train-link.py")).unwrap();

    let (bytes, summary) = pack(src.path());
    let dest = tempdir().unwrap();
    let out = dest.path().join("unpacked");
    let written = unpack(&bytes[..], &out).unwrap();

    assert_eq!(written, archive::list_source_files(src.path()).unwrap());
    assert_eq!(summary.files, written.len() as u64);
    for file in [
        "train.py",
        "lib/util.py",
        "lib/data/config.json",
        ".env",
        "bin/run.sh",
    ] {
        assert_eq!(
            fs::read(out.join(file)).unwrap(),
            fs::read(src.path().join(file)).unwrap(),
            "{file}"
        );
    }
    assert_eq!(common::mode_of(&out.join("bin/run.sh")), 0o755);
    assert_eq!(common::mode_of(&out.join("train.py")), 0o644);
    assert_eq!(
        fs::read_link(out.join("lib/train-link.py")).unwrap(),
        PathBuf::from("../train.py")
    );
    assert_eq!(
        fs::read_to_string(out.join("lib/train-link.py")).unwrap(),
        "print('train')\n"
    );
}

#[test]
fn long_paths_survive_the_round_trip() {
    let src = tempdir().unwrap();
    let long = format!("{}/{}.txt", "d".repeat(80), "f".repeat(120));
    write(src.path(), &long, "deep");

    let (bytes, _) = pack(src.path());
    let dest = tempdir().unwrap();
    let written = unpack(&bytes[..], dest.path()).unwrap();
    assert_eq!(written, paths(&[long.as_str()]));
    assert_eq!(fs::read_to_string(dest.path().join(&long)).unwrap(), "deep");
}

#[cfg(unix)]
#[test]
fn unreadable_file_error_names_the_file() {
    let dir = tempdir().unwrap();
    write(dir.path(), "src/main.py", "x");
    let secret = write(dir.path(), "src/secret.txt", "s3cret");
    common::set_mode(&secret, 0o000);
    if File::open(&secret).is_ok() {
        eprintln!(
            "skipping unreadable_file_error_names_the_file: running as root, where chmod 000 \
             does not stop reads"
        );
        return;
    }

    let err = pack_dir(dir.path(), std::io::sink(), |_, _| {}).unwrap_err();
    assert!(matches!(err, ArchiveError::Unreadable { .. }), "{err:?}");
    let message = err.to_string();
    assert!(
        message.starts_with("cannot read src/secret.txt: "),
        "{message}"
    );
    assert!(message.contains("Permission denied"), "{message}");
    assert!(
        message.ends_with("fix its permissions or add it to .gpulayerignore"),
        "{message}"
    );
}

#[cfg(unix)]
#[test]
fn symlink_pointing_outside_the_tree_is_refused_at_pack_time() {
    let dir = tempdir().unwrap();
    write(dir.path(), "main.py", "x");
    std::os::unix::fs::symlink("/etc/hostname", dir.path().join("host")).unwrap();

    let err = pack_dir(dir.path(), std::io::sink(), |_, _| {}).unwrap_err();
    assert!(
        matches!(err, ArchiveError::SymlinkOutside { .. }),
        "{err:?}"
    );
    let message = err.to_string();
    assert!(
        message.starts_with("host is a symlink to /etc/hostname"),
        "{message}"
    );
    assert!(message.contains(".gpulayerignore"), "{message}");

    // Ignoring it is the way out the message suggests.
    write(dir.path(), ".gpulayerignore", "host\n");
    pack_dir(dir.path(), std::io::sink(), |_, _| {}).unwrap();
}

#[test]
fn packing_a_missing_directory_is_reported_as_not_found() {
    let dir = tempdir().unwrap();
    let missing = dir.path().join("missing");

    let err = pack_dir(&missing, std::io::sink(), |_, _| {}).unwrap_err();
    assert!(matches!(err, ArchiveError::NotFound(_)), "{err:?}");
    assert!(err.to_string().contains(&missing.display().to_string()));
}

#[test]
fn pack_files_stores_files_under_their_archive_paths_and_skips_directories() {
    let work = tempdir().unwrap();
    let a = write(work.path(), "somewhere/a.txt", "A");
    let b = write(work.path(), "elsewhere/b.txt", "B");
    let listed_dir = work.path().join("somewhere");

    let files = vec![
        (b.clone(), PathBuf::from("out/b.txt")),
        (a.clone(), PathBuf::from("./a.txt")),
        (listed_dir, PathBuf::from("dir")),
    ];
    let mut bytes = Vec::new();
    let summary = pack_files(&files, &mut bytes).unwrap();
    assert_eq!(summary.files, 2);
    assert_eq!(summary.raw_bytes, 2);
    assert_eq!(summary.digest, sha256_hex(&bytes[..]).unwrap());

    let dest = tempdir().unwrap();
    let written = unpack(&bytes[..], dest.path()).unwrap();
    assert_eq!(written, paths(&["a.txt", "out/b.txt"]));
    assert_eq!(
        fs::read_to_string(dest.path().join("out/b.txt")).unwrap(),
        "B"
    );

    // Same input in another order: same bytes.
    let mut reversed = files.clone();
    reversed.reverse();
    let mut again = Vec::new();
    assert_eq!(pack_files(&reversed, &mut again).unwrap(), summary);
    assert_eq!(again, bytes);
}

#[test]
fn pack_files_reports_a_missing_file_as_not_found() {
    let work = tempdir().unwrap();
    let missing = work.path().join("gone.txt");

    let err = pack_files(
        &[(missing.clone(), PathBuf::from("gone.txt"))],
        std::io::sink(),
    )
    .unwrap_err();
    assert!(
        matches!(err, ArchiveError::NotFound(ref p) if *p == missing),
        "{err:?}"
    );
    assert!(err.to_string().contains(&missing.display().to_string()));
}

#[test]
fn pack_files_refuses_archive_paths_that_escape() {
    let work = tempdir().unwrap();
    let file = write(work.path(), "a.txt", "A");

    for bad in ["../a.txt", "/abs/a.txt", "x/../../a.txt", ""] {
        let err = pack_files(&[(file.clone(), PathBuf::from(bad))], std::io::sink()).unwrap_err();
        assert!(
            matches!(err, ArchiveError::InvalidArchivePath(_)),
            "{bad}: {err:?}"
        );
    }
}

#[test]
fn pack_files_refuses_two_files_with_the_same_archive_path() {
    let work = tempdir().unwrap();
    let a = write(work.path(), "a.txt", "A");
    let b = write(work.path(), "b.txt", "B");

    let err = pack_files(
        &[
            (a.clone(), PathBuf::from("same.txt")),
            (b, PathBuf::from("same.txt")),
        ],
        std::io::sink(),
    )
    .unwrap_err();
    assert!(matches!(err, ArchiveError::DuplicatePath(ref p) if p == Path::new("same.txt")));

    // A file where another entry needs a directory is the same clash.
    let err = pack_files(
        &[
            (a.clone(), PathBuf::from("x")),
            (a, PathBuf::from("x/y.txt")),
        ],
        std::io::sink(),
    )
    .unwrap_err();
    assert!(
        matches!(err, ArchiveError::DuplicatePath(ref p) if p == Path::new("x")),
        "{err:?}"
    );
}

#[test]
fn sha256_hex_matches_a_known_vector() {
    assert_eq!(
        sha256_hex(&b"abc"[..]).unwrap(),
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    );
    let mut file = tempfile::tempfile().unwrap();
    std::io::Write::write_all(&mut file, b"abc").unwrap();
    std::io::Seek::rewind(&mut file).unwrap();
    assert_eq!(sha256_hex(&file).unwrap(), sha256_hex(&b"abc"[..]).unwrap());
}
