//! Content-addressed blobs: packed sources, stored under their sha256 so the same source is
//! uploaded once however many jobs use it.

use crate::auth::{Authorized, may};
use crate::error::{ApiError, ApiResult};
use crate::server::AppState;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use domain::Digest;
use futures_util::StreamExt;
use object_store::{ObjectStoreExt, WriteMultipart};
use sha2::{Digest as _, Sha256};

pub(crate) fn blob_path(digest: &Digest) -> object_store::path::Path {
    object_store::path::Path::from(format!("blobs/{}.tar.gz", digest.as_str()))
}

fn digest(raw: &str) -> ApiResult<Digest> {
    Digest::parse(raw).map_err(|e| ApiError::BadRequest(e.to_string()))
}

/// The most bytes one upload (a packed source, a task's packed outputs) may have.
pub const MAX_UPLOAD_BYTES: u64 = 16 << 30;

/// Streams a request body into the object store at `path`, returning (sha256 hex, bytes).
/// Nothing is visible at `path` unless the whole body arrived. Each chunk also goes to `tee`
/// when given (a checker reading the upload as it arrives); when the checker stops reading
/// (it found the upload bad), the upload stops.
pub(crate) async fn store_stream(
    app: &AppState,
    path: &object_store::path::Path,
    body: Body,
    tee: Option<tokio::sync::mpsc::Sender<bytes::Bytes>>,
) -> ApiResult<(String, u64)> {
    let upload = app.objects.put_multipart(path).await?;
    let mut writer = WriteMultipart::new(upload);
    let mut hasher = Sha256::new();
    let mut bytes = 0u64;
    let mut stream = body.into_data_stream();
    while let Some(chunk) = stream.next().await {
        let chunk = match chunk {
            Ok(c) => c,
            Err(e) => {
                writer.abort().await.ok();
                return Err(ApiError::BadRequest(format!(
                    "the upload was interrupted: {e}"
                )));
            }
        };
        hasher.update(&chunk);
        bytes += chunk.len() as u64;
        if bytes > MAX_UPLOAD_BYTES {
            writer.abort().await.ok();
            return Err(ApiError::PayloadTooLarge(format!(
                "the upload is larger than {} GiB: keep datasets in object storage and read them from the job",
                MAX_UPLOAD_BYTES >> 30
            )));
        }
        if let Some(tx) = &tee
            && tx.send(chunk.clone()).await.is_err()
        {
            writer.abort().await.ok();
            return Err(ApiError::BadRequest("the upload was refused".into()));
        }
        writer.write(&chunk);
    }
    writer.finish().await?;
    Ok((hex::encode(hasher.finalize()), bytes))
}

/// Upload a packed source under its sha256; the server checks the digest.
#[utoipa::path(put, path = "/v1/blobs/{digest}", params(("digest" = String, Path, description = "the blob's sha256, 64 lowercase hex digits")), request_body(content = Vec<u8>, content_type = "application/gzip"),
    responses((status = 201), (status = 400, body = protocol::ErrorBody)))]
