//! Test fixtures: one private PostgreSQL cluster per test run (a fresh database per test),
//! and real `gpulayer` server, worker and CLI processes.
//!
//! The cluster lives in `$GPULAYER_TEST_PGDATA` (scripts/test makes a fresh one per run and
//! stops it at the end) or, when unset, in a per-user directory under the system temp dir
//! that later runs reuse. Test processes (nextest runs one per test) share it; a file lock
//! makes sure only one of them starts it.
//!
//! # Layout
//! - [`postgres`] — the shared cluster and [`TestDatabase`].
//! - [`processes`] — [`Server`], [`Worker`] and [`Cli`] around the real binary.

pub mod postgres;
pub mod processes;

pub use postgres::{TestDatabase, fresh_database};
pub use processes::{Cli, CliOutput, Server, ServerOptions, Worker, wait_for};
