//! The worker: probes its machine, registers with a server, and runs the jobs it is handed,
//! each as its own process group in its slot's work directory, shipping logs while they run and
//! outputs when they end. It only ever dials out, so it works behind NAT.
//!
//! # Layout
//! - [`agent`] — the loop: register, long poll, heartbeat, stop orders, shutdown.
//! - [`launch`] — starting a task's processes (ranks, devices, rendezvous) and waiting.
//! - [`runner`] — one task from staging to completion, in its slot's work directory.
//! - [`reports`] — starts and ends waiting to go out with the next poll.
//! - [`sentinel`] — the process that kills the tasks' groups if the worker dies first.
//! - [`shipper`] — batches a task's output lines to the server, in order, without loss.
//! - [`process`] — process groups: spawn, signal, exit codes.
//! - [`frameworks`] — whether torch, jax, cupy and mlx really compute on the devices.
//! - [`probe`] — what this machine has.

pub mod agent;
pub mod calls;
pub mod frameworks;
pub mod launch;
pub mod locality;
pub mod probe;
pub mod process;
pub mod reports;
pub mod runner;
pub mod sentinel;
pub mod shipper;

pub use agent::{InventorySource, WorkerConfig, run};

/// Everything this machine has: host facts, devices, and framework checks run with `python`
/// (cached in `cache_file` per interpreter and package versions unless `refresh`).
pub async fn detect(
    python: &str,
    refresh: bool,
    cache_file: Option<std::path::PathBuf>,
) -> domain::Inventory {
    let mut inventory = tokio::task::spawn_blocking(probe::host_inventory)
        .await
        .expect("the probe does not panic");
    let options = frameworks::CheckOptions {
        python: python.to_string(),
        timeout: frameworks::DEFAULT_CHECK_TIMEOUT,
        cache_file,
        refresh,
        driver_version: inventory.driver_version.clone(),
    };
    let (checks, python) = tokio::join!(
        frameworks::check_frameworks(&options),
        frameworks::python_version(python)
    );
    inventory.frameworks = checks;
    inventory.python = python;
    inventory
}

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
