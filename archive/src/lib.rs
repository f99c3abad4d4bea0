//! The tar.gz format of GPUlayer job sources and job outputs: listing, packing, unpacking and
//! hashing.
//!
//! The client packs a source directory with [`pack_dir`] and the worker unpacks it with
//! [`unpack`]; for outputs, the worker gathers files with [`collect_outputs`], packs them with
//! [`pack_files`], and the client unpacks them. Packing is deterministic, so the digest of a tree
//! is stable across runs and machines, and unpacking never writes outside its destination.

mod error;
mod list;
mod merge;
mod outputs;
mod pack;
mod paths;
mod unpack;

use std::io::{self, Read};

use sha2::{Digest as _, Sha256};

pub use error::ArchiveError;
pub use list::list_source_files;
pub use merge::{merge_archives, merged_path};
pub use outputs::collect_outputs;
pub use pack::{PackSummary, pack_dir, pack_files};
pub use unpack::{Contents, Limits, unpack, verify};

/// The sha256 of everything `input` yields, as lowercase hex — to verify uploads and downloads
/// against a [`PackSummary::digest`].
pub fn sha256_hex(mut input: impl Read) -> Result<String, io::Error> {
    let mut hasher = Sha256::new();
    io::copy(&mut input, &mut hasher)?;
    Ok(hex::encode(hasher.finalize()))
}
