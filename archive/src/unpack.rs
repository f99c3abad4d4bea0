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
    let mut tally = Tally::new(Limits::default());
    let entries = archive.entries().map_err(corrupt)?;
    for entry in entries {
        let mut entry = entry.map_err(corrupt)?;
        let Some(Checked {
            raw,
            relative,
            is_dir,
            ..
        }) = check_entry(&entry, &mut tally)?
        else {
            continue;
        };
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

/// How much an archive may hold once unpacked: a source is code and small data (datasets
/// belong in object storage), and a few hundred bytes of gzip can claim terabytes.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// The most bytes its files may hold together.
    pub max_bytes: u64,
    /// The most entries (files, directories, symlinks) it may have.
    pub max_entries: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_bytes: 64 << 30,
            max_entries: 1_000_000,
        }
    }
}

/// What an archive holds, as [`verify`] found it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Contents {
    pub files: u64,
    pub bytes: u64,
}

/// Checks a tar.gz without writing anything, by the rules [`unpack`] applies (the server runs
/// it on every uploaded source, the worker applies the same rules again as it unpacks): no
/// absolute path, no `..`, no symlink leaving the tree, no entry below a symlink of the
/// archive, only files, directories and symlinks, within `limits`, and the gzip trailer
/// intact. Answers how many files and bytes it holds.
pub fn verify(input: impl Read, limits: Limits) -> Result<Contents, ArchiveError> {
    let state = Rc::new(ReadState::default());
    let reader = WatchedReader {
        inner: GzDecoder::new(input),
        state: Rc::clone(&state),
    };
    let mut archive = tar::Archive::new(reader);
    let mut tally = Tally::new(limits);
    // Symlinks seen so far: an entry below one would be written through it.
    let mut links: std::collections::HashSet<PathBuf> = std::collections::HashSet::new();
    let entries = archive.entries().map_err(corrupt)?;
    for entry in entries {
        let entry = entry.map_err(corrupt)?;
        let Some(checked) = check_entry(&entry, &mut tally)? else {
            continue;
        };
        if let Some(link) = checked
            .relative
            .ancestors()
            .skip(1)
            .find(|a| links.contains(*a))
        {
            return Err(unsafe_entry(
                &checked.raw,
                format!("it would be written through the symlink {}", link.display()),
            ));
        }
        if checked.is_symlink {
            links.insert(checked.relative);
        }
    }
    let mut rest = archive.into_inner();
    io::copy(&mut rest, &mut io::sink()).map_err(corrupt)?;
    if state.bytes.get() == 0 {
        return Err(ArchiveError::Corrupt("the input is empty".to_string()));
    }
    Ok(Contents {
        files: tally.files,
        bytes: tally.bytes,
    })
}

/// Entries and bytes counted against the limits.
struct Tally {
    limits: Limits,
    entries: u64,
    files: u64,
    bytes: u64,
}

impl Tally {
    fn new(limits: Limits) -> Self {
        Tally {
            limits,
            entries: 0,
            files: 0,
            bytes: 0,
        }
    }
}

/// An entry that passed the checks.
struct Checked {
    raw: PathBuf,
    relative: PathBuf,
    is_dir: bool,
    is_symlink: bool,
}

/// The checks every entry passes before anything is written for it; None for entries that
/// write nothing (a global header, the `./` directory).
fn check_entry<R: Read>(
    entry: &tar::Entry<'_, R>,
    tally: &mut Tally,
) -> Result<Option<Checked>, ArchiveError> {
    let raw = entry.path().map_err(corrupt)?.into_owned();
    let kind = entry.header().entry_type();
    let is_dir = kind.is_dir();
    if kind == EntryType::XGlobalHeader {
        // Metadata for the whole archive, not a file; tar tools skip it too.
        return Ok(None);
    }
    let Some(relative) = clean_relative(&raw) else {
        // A bare "./" directory entry names the destination itself: nothing to do.
        if is_dir && !raw.as_os_str().is_empty() && raw.components().all(is_cur_dir) {
            return Ok(None);
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
    tally.entries += 1;
    if tally.entries > tally.limits.max_entries {
        return Err(unsafe_entry(
            &raw,
            format!(
                "the archive holds more than {} entries",
                tally.limits.max_entries
            ),
        ));
    }
    if matches!(kind, EntryType::Regular | EntryType::Continuous) {
        tally.files += 1;
        tally.bytes = tally
            .bytes
            .saturating_add(entry.header().size().map_err(corrupt)?);
        if tally.bytes > tally.limits.max_bytes {
            return Err(unsafe_entry(
                &raw,
                format!(
                    "the archive's files would hold more than {} bytes unpacked",
                    tally.limits.max_bytes
                ),
            ));
        }
    }
    Ok(Some(Checked {
        raw,
        relative,
        is_dir,
        is_symlink: kind == EntryType::Symlink,
    }))
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
