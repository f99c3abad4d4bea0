//! Which files of a finished job are its outputs: everything under the output directory plus
//! whatever the job's globs match in its work directory.

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};

use globset::{GlobBuilder, GlobSet, GlobSetBuilder};
use walkdir::WalkDir;

use crate::error::ArchiveError;
use crate::paths::bytewise;

/// Collects a finished job's output files as `(path on disk, path inside the archive)` pairs,
/// sorted bytewise by archive path — ready for [`crate::pack_files`].
///
/// Takes every regular file under `output_dir` (archive path relative to `output_dir`; a missing
/// `output_dir` contributes nothing) and every regular file under `work_dir` whose path relative
/// to `work_dir` matches one of `globs`. In globs `*` stops at `/`: `*.txt` matches `a.txt` but
/// not `a/b.txt`, which needs `**/*.txt`. When both give the same archive path, the file from
/// `output_dir` wins because it is the job's deliberate output. Symlinks are neither followed
/// nor collected, so a job cannot smuggle files from outside its directories into its outputs.
pub fn collect_outputs(
    output_dir: &Path,
    work_dir: &Path,
    globs: &[String],
) -> Result<Vec<(PathBuf, PathBuf)>, ArchiveError> {
    let mut found: BTreeMap<Vec<u8>, (PathBuf, PathBuf)> = BTreeMap::new();

    if !globs.is_empty() {
        let set = build_globs(globs)?;
        for (disk, relative) in regular_files(work_dir)? {
            if set.is_match(&relative) {
                found.insert(key(&relative), (disk, relative));
            }
        }
    }
    // Inserted last so that it replaces a glob match with the same archive path.
    if output_dir.exists() {
        for (disk, relative) in regular_files(output_dir)? {
            found.insert(key(&relative), (disk, relative));
        }
    }

    // The BTreeMap is keyed by raw bytes, so this is already bytewise order; the sort only
    // documents (and guards) that promise.
    let mut outputs: Vec<(PathBuf, PathBuf)> = found.into_values().collect();
    outputs.sort_by(|a, b| bytewise(&a.1, &b.1));
    Ok(outputs)
}

fn key(path: &Path) -> Vec<u8> {
    path.as_os_str().as_encoded_bytes().to_vec()
}

fn build_globs(globs: &[String]) -> Result<GlobSet, ArchiveError> {
    let mut set = GlobSetBuilder::new();
    for pattern in globs {
        // Paths we match against are relative and never start with "./".
        let trimmed = pattern.trim().trim_start_matches("./");
        let glob = GlobBuilder::new(trimmed)
            .literal_separator(true)
            .build()
            .map_err(|source| ArchiveError::InvalidGlob {
                pattern: pattern.clone(),
                source,
            })?;
        set.add(glob);
    }
    set.build().map_err(|source| ArchiveError::InvalidGlob {
        pattern: globs.join(", "),
        source,
    })
}

/// Every regular file under `root`, with its path relative to `root`.
fn regular_files(root: &Path) -> Result<Vec<(PathBuf, PathBuf)>, ArchiveError> {
    let mut files = Vec::new();
    for entry in WalkDir::new(root).follow_links(false).min_depth(1) {
        let entry = entry.map_err(|err| {
            let path = err.path().unwrap_or(root).to_path_buf();
            let source = err
                .into_io_error()
                .unwrap_or_else(|| io::Error::other("filesystem loop"));
            ArchiveError::Unreadable { path, source }
        })?;
        if !entry.file_type().is_file() {
            continue;
        }
        let relative = entry
            .path()
            .strip_prefix(root)
            .unwrap_or(entry.path())
            .to_path_buf();
        files.push((entry.into_path(), relative));
    }
    Ok(files)
}
