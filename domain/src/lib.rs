//! The GPUlayer domain: ids, job specs, worker inventories and the job/task state machine.
//!
//! Everything here is plain data with `parse` constructors, so a value that exists is valid.
//! No I/O, no async runtime: the scheduler and every other crate build on these types.
//!
//! # Layout
//! - [`ids`] — typed ids for jobs, tasks, workers and attempts.
//! - [`spec`] — what a user asks for (`JobSpec` and its parts).
//! - [`inventory`] — what a worker has (`Inventory`, `Accelerator`).
//! - [`requirements`] — device counts, memory, frameworks and labels a job asks for.
//! - [`layout`] — nodes and processes per node, locality labels, the ranks' environment.
//! - [`version`] — PEP 440 versions and specifiers for framework requirements.
//! - [`topology`] — the GPU interconnect matrix (`nvidia-smi topo -m`).
//! - [`state`] — job and task states and which transitions are legal.
//! - `fixtures` — test values (feature `fixtures`).

#[cfg(any(test, feature = "fixtures"))]
pub mod fixtures;
pub mod ids;
pub mod inventory;
pub mod layout;
pub mod requirements;
pub mod spec;
pub mod state;
pub mod topology;
pub mod version;

pub use ids::{Attempt, JobId, TaskId, WorkerId};
pub use inventory::{Accelerator, Device, FrameworkCheck, Inventory};
pub use layout::{Layout, Locality, ProcessPlace, Spread};
pub use requirements::{FrameworkSpec, LabelSelector, Library, Requirements};
pub use spec::{
    CallOutcome, CallSpec, Command, Digest, EnvVar, JobName, JobSpec, OutputGlob, SourceRef,
    SpecError,
};
pub use state::{JobState, TaskState};
pub use topology::{Link, Topology};
pub use version::{Version, VersionSpec};
