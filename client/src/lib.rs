//! The typed HTTP client for the GPUlayer API, used by the CLI, the worker and the SDK.
//!
//! Errors say which URL was tried and which setting to fix. Idempotent calls are retried on
//! connection failures and 5xx answers; submits carry an idempotency key so a retried submit
//! creates one job.
//!
//! # Layout
//! - [`error`] — `ClientError`.
//! - [`http`] — `Client`, the REST calls and the worker channel.
//! - [`logs`] — following a job's logs over the websocket, reconnecting without repeats.
//! - [`tls`] — `Fingerprint` and the verifier that pins the server's certificate.

pub mod error;
pub mod http;
pub mod logs;
pub mod tls;

pub use error::ClientError;
pub use http::Client;
pub use tls::Fingerprint;
