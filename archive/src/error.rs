//! The one error type of the archive crate: every failure of listing, packing or unpacking.

use std::io;
use std::path::PathBuf;

/// What went wrong while listing, packing or unpacking an archive.
///
/// Each message is one sentence: what happened, then what to do about it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ArchiveError {
    /// The path to pack does not exist.
    #[error("{} does not exist: check the path and try again", .0.display())]
    NotFound(PathBuf),

    /// The path to pack exists but is not a directory.
    #[error("{} is not a directory: pass the directory that holds the job's files", .0.display())]
    NotADirectory(PathBuf),

    /// A file (or directory) could not be read while listing or packing.
    #[error("cannot read {}: {source}: fix its permissions or add it to .gpulayerignore", path.display())]
    Unreadable {
        /// The offending path (relative to the packed directory where there is one).
        path: PathBuf,
        /// Why it could not be read.
        source: io::Error,
    },

    /// A .gitignore, .ignore or .gpulayerignore file holds a rule that cannot be used.
    #[error(
        "cannot use an ignore rule: {0}: fix the pattern in that .gitignore, .ignore or .gpulayerignore file"
    )]
    IgnoreRule(String),

    /// A symlink to pack points outside the tree being packed, so it could not be unpacked safely.
    #[error(
        "{} is a symlink to {}, which points outside the archive: replace it with a copy of its target or add it to .gpulayerignore",
        path.display(),
        target.display()
    )]
    SymlinkOutside {
        /// The symlink, as it would be named inside the archive.
        path: PathBuf,
        /// Where it points.
        target: PathBuf,
    },

    /// A path requested inside the archive is absolute, empty or climbs out with `..`.
    #[error("{} cannot be a path inside an archive: use a relative path without `..`", .0.display())]
    InvalidArchivePath(PathBuf),

    /// Two files would be stored under the same path inside the archive.
    #[error("{} would be stored twice in the archive: give each file its own archive path", .0.display())]
    DuplicatePath(PathBuf),

    /// Writing the packed archive to its destination failed.
    #[error("cannot write the archive: {0}: check free disk space or the connection and retry")]
    Write(#[source] io::Error),

    /// An output glob does not parse.
    #[error("output glob {pattern:?} is invalid: {source}: fix the pattern in the job's outputs")]
    InvalidGlob {
        /// The glob as the user wrote it.
        pattern: String,
        /// Why it does not parse.
        source: globset::Error,
    },

    /// The input is not a readable tar.gz (bad gzip data, bad tar headers, truncated).
    #[error("the archive is corrupt or not a tar.gz: {0}: create and upload it again")]
    Corrupt(String),

    /// An entry of the archive would land outside the destination, or is of a kind we refuse.
    #[error("refusing to unpack {}: {reason}: only unpack archives made by gpulayer", path.display())]
    UnsafeEntry {
        /// The entry's path as written in the archive.
        path: PathBuf,
        /// Why it is refused.
        reason: String,
    },

    /// Writing an unpacked entry into the destination failed.
    #[error("cannot write {}: {source}: check that the destination is writable and has free space", path.display())]
    Extract {
        /// The path in the destination that could not be written.
        path: PathBuf,
        /// Why it could not be written.
        source: io::Error,
    },
}
