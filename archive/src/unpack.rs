//! Reading archives: unpacking a tar.gz into a directory without letting any entry escape it.

use std::cell::Cell;
use std::fs;
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::rc::Rc;

use flate2::read::GzDecoder;
use tar::EntryType;

use crate::error::ArchiveError;
use crate::paths::{clean_relative, sort_bytewise, symlink_stays_inside};

/// Unpacks a tar.gz from `input` into `dest` (created if missing) and returns the relative paths
/// of the files and symlinks written, sorted bytewise.
///
/// Entries that could escape `dest` are refused with [`ArchiveError::UnsafeEntry`] before
/// anything is written for them: absolute paths, `..` components, symlinks whose target is
/// absolute or climbs above `dest`, entries that would be written through a symlink, and entry
/// kinds gpulayer never writes (hard links, devices, FIFOs). Damaged input gives
/// [`ArchiveError::Corrupt`]. Modes keep only the permission bits (no setuid); mtimes are not
/// restored, since packed archives pin them to 0.
pub fn unpack(input: impl Read, dest: &Path) -> Result<Vec<PathBuf>, ArchiveError> {
    fs::create_dir_all(dest).map_err(|source| ArchiveError::Extract {
        path: dest.to_path_buf(),
        source,
    })?;

    let state = Rc::new(ReadState::default());
    let reader = WatchedReader {
        inner: GzDecoder::new(input),
        state: Rc::clone(&state),
    };
    let mut archive = tar::Archive::new(reader);
    archive.set_preserve_permissions(false);
    archive.set_preserve_ownerships(false);
    archive.set_preserve_mtime(false);
    archive.set_unpack_xattrs(false);
    archive.set_overwrite(true);

    let mut written = Vec::new();
    let entries = archive.entries().map_err(corrupt)?;
    for entry in entries {
        let mut entry = entry.map_err(corrupt)?;
        let raw = entry.path().map_err(corrupt)?.into_owned();
        let kind = entry.header().entry_type();
        let is_dir = kind.is_dir();
        if kind == EntryType::XGlobalHeader {
            // Metadata for the whole archive, not a file; tar tools skip it too.
            continue;
        }

        let Some(relative) = clean_relative(&raw) else {
            // A bare "./" directory entry names the destination itself: nothing to do.
            if is_dir && !raw.as_os_str().is_empty() && raw.components().all(is_cur_dir) {
                continue;
            }
            return Err(unsafe_entry(
                &raw,
                "its path is absolute, empty or climbs out with `..`".to_string(),
            ));
        };

        match kind {
            EntryType::Regular | EntryType::Continuous | EntryType::Directory => {}
            EntryType::Symlink => {
                let target = entry
                    .link_name()
                    .map_err(corrupt)?
                    .ok_or_else(|| {
                        ArchiveError::Corrupt(format!("symlink {} has no target", raw.display()))
                    })?
                    .into_owned();
                if !symlink_stays_inside(&relative, &target) {
                    return Err(unsafe_entry(
                        &raw,
                        format!(
                            "it is a symlink to {}, which points outside the destination",
                            target.display()
                        ),
                    ));
                }
            }
            other => {
                return Err(unsafe_entry(
                    &raw,
                    format!(
                        "it is a {other:?} entry, and only files, directories and symlinks are allowed"
                    ),
                ));
            }
        }
        refuse_symlinked_parents(dest, &relative, &raw)?;

        match entry.unpack_in(dest) {
            Ok(true) => {}
            // unpack_in skips what it considers unsafe; our checks above should have caught it.
            Ok(false) => {
                return Err(unsafe_entry(
                    &raw,
                    "it would land outside the destination".to_string(),
                ));
            }
            Err(err) if state.failed_or_ended() => return Err(corrupt(err)),
            Err(source) => {
                return Err(ArchiveError::Extract {
                    path: dest.join(&relative),
                    source,
                });
            }
        }
        if !is_dir {
            written.push(relative);
        }
    }

    // Read to the end so the gzip trailer (CRC and length) is checked: a truncated or altered
    // archive must not pass as a shorter valid one.
    let mut rest = archive.into_inner();
    io::copy(&mut rest, &mut io::sink()).map_err(corrupt)?;
    if state.bytes.get() == 0 {
        return Err(ArchiveError::Corrupt("the input is empty".to_string()));
    }

    sort_bytewise(&mut written);
    Ok(written)
}

fn is_cur_dir(part: std::path::Component<'_>) -> bool {
    matches!(part, std::path::Component::CurDir)
}

fn corrupt(err: io::Error) -> ArchiveError {
    ArchiveError::Corrupt(err.to_string())
}

fn unsafe_entry(path: &Path, reason: String) -> ArchiveError {
    ArchiveError::UnsafeEntry {
        path: path.to_path_buf(),
        reason,
    }
}

/// Refuses an entry whose parent directories include a symlink in `dest`.
///
/// Our symlink check is lexical, so it only holds if every entry lives where its path says;
/// writing through `link/` would put it somewhere else (tar's own check only stops that when
/// the symlink leads outside `dest`, and by then a crafted target may already be in place).
fn refuse_symlinked_parents(dest: &Path, relative: &Path, raw: &Path) -> Result<(), ArchiveError> {
    let Some(parent) = relative.parent() else {
        return Ok(());
    };
    let mut current = dest.to_path_buf();
    for part in parent.components() {
        current.push(part);
        match fs::symlink_metadata(&current) {
            Ok(meta) if meta.file_type().is_symlink() => {
                let link = current.strip_prefix(dest).unwrap_or(&current);
                return Err(unsafe_entry(
                    raw,
                    format!("it would be written through the symlink {}", link.display()),
                ));
            }
            Ok(_) => {}
            // Nothing deeper exists yet, so nothing deeper can be a symlink.
            Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(source) => {
                return Err(ArchiveError::Extract {
                    path: current,
                    source,
                });
            }
        }
    }
    Ok(())
}

/// What the decompressing reader has seen; shared with the unpack loop so a failed entry can be
/// blamed on the input (corrupt) or on the destination (cannot write).
#[derive(Default)]
struct ReadState {
    bytes: Cell<u64>,
    failed: Cell<bool>,
    ended: Cell<bool>,
}

impl ReadState {
    fn failed_or_ended(&self) -> bool {
        // An entry that fails after the input ran dry was cut short: that is corruption too.
        self.failed.get() || self.ended.get()
    }
}

struct WatchedReader<R> {
    inner: R,
    state: Rc<ReadState>,
}

impl<R: Read> Read for WatchedReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self.inner.read(buf) {
            Ok(0) if !buf.is_empty() => {
                self.state.ended.set(true);
                Ok(0)
            }
            Ok(n) => {
                self.state.bytes.set(self.state.bytes.get() + n as u64);
                Ok(n)
            }
            Err(err) => {
                if err.kind() != io::ErrorKind::Interrupted {
                    self.state.failed.set(true);
                }
                Err(err)
            }
        }
    }
}