pub async fn upload(
    State(app): State<AppState>,
    _: Authorized<may::SubmitJobs>,
    Path(raw): Path<String>,
    body: Body,
) -> ApiResult<StatusCode> {
    let digest = digest(&raw)?;
    if app.store.blob_size(digest.as_str()).await?.is_some() {
        return Ok(StatusCode::OK);
    }
    // Stage under a unique name and move into place only once the digest checks out, so a
    // corrupt or hostile upload never sits at the content address.
    let staging = object_store::path::Path::from(format!(
        "staging/{}-{}",
        digest.as_str(),
        crate::auth::mint_secret("")
    ));
    // A source (a tar.gz: it starts with gzip's magic bytes) is checked as it arrives, by the
    // rules the worker applies again when it unpacks; other blobs (pickled functions) are
    // stored as they are and can never be a job's source.
    let mut body = body.into_data_stream();
    let first = match body.next().await {
        Some(Ok(chunk)) => chunk,
        Some(Err(e)) => {
            return Err(ApiError::BadRequest(format!(
                "the upload was interrupted: {e}"
            )));
        }
        None => bytes::Bytes::new(),
    };
    let is_archive = first.starts_with(&[0x1f, 0x8b]);
    let rest = Body::from_stream(
        futures_util::stream::once(async move { Ok::<_, axum::Error>(first) }).chain(body),
    );
    let (tee, checked) = if is_archive {
        let (tx, rx) = tokio::sync::mpsc::channel::<bytes::Bytes>(8);
        let check = tokio::task::spawn_blocking(move || {
            let mut upload = ChannelReader::new(rx);
            let verdict = archive::verify(&mut upload, archive::Limits::default());
            if verdict.is_ok() {
                // Bytes after the archive's end (trailing padding) are stored, not refused.
                std::io::copy(&mut upload, &mut std::io::sink()).ok();
            }
            verdict
        });
        (Some(tx), Some(check))
    } else {
        (None, None)
    };
    let stored = store_stream(&app, &staging, rest, tee).await;
    if let Some(check) = checked {
        // The checker's verdict comes first: it explains a stopped upload.
        let verdict = check
            .await
            .map_err(|e| ApiError::Internal(format!("the source check panicked: {e}")))?;
        if let Err(e) = verdict {
            app.objects.delete(&staging).await.ok();
            return Err(ApiError::BadRequest(format!("the source was refused: {e}")));
        }
    }
    let (actual, bytes) = stored?;
    if actual != digest.as_str() {
        app.objects.delete(&staging).await.ok();
        return Err(ApiError::BadRequest(format!(
            "upload does not match its digest: the URL says {} but the bytes hash to {actual}",
            digest.as_str()
        )));
    }
    app.objects.rename(&staging, &blob_path(&digest)).await?;
    app.store
        .record_blob(digest.as_str(), bytes as i64, is_archive)
        .await?;
    Ok(StatusCode::CREATED)
}

/// The chunks of an upload as a blocking `Read`, for the archive check on its own thread.
struct ChannelReader {
    rx: tokio::sync::mpsc::Receiver<bytes::Bytes>,
    chunk: bytes::Bytes,
}

impl ChannelReader {
    fn new(rx: tokio::sync::mpsc::Receiver<bytes::Bytes>) -> Self {
        ChannelReader {
            rx,
            chunk: bytes::Bytes::new(),
        }
    }
}

impl std::io::Read for ChannelReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while self.chunk.is_empty() {
            match self.rx.blocking_recv() {
                Some(next) => self.chunk = next,
                None => return Ok(0),
            }
        }
        let n = buf.len().min(self.chunk.len());
        buf[..n].copy_from_slice(&self.chunk[..n]);
        bytes::Buf::advance(&mut self.chunk, n);
        Ok(n)
    }
}

/// Whether a blob is stored (200) or not (404).
#[utoipa::path(head, path = "/v1/blobs/{digest}", params(("digest" = String, Path, description = "the blob's sha256, 64 lowercase hex digits")), responses((status = 200), (status = 404)))]
pub async fn exists(
    State(app): State<AppState>,
    _: Authorized<may::FetchSources>,
    Path(raw): Path<String>,
) -> ApiResult<Response> {
    match app.store.blob_size(digest(&raw)?.as_str()).await? {
        Some(size) => {
            Ok(([(header::CONTENT_LENGTH, size.to_string())], StatusCode::OK).into_response())
        }
        None => Ok(StatusCode::NOT_FOUND.into_response()),
    }
}

/// Download a blob (workers fetch sources this way).
#[utoipa::path(get, path = "/v1/blobs/{digest}", params(("digest" = String, Path, description = "the blob's sha256, 64 lowercase hex digits")), responses((status = 200, content_type = "application/gzip"), (status = 404, body = protocol::ErrorBody)))]
pub async fn download(
    State(app): State<AppState>,
    _: Authorized<may::FetchSources>,
    Path(raw): Path<String>,
) -> ApiResult<Response> {
    let digest = digest(&raw)?;
    if app.store.blob_size(digest.as_str()).await?.is_none() {
        return Err(ApiError::NotFound(format!(
            "source {} was never uploaded",
            digest.short()
        )));
    }
    let got = app.objects.get(&blob_path(&digest)).await?;
    let size = got.meta.size;
    Ok((
        [
            (header::CONTENT_TYPE, "application/gzip".to_string()),
            (header::CONTENT_LENGTH, size.to_string()),
        ],
        Body::from_stream(got.into_stream()),
    )
        .into_response())
}
