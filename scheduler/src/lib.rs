//! Pure placement: given what workers have and what a job asks for, decide where it runs and
//! on which devices, or say for every worker why not.
//!
//! No I/O and no async: the store hands in rows, this crate hands back a [`Decision`], and the
//! tests are tables of inputs and expected decisions.
//!
//! # Layout
//! - [`fit`] — one worker against one job (`check`), with a [`Reason`] when it does not fit.
//! - [`place`] — one job against a snapshot of the cluster: [`place`], [`eligibility`] and
//!   the per-worker table.
//! - [`devices`] — which free GPUs a job gets, by interconnect.
//! - [`gang`] — a multi-node job on the cluster: all nodes or none, kept close together.

pub mod devices;
pub mod fit;
pub mod gang;
pub mod place;

pub use fit::{Reason, check};
pub use gang::{Closeness, GangDecision, place_gang};
pub use place::{
    Decision, Verdict, VerdictTable, WorkerView, any_eligible, eligibility, fit_now, place,
};
