//! The API replica: REST under `/v1`, websocket log streaming, the worker channel, and the
//! leader's sweeps. Replicas are stateless: all state is in PostgreSQL and the object store,
//! so any replica serves any request and any number can run side by side.
//!
//! # Layout
//! - [`server`] — configuration, the router and `serve`.
//! - [`auth`] — bearer tokens to callers with roles; minting secrets.
//! - [`error`] — `ApiError`, the one error type, with its status and stable code.
//! - [`jobs`] — submit, list, status, cancel, logs (page and websocket), outputs download.
//! - [`blobs`] — content-addressed source uploads and downloads.
//! - [`worker_channel`] — register, long poll, heartbeat, started, logs, outputs, complete.
//! - [`placement`] — admission at submit, dry runs, why a pending job waits.
//! - [`hub`] — one LISTEN connection per replica fanned out to waiting requests.
//! - [`handoff`] — workers' idle held polls, handed a new job by a submit on the same replica
//!   (a shortcut past the notification; what it assigns is in the database first).
//! - [`sweeper`] — the leader election loop and the rescue of lost workers.
//! - [`openapi`] — the generated OpenAPI document.
//! - [`dashboard`] — the web dashboard (askama pages, sessions, live logs).
//! - [`tls`] — the HTTPS listener and the server's TLS settings.

pub mod auth;
pub mod blobs;
pub mod calls;
pub mod dashboard;
pub mod error;
pub mod handoff;
pub mod hub;
pub mod jobs;
pub mod names;
pub mod openapi;
pub mod placement;
pub mod server;
pub mod sweeper;
pub mod tls;
pub mod tokens;
pub mod worker_channel;

pub use auth::{Caller, mint_secret};
pub use error::ApiError;
pub use server::{AppState, ServerConfig, serve};
