//! The OpenAPI document, generated from the handlers' annotations and the protocol types.

use axum::Json;
use utoipa::OpenApi;

#[derive(OpenApi)]
#[openapi(
    info(
        title = "GPUlayer API",
        version = "1",
        description = "Jobs, logs, outputs, tokens and the worker channel. Every call needs `Authorization: Bearer <token>`; what each role may call is in docs/security.md."
    ),
    paths(
        crate::jobs::submit,
        crate::jobs::submit_batch,
        crate::jobs::list,
        crate::jobs::status,
        crate::jobs::cancel,
        crate::placement::dry_run,
        crate::calls::results,
        crate::calls::call,
        crate::jobs::logs_page,
        crate::jobs::logs_ws,
        crate::jobs::download_outputs,
        crate::tokens::create,
        crate::tokens::list,
        crate::tokens::revoke,
        crate::dashboard::create_link,
        crate::blobs::upload,
        crate::blobs::exists,
        crate::blobs::download,
        crate::worker_channel::register,
        crate::worker_channel::list,
        crate::worker_channel::deregister,
        crate::worker_channel::poll,
        crate::worker_channel::heartbeat,
        crate::worker_channel::append_logs,
        crate::worker_channel::set_rendezvous,
        crate::worker_channel::rendezvous,
        crate::worker_channel::upload_outputs,
    ),
    components(schemas(protocol::LogStreamMessage))
)]
pub struct ApiDoc;

/// `GET /v1/openapi.json`.
pub async fn document() -> Json<utoipa::openapi::OpenApi> {
    Json(ApiDoc::openapi())
}
