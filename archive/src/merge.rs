//! One archive of a multi-node job's outputs from its nodes' archives: the per-rank
//! directories (`rank-R/`, written by the rank's `GPULAYER_OUTPUT_DIR`) side by side, and what
//! node K's output globs matched under `node-K/` (node 0's at the top, as for a one-node job).

use std::collections::BTreeSet;
use std::io::{self, Read, Write};
use std::path::{Component, Path, PathBuf};

use flate2::read::GzDecoder;
use flate2::{Compression, GzBuilder};
use tar::{EntryType, Header};

use crate::error::ArchiveError;

/// Where an entry of node `node`'s archive goes in the merged one.
pub fn merged_path(node: u32, path: &Path) -> PathBuf {
    let per_rank = matches!(
        path.components().next(),
        Some(Component::Normal(first)) if first.to_string_lossy().starts_with("rank-")
    );
    if node == 0 || per_rank {
        path.to_path_buf()
    } else {
        Path::new(&format!("node-{node}")).join(path)
    }
}

/// Writes one tar.gz holding every entry of `parts` (each node's packed outputs, with its node
/// index), renamed by [`merged_path`]. Streams: nothing is held in memory but one header.
/// A path two parts both hold (a directory, or rank directories a retry left) is kept once,
/// from the first part that has it.
pub fn merge_archives<R: Read>(parts: Vec<(u32, R)>, out: impl Write) -> Result<u64, ArchiveError> {
    let gz = GzBuilder::new()
        .mtime(0)
        .operating_system(255)
        .write(out, Compression::default());
    let mut builder = tar::Builder::new(gz);
    let mut seen: BTreeSet<PathBuf> = BTreeSet::new();
    let mut files = 0u64;
    let corrupt = |e: io::Error| ArchiveError::Corrupt(e.to_string());
    for (node, input) in parts {
        if node > 0 {
            // The node's own directory, for the entries renamed into it.
            let dir = PathBuf::from(format!("node-{node}"));
            let mut header = dir_header();
            builder
                .append_data(&mut header, &dir, io::empty())
                .map_err(ArchiveError::Write)?;
            seen.insert(dir);
        }
        let mut archive = tar::Archive::new(GzDecoder::new(input));
        for entry in archive.entries().map_err(corrupt)? {
            let mut entry = entry.map_err(corrupt)?;
            let path = merged_path(node, &entry.path().map_err(corrupt)?);
            if !seen.insert(path.clone()) {
                continue;
            }
            let mut header = entry.header().clone();
            match header.entry_type() {
                EntryType::Symlink => {
                    let target = entry
                        .link_name()
                        .map_err(corrupt)?
                        .ok_or_else(|| {
                            ArchiveError::Corrupt(format!(
                                "symlink {} has no target",
                                path.display()
                            ))
                        })?
                        .into_owned();
                    builder
                        .append_link(&mut header, &path, &target)
                        .map_err(ArchiveError::Write)?;
                }
                EntryType::Directory => {
                    builder
                        .append_data(&mut header, &path, io::empty())
                        .map_err(ArchiveError::Write)?;
                }
                _ => {
                    builder
                        .append_data(&mut header, &path, &mut entry)
                        .map_err(ArchiveError::Write)?;
                }
            }
            files += u64::from(header.entry_type() != EntryType::Directory);
        }
    }
    let gz = builder.into_inner().map_err(ArchiveError::Write)?;
    gz.finish()
        .map_err(ArchiveError::Write)?
        .flush()
        .map_err(ArchiveError::Write)?;
    Ok(files)
}

fn dir_header() -> Header {
    let mut header = Header::new_gnu();
    header.set_entry_type(EntryType::Directory);
    header.set_mode(0o755);
    header.set_size(0);
    header.set_mtime(0);
    header
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{pack_files, unpack};

    fn node_archive(dir: &Path, files: &[(&str, &str)]) -> Vec<u8> {
        let mut list = Vec::new();
        for (name, body) in files {
            let disk = dir.join(name);
            std::fs::create_dir_all(disk.parent().unwrap()).unwrap();
            std::fs::write(&disk, body).unwrap();
            list.push((disk, PathBuf::from(name)));
        }
        let mut out = Vec::new();
        pack_files(&list, &mut out).unwrap();
        out
    }

    #[test]
    fn ranks_sit_side_by_side_and_other_nodes_globs_go_under_their_node() {
        let tmp = tempfile::tempdir().unwrap();
        let a = node_archive(
            &tmp.path().join("a"),
            &[
                ("rank-0/r.txt", "0"),
                ("rank-1/r.txt", "1"),
                ("model.pt", "n0"),
            ],
        );
        let b = node_archive(
            &tmp.path().join("b"),
            &[
                ("rank-2/r.txt", "2"),
                ("rank-3/r.txt", "3"),
                ("model.pt", "n1"),
            ],
        );
        let mut merged = Vec::new();
        let files = merge_archives(vec![(0, &a[..]), (1, &b[..])], &mut merged).unwrap();
        assert_eq!(files, 6);
        let dest = tmp.path().join("out");
        let written = unpack(&merged[..], &dest).unwrap();
        let names: Vec<String> = written.iter().map(|p| p.display().to_string()).collect();
        assert_eq!(
            names,
            [
                "model.pt",
                "node-1/model.pt",
                "rank-0/r.txt",
                "rank-1/r.txt",
                "rank-2/r.txt",
                "rank-3/r.txt"
            ]
        );
        assert_eq!(
            std::fs::read_to_string(dest.join("rank-3/r.txt")).unwrap(),
            "3"
        );
        assert_eq!(
            std::fs::read_to_string(dest.join("node-1/model.pt")).unwrap(),
            "n1"
        );
    }

    #[test]
    fn a_corrupt_part_is_named_as_corrupt() {
        let mut merged = Vec::new();
        let err = merge_archives(vec![(0, &b"not gzip"[..])], &mut merged).unwrap_err();
        assert!(matches!(err, ArchiveError::Corrupt(_)), "{err}");
    }
}
