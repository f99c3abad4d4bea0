//! Which files of a source directory get packed: the walk that honours .gitignore, .ignore and
//! .gpulayerignore.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use ignore::WalkBuilder;

use crate::error::ArchiveError;
use crate::paths::sort_bytewise;

/// The per-directory ignore file users add to keep things out of job sources without touching
/// their .gitignore.
pub(crate) const CUSTOM_IGNORE_FILE: &str = ".gpulayerignore";

/// Lists the files of a source directory that would be packed, as paths relative to `dir`,
/// sorted bytewise.
///
/// Honours `.gitignore` (also outside a git repository), `.ignore` and `.gpulayerignore`,
/// including the ones in parent directories, the way git and ripgrep do. Hidden files are
/// listed; the `.git` directory never is. Symlinks are listed (and later stored) as symlinks,
/// never followed. Directories themselves are not listed, so empty directories are not packed,
/// as with git; sockets, FIFOs and device files are skipped because they have no content to ship.
pub fn list_source_files(dir: &Path) -> Result<Vec<PathBuf>, ArchiveError> {
    check_is_dir(dir)?;

    let mut walk = WalkBuilder::new(dir);
    walk.hidden(false)
        .follow_links(false)
        // Without this, .gitignore only counts inside a git repository; users pack plain
        // directories too and expect the same result.
        .require_git(false)
        // The user's global excludes file differs between machines; leaving it out keeps the
        // packed set a function of the tree alone.
        .git_global(false)
        .add_custom_ignore_filename(CUSTOM_IGNORE_FILE)
        .filter_entry(|entry| entry.depth() == 0 || entry.file_name() != ".git");

    let mut files = Vec::new();
    for entry in walk.build() {
        let entry = entry.map_err(|err| walk_error(dir, err))?;
        if entry.depth() == 0 {
            continue;
        }
        let Some(kind) = entry.file_type() else {
            continue;
        };
        if !(kind.is_file() || kind.is_symlink()) {
            continue;
        }
        let relative = entry
            .path()
            .strip_prefix(dir)
            .unwrap_or(entry.path())
            .to_path_buf();
        files.push(relative);
    }
    sort_bytewise(&mut files);
    Ok(files)
}

/// Fails with NotFound / NotADirectory / Unreadable unless `dir` is a directory we can stat.
fn check_is_dir(dir: &Path) -> Result<(), ArchiveError> {
    match fs::metadata(dir) {
        Ok(meta) if meta.is_dir() => Ok(()),
        Ok(_) => Err(ArchiveError::NotADirectory(dir.to_path_buf())),
        Err(err) if err.kind() == io::ErrorKind::NotFound => {
            Err(ArchiveError::NotFound(dir.to_path_buf()))
        }
        Err(source) => Err(ArchiveError::Unreadable {
            path: dir.to_path_buf(),
            source,
        }),
    }
}

/// Turns a walk error into ours: I/O failures name the path that failed, anything else comes
/// from a bad pattern in an ignore file.
fn walk_error(root: &Path, err: ignore::Error) -> ArchiveError {
    let path = error_path(&err)
        .map(|p| p.strip_prefix(root).unwrap_or(p).to_path_buf())
        .unwrap_or_else(|| root.to_path_buf());
    let message = err.to_string();
    match err.into_io_error() {
        Some(source) => ArchiveError::Unreadable { path, source },
        None => ArchiveError::IgnoreRule(message),
    }
}

fn error_path(err: &ignore::Error) -> Option<&Path> {
    match err {
        ignore::Error::WithPath { path, .. } => Some(path),
        ignore::Error::WithDepth { err, .. } | ignore::Error::WithLineNumber { err, .. } => {
            error_path(err)
        }
        ignore::Error::Partial(errs) => errs.iter().find_map(error_path),
        _ => None,
    }
}
