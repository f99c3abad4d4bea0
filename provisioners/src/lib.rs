//! Where workers come from. A provisioner turns "we need a worker like this" into a running
//! `gpulayer join` somewhere, and takes it away again. Every kind ends the same way: an
//! ordinary worker that dials out to the control plane, so the queue never needs to know which
//! provisioner made it.
//!
//! # Layout
//! - [`local`] — worker processes on this machine (one-machine set-ups, load tests).
//!
//! Cloud VMs per job (GCP Spot) and Kubernetes pools come as Cargo features of this crate.

pub mod local;

use std::collections::BTreeMap;
use std::future::Future;

/// What kind of worker is wanted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerRequest {
    pub name: String,
    pub slots: u32,
    pub labels: BTreeMap<String, String>,
}

/// How to reach the control plane a new worker joins.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JoinTarget {
    pub url: String,
    pub join_token: String,
    /// The server certificate's `sha256:` fingerprint, which the new worker pins.
    pub fingerprint: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum ProvisionError {
    #[error("cannot start worker '{name}' with {program}: {source}")]
    Spawn {
        name: String,
        program: String,
        #[source]
        source: std::io::Error,
    },
    #[error("worker '{0}' is not one this provisioner started")]
    Unknown(String),
    #[error("stopping worker '{name}' failed: {source}")]
    Stop {
        name: String,
        #[source]
        source: std::io::Error,
    },
}

/// Starts and stops workers of one kind.
pub trait Provisioner {
    /// A short name for logs and `status` ("local", "gcp", "kubernetes").
    fn kind(&self) -> &'static str;

    /// Starts a worker that joins `target`; returns once it was started (it registers on its
    /// own shortly after).
    fn provision(
        &mut self,
        target: &JoinTarget,
        request: &WorkerRequest,
    ) -> impl Future<Output = Result<(), ProvisionError>> + Send;

    /// Stops the named worker; it deregisters, and its unfinished tasks are failed.
    fn release(&mut self, name: &str) -> impl Future<Output = Result<(), ProvisionError>> + Send;

    /// Names of the workers this provisioner is running.
    fn running(&self) -> Vec<String>;
}
