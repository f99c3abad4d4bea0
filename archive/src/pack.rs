//! Writing archives: the deterministic tar.gz layout shared by job sources (`pack_dir`) and job
//! outputs (`pack_files`).

use std::fs::{self, File, Metadata};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

use flate2::{Compression, GzBuilder};
use sha2::{Digest as _, Sha256};
use tar::{EntryType, Header};

use crate::error::ArchiveError;
use crate::list::list_source_files;
use crate::paths::{bytewise, clean_relative, symlink_stays_inside};

/// What a pack produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PackSummary {
    /// sha256 of the .tar.gz bytes, lowercase hex.
    pub digest: String,
    /// Size of the .tar.gz in bytes.
    pub bytes: u64,
    /// Number of files (regular files and symlinks; directories not counted).
    pub files: u64,
    /// Sum of the packed files' sizes before compression.
    pub raw_bytes: u64,
}

/// Packs `dir` (the files [`list_source_files`] returns) into a deterministic tar.gz written to
/// `out`, calling `progress(raw_bytes_done, raw_bytes_total)` as it goes.
///
/// Packing the same tree twice gives byte-identical output, whatever the files' mtimes, owners
/// or non-exec permission bits: entries are sorted bytewise, mtime/uid/gid are 0, user and group
/// names empty, modes are 0o755 (directories, files with any exec bit) or 0o644, and the gzip
/// header has no name or mtime. Paths inside the archive are relative to `dir`.
///
/// Files are streamed rather than held in memory, so large data files are fine; a file that
/// cannot be opened or read gives [`ArchiveError::Unreadable`] naming it (relative to `dir`).
pub fn pack_dir(
    dir: &Path,
    out: impl Write,
    mut progress: impl FnMut(u64, u64),
) -> Result<PackSummary, ArchiveError> {
    // list_source_files reports a missing or non-directory `dir`.
    let items = list_source_files(dir)?
        .into_iter()
        .map(|relative| Item {
            disk: dir.join(&relative),
            shown: relative.clone(),
            name: relative,
        })
        .collect();
    write_archive(items, out, &mut progress)
}

/// Packs an explicit list of `(path on disk, path inside the archive)` files — job outputs — in
/// the same deterministic format as [`pack_dir`].
///
/// Directories in the list are skipped (list the files inside them instead); symlinks are stored
/// as symlinks. A missing file gives [`ArchiveError::NotFound`], an archive path that is absolute
/// or uses `..` gives [`ArchiveError::InvalidArchivePath`], and two files with the same archive
/// path give [`ArchiveError::DuplicatePath`].
pub fn pack_files(
    files: &[(PathBuf, PathBuf)],
    out: impl Write,
) -> Result<PackSummary, ArchiveError> {
    let mut items = Vec::with_capacity(files.len());
    for (disk, inside) in files {
        let name = clean_relative(inside)
            .ok_or_else(|| ArchiveError::InvalidArchivePath(inside.clone()))?;
        match fs::symlink_metadata(disk) {
            Ok(meta) if meta.is_dir() => continue,
            Ok(_) => {}
            Err(err) if err.kind() == io::ErrorKind::NotFound => {
                return Err(ArchiveError::NotFound(disk.clone()));
            }
            Err(source) => {
                return Err(ArchiveError::Unreadable {
                    path: disk.clone(),
                    source,
                });
            }
        }
        items.push(Item {
            disk: disk.clone(),
            shown: disk.clone(),
            name,
        });
    }
    write_archive(items, out, &mut |_, _| {})
}

/// One file to pack.
struct Item {
    /// Where to read it.
    disk: PathBuf,
    /// Its clean relative path inside the archive.
    name: PathBuf,
    /// How to name it in error messages.
    shown: PathBuf,
}

/// What goes into the tar for one path.
enum Entry {
    Dir,
    File { disk: PathBuf, shown: PathBuf },
    Symlink { target: PathBuf },
}

