//! The worker: probes its machine, registers with a server, and runs the jobs it is handed,
//! each as its own process group in a fresh work directory, shipping logs while they run and
//! outputs when they end. It only ever dials out, so it works behind NAT.
//!
//! # Layout
//! - [`agent`] — the loop: register, long poll, heartbeat, stop orders, shutdown.
//! - [`runner`] — one task from staging to completion.
//! - [`shipper`] — batches a task's output lines to the server, in order, without loss.
//! - [`process`] — process groups: spawn, signal, exit codes.
//! - [`probe`] — what this machine has.

pub mod agent;
pub mod probe;
pub mod process;
pub mod runner;
pub mod shipper;

pub use agent::{WorkerConfig, run};

#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error(transparent)]
    Client(#[from] client::ClientError),
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
}
