//! Helpers shared by the archive crate's integration tests: building trees and hand-made tars.
#![allow(dead_code, unreachable_pub)]

use std::fs;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use archive::PackSummary;
use flate2::Compression;
use flate2::write::GzEncoder;
use tar::{EntryType, Header};

/// Writes `contents` to `root/relative`, creating parent directories.
pub fn write(root: &Path, relative: &str, contents: &str) -> PathBuf {
    let path = root.join(relative);
    if let Some(parent) = path.parent() {
        fs::create_dir_all(parent).unwrap();
    }
    fs::write(&path, contents).unwrap();
    path
}

#[cfg(unix)]
pub fn set_mode(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt as _;
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
}

#[cfg(unix)]
pub fn mode_of(path: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt as _;
    fs::metadata(path).unwrap().permissions().mode() & 0o7777
}

/// Packs `dir` into memory.
pub fn pack(dir: &Path) -> (Vec<u8>, PackSummary) {
    let mut out = Vec::new();
    let summary = archive::pack_dir(dir, &mut out, |_, _| {}).unwrap();
    (out, summary)
}

pub fn paths(list: &[&str]) -> Vec<PathBuf> {
    list.iter().map(PathBuf::from).collect()
}

/// One hand-made tar entry; names are raw bytes so tests can write what `tar::Builder` refuses.
pub enum Raw<'a> {
    File(&'a [u8], &'a [u8]),
    Dir(&'a [u8]),
    Symlink(&'a [u8], &'a [u8]),
    HardLink(&'a [u8], &'a [u8]),
    /// A character device (what `/dev/null` would be stored as).
    Device(&'a [u8]),
}

/// Builds a tar.gz from raw entries, bypassing the path checks of `append_data`.
pub fn raw_targz(entries: &[Raw<'_>]) -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    for entry in entries {
        let (kind, name, link, data): (EntryType, &[u8], &[u8], &[u8]) = match *entry {
            Raw::File(name, data) => (EntryType::Regular, name, b"", data),
            Raw::Dir(name) => (EntryType::Directory, name, b"", b""),
            Raw::Symlink(name, target) => (EntryType::Symlink, name, target, b""),
            Raw::HardLink(name, target) => (EntryType::Link, name, target, b""),
            Raw::Device(name) => (EntryType::Char, name, b"", b""),
        };
        let mut header = Header::new_gnu();
        header.set_entry_type(kind);
        header.set_size(data.len() as u64);
        header.set_mode(if kind == EntryType::Directory {
            0o755
        } else {
            0o644
        });
        header.as_old_mut().name[..name.len()].copy_from_slice(name);
        header.as_old_mut().linkname[..link.len()].copy_from_slice(link);
        header.set_cksum();
        builder.append(&header, data).unwrap();
    }
    gzip(&builder.into_inner().unwrap())
}

pub fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut gz = GzEncoder::new(Vec::new(), Compression::default());
    gz.write_all(bytes).unwrap();
    gz.finish().unwrap()
}