/// Mode bits stored in the archive. Only "executable or not" survives, because other bits (group
/// write, umask leftovers) differ between machines and would change the digest for no benefit.
const DIR_MODE: u32 = 0o755;
const EXEC_MODE: u32 = 0o755;
const FILE_MODE: u32 = 0o644;
/// What GNU tar writes for symlinks; the bits are ignored on unpack anyway.
const SYMLINK_MODE: u32 = 0o777;

/// Progress is reported after every file and at least every this many bytes within a big one.
const PROGRESS_STEP: u64 = 1 << 20;

fn write_archive(
    items: Vec<Item>,
    out: impl Write,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<PackSummary, ArchiveError> {
    let mut entries: Vec<(PathBuf, Entry)> = Vec::with_capacity(items.len());
    let mut dirs: Vec<PathBuf> = Vec::new();
    let mut raw_total = 0u64;
    let mut files = 0u64;

    for item in items {
        let meta = fs::symlink_metadata(&item.disk).map_err(|source| ArchiveError::Unreadable {
            path: item.shown.clone(),
            source,
        })?;
        let entry = if meta.file_type().is_symlink() {
            let target = fs::read_link(&item.disk).map_err(|source| ArchiveError::Unreadable {
                path: item.shown.clone(),
                source,
            })?;
            // Refuse here rather than let the unpacking side refuse later, far from the user.
            if !symlink_stays_inside(&item.name, &target) {
                return Err(ArchiveError::SymlinkOutside {
                    path: item.shown,
                    target,
                });
            }
            Entry::Symlink { target }
        } else if meta.is_file() {
            raw_total += meta.len();
            Entry::File {
                disk: item.disk,
                shown: item.shown,
            }
        } else {
            // Directories and special files carry no content of their own.
            continue;
        };
        files += 1;
        let mut parent = item.name.parent();
        while let Some(dir) = parent.filter(|p| !p.as_os_str().is_empty()) {
            dirs.push(dir.to_path_buf());
            parent = dir.parent();
        }
        entries.push((item.name, entry));
    }

    dirs.sort_by(|a, b| bytewise(a, b));
    dirs.dedup();
    entries.extend(dirs.into_iter().map(|dir| (dir, Entry::Dir)));
    // Parents sort before their children because a path sorts before anything it prefixes.
    entries.sort_by(|a, b| bytewise(&a.0, &b.0));
    if let Some(pair) = entries.windows(2).find(|pair| pair[0].0 == pair[1].0) {
        return Err(ArchiveError::DuplicatePath(pair[0].0.clone()));
    }

    // No file name and mtime 0 in the gzip header; "unknown" OS so the bytes match across hosts.
    let gz = GzBuilder::new()
        .mtime(0)
        .operating_system(255)
        .write(HashingWriter::new(out), Compression::default());
    let mut builder = tar::Builder::new(gz);
    let mut progress = Progress {
        done: 0,
        total: raw_total,
        reported: 0,
        report: progress,
    };
    progress.report();

    for (name, entry) in entries {
        match entry {
            Entry::Dir => {
                let mut header = header(EntryType::Directory, DIR_MODE, 0);
                builder
                    .append_data(&mut header, &name, io::empty())
                    .map_err(ArchiveError::Write)?;
            }
            Entry::Symlink { target } => {
                let mut header = header(EntryType::Symlink, SYMLINK_MODE, 0);
                builder
                    .append_link(&mut header, &name, &target)
                    .map_err(ArchiveError::Write)?;
            }
            Entry::File { disk, shown } => {
                append_file(&mut builder, &name, &disk, &shown, &mut progress)?;
                progress.report();
            }
        }
    }

    let gz = builder.into_inner().map_err(ArchiveError::Write)?;
    let hashing = gz.finish().map_err(ArchiveError::Write)?;
    let (mut out, digest, bytes) = hashing.finish();
    out.flush().map_err(ArchiveError::Write)?;
    Ok(PackSummary {
        digest,
        bytes,
        files,
        raw_bytes: progress.done,
    })
}

fn append_file<W: Write>(
    builder: &mut tar::Builder<W>,
    name: &Path,
    disk: &Path,
    shown: &Path,
    progress: &mut Progress<'_>,
) -> Result<(), ArchiveError> {
    let unreadable = |source| ArchiveError::Unreadable {
        path: shown.to_path_buf(),
        source,
    };
    // Open and stat the same handle before writing the header, so the common failures (no
    // permission, vanished) surface as a clean error instead of half an entry.
    let file = File::open(disk).map_err(unreadable)?;
    let meta = file.metadata().map_err(unreadable)?;
    let size = meta.len();
    let mode = if is_executable(&meta) {
        EXEC_MODE
    } else {
        FILE_MODE
    };
    let mut header = header(EntryType::Regular, mode, size);
    let mut reader = FileReader {
        file: file.take(size),
        expected: size,
        read: 0,
        error: None,
        progress,
    };
    match builder.append_data(&mut header, name, &mut reader) {
        Ok(()) => Ok(()),
        Err(err) => match reader.error.take() {
            Some(source) => Err(unreadable(source)),
            None => Err(ArchiveError::Write(err)),
        },
    }
}

/// A header with every field that could vary between machines pinned down.
fn header(kind: EntryType, mode: u32, size: u64) -> Header {
    let mut header = Header::new_gnu();
    header.set_entry_type(kind);
    header.set_mode(mode);
    header.set_size(size);
    header.set_mtime(0);
    header.set_uid(0);
    header.set_gid(0);
    // User and group names stay empty: `new_gnu` leaves them zeroed.
    header
}

#[cfg(unix)]
fn is_executable(meta: &Metadata) -> bool {
    use std::os::unix::fs::PermissionsExt as _;
    meta.permissions().mode() & 0o111 != 0
}

#[cfg(not(unix))]
fn is_executable(_meta: &Metadata) -> bool {
    false
}

/// Running byte count for the progress callback.
struct Progress<'a> {
    done: u64,
    total: u64,
    reported: u64,
    report: &'a mut dyn FnMut(u64, u64),
}

impl Progress<'_> {
    fn advance(&mut self, bytes: u64) {
        self.done += bytes;
        // A file that grew since it was listed must not push "done" past "total".
        self.total = self.total.max(self.done);
        if self.done - self.reported >= PROGRESS_STEP {
            self.report();
        }
    }

    fn report(&mut self) {
        self.reported = self.done;
        (self.report)(self.done, self.total);
    }
}

/// Reads one file into the tar, keeping the read error (if any) so it can be told apart from a
/// failure to write the archive.
struct FileReader<'a, 'b> {
    file: io::Take<File>,
    expected: u64,
    read: u64,
    error: Option<io::Error>,
    progress: &'a mut Progress<'b>,
}

impl Read for FileReader<'_, '_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self.file.read(buf) {
            Ok(0) if self.read < self.expected && !buf.is_empty() => {
                // The tar header already promised `expected` bytes; fewer would corrupt the
                // archive. (A file that grows is cut at its size when opened.)
                self.error = Some(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the file shrank while it was being packed",
                ));
                Err(io::Error::other("source file shrank"))
            }
            Ok(n) => {
                self.read += n as u64;
                self.progress.advance(n as u64);
                Ok(n)
            }
            Err(err) if err.kind() == io::ErrorKind::Interrupted => Err(err),
            Err(err) => {
                let kind = err.kind();
                self.error = Some(err);
                Err(io::Error::new(kind, "source file read failed"))
            }
        }
    }
}

/// Passes bytes through to the real destination while hashing and counting them, so the digest
/// needs no second pass over the archive.
struct HashingWriter<W> {
    inner: W,
    hasher: Sha256,
    bytes: u64,
}

impl<W: Write> HashingWriter<W> {
    fn new(inner: W) -> Self {
        Self {
            inner,
            hasher: Sha256::new(),
            bytes: 0,
        }
    }

    fn finish(self) -> (W, String, u64) {
        (self.inner, hex::encode(self.hasher.finalize()), self.bytes)
    }
}

impl<W: Write> Write for HashingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        // `min` guards against a writer that over-reports; the contract says it never does.
        let n = self.inner.write(buf)?.min(buf.len());
        self.hasher.update(&buf[..n]);
        self.bytes += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}
