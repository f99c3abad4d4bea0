//! `Client`: one method per REST call.

use crate::error::ClientError;
use crate::tls::{Fingerprint, PinnedCertificate};
use bytes::Bytes;
use futures_util::{Stream, StreamExt, TryStreamExt};
use protocol::{
    CancelResponse, ErrorBody, HeartbeatRequest, JobList, JobView, LogBatch, LogPage, PollRequest,
    PollResponse, RegisterRequest, RegisterResponse, SubmitRequest, WorkerList,
};
use reqwest::{Method, RequestBuilder, Response, StatusCode};
use serde::de::DeserializeOwned;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// Tries for an idempotent call before giving up on a server that does not answer.
const RETRIES: u32 = 4;
/// First pause between tries; doubles each time (0.2, 0.4, 0.8, 1.6 s).
const FIRST_BACKOFF: Duration = Duration::from_millis(200);
/// A request that is not a long poll or a transfer should answer well within this.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// A connection to a GPUlayer control plane: one server URL, or several replicas
/// (`url1,url2`) tried in turn when one does not answer. Cheap to clone; clones share which
/// replica is current.
#[derive(Debug, Clone)]
pub struct Client {
    bases: Arc<Vec<String>>,
    current: Arc<AtomicUsize>,
    token: Option<String>,
    http: reqwest::Client,
    /// Set when the server's certificate is pinned by its fingerprint.
    pin: Option<Arc<PinnedCertificate>>,
}

impl Client {
    /// `url` is one server URL or several, comma-separated (replicas of one control plane);
    /// an https server must have a certificate this system trusts.
    pub fn new(url: &str, token: Option<&str>) -> Result<Self, ClientError> {
        Self::pinned(url, token, None)
    }

    /// As [`Client::new`]; with `pin`, the server must present the certificate with that
    /// fingerprint (every replica presents the same one) and the URLs must be https.
    pub fn pinned(
        url: &str,
        token: Option<&str>,
        pin: Option<Fingerprint>,
    ) -> Result<Self, ClientError> {
        let mut bases = Vec::new();
        for one in url.split(',').map(str::trim).filter(|u| !u.is_empty()) {
            let trimmed = one.trim_end_matches('/');
            let parsed = reqwest::Url::parse(trimmed).map_err(|e| ClientError::BadUrl {
                url: one.to_string(),
                detail: e.to_string(),
            })?;
            if !matches!(parsed.scheme(), "http" | "https") {
                return Err(ClientError::BadUrl {
                    url: one.to_string(),
                    detail: "the scheme must be http or https".into(),
                });
            }
            bases.push(trimmed.to_string());
        }
        if bases.is_empty() {
            return Err(ClientError::BadUrl {
                url: url.to_string(),
                detail: "no URL given".into(),
            });
        }
        if pin.is_some()
            && let Some(plain) = bases.iter().find(|b| b.starts_with("http://"))
        {
            return Err(ClientError::PinWithoutTls { url: plain.clone() });
        }
        let pin = pin.map(|p| Arc::new(PinnedCertificate::new(p)));
        let mut builder = reqwest::Client::builder().connect_timeout(Duration::from_secs(10));
        if let Some(p) = &pin {
            builder = builder.tls_backend_preconfigured(crate::tls::pinned_config(p.clone())?);
        }
        let http = builder.build().map_err(|e| ClientError::BadUrl {
            url: url.to_string(),
            detail: e.to_string(),
        })?;
        Ok(Self {
            bases: Arc::new(bases),
            current: Arc::new(AtomicUsize::new(0)),
            token: token.map(str::to_string),
            http,
            pin,
        })
    }

    /// The replica in use now.
    pub fn url(&self) -> &str {
        &self.bases[self.current.load(Ordering::Relaxed) % self.bases.len()]
    }

    /// Moves on to the next replica after `failed` did not answer (unless another request
    /// already did).
    pub(crate) fn fail_over(&self, failed: &str) {
        if self.bases.len() > 1 && self.url() == failed {
            let next = self.current.load(Ordering::Relaxed) + 1;
            self.current
                .store(next % self.bases.len(), Ordering::Relaxed);
            tracing::warn!(
                from = failed,
                to = self.url(),
                "server did not answer; failing over"
            );
        }
    }

    pub(crate) fn token(&self) -> Option<&str> {
        self.token.as_deref()
    }

    fn request(&self, method: Method, path: &str) -> RequestBuilder {
        let mut rb = self.http.request(method, format!("{}{path}", self.url()));
        if let Some(t) = &self.token {
            rb = rb.bearer_auth(t);
        }
        rb
    }

    /// The pinning verifier, for the websocket follower's own TLS connections.
    pub(crate) fn pin(&self) -> Option<&Arc<PinnedCertificate>> {
        self.pin.as_ref()
    }

    fn unreachable(&self, e: &reqwest::Error) -> ClientError {
        let mut detail = e.to_string();
        let mut source = std::error::Error::source(e);
        while let Some(s) = source {
            detail = s.to_string();
            source = s.source();
        }
        self.connection_failed(detail)
    }

    /// A connection that failed: a pinned certificate refused (never worth a retry), or a
    /// server that did not answer.
    pub(crate) fn connection_failed(&self, detail: String) -> ClientError {
        if let Some(pin) = &self.pin
            && let Some(presented) = pin.take_refused()
        {
            return ClientError::FingerprintMismatch {
                url: self.url().to_string(),
                presented: presented.to_string(),
                pinned: pin.pinned().to_string(),
            };
        }
        if self.pin.is_none() && detail.contains("invalid peer certificate") {
            return ClientError::UntrustedCertificate {
                url: self.url().to_string(),
                detail,
            };
        }
        ClientError::Unreachable {
            url: self.url().to_string(),
            detail,
        }
    }

    /// Sends, retrying transient failures when `idempotent`; maps error statuses to errors.
    async fn send(
        &self,
        idempotent: bool,
        build: impl Fn() -> RequestBuilder,
    ) -> Result<Response, ClientError> {
        let mut backoff = FIRST_BACKOFF;
        let mut tries = 0;
        // Each replica gets a try of its own before the backoff starts counting.
        let budget = RETRIES + self.bases.len() as u32 - 1;
        loop {
            tries += 1;
            let tried = self.url().to_string();
            let result = match build().send().await {
                Ok(resp) => self.check(resp).await,
                Err(e) => Err(self.unreachable(&e)),
            };
            if matches!(result, Err(ClientError::Unreachable { .. })) {
                self.fail_over(&tried);
            }
            match result {
                // Calls that are not idempotent are not retried here; their callers (the
                // worker loop) retry them, against the replica failed over to.
                Err(e) if idempotent && e.is_transient() && tries <= budget => {
                    tracing::debug!(error = %e, "retrying");
                    tokio::time::sleep(backoff).await;
                    backoff *= 2;
                }
                other => return other,
            }
        }
    }

    async fn check(&self, resp: Response) -> Result<Response, ClientError> {
        let status = resp.status();
        if status.is_success() {
            return Ok(resp);
        }
        let text = resp.text().await.unwrap_or_default();
        let (code, message) = match serde_json::from_str::<ErrorBody>(&text) {
            Ok(ErrorBody {
                placement: Some(report),
                ..
            }) => return Err(ClientError::Unplaceable(report)),
            Ok(body) => (body.code, body.message),
            Err(_) => (
                protocol::ErrorCode::Internal,
                format!(
                    "HTTP {status} from {}: {}",
                    self.url(),
                    text.chars().take(200).collect::<String>()
                ),
            ),
        };
        if status == StatusCode::UNAUTHORIZED {
            return Err(ClientError::Unauthorized {
                url: self.url().to_string(),
                message,
            });
        }
        Err(ClientError::Api {
            status: status.as_u16(),
            code,
            message,
        })
    }

    async fn json<T: DeserializeOwned>(&self, resp: Response) -> Result<T, ClientError> {
        let url = resp.url().to_string();
        resp.json().await.map_err(|e| ClientError::Protocol {
            url,
            detail: e.to_string(),
        })
    }

    async fn get_json<T: DeserializeOwned>(&self, path: &str) -> Result<T, ClientError> {
        let resp = self.send(true, || self.request(Method::GET, path)).await?;
        self.json(resp).await
    }

    async fn post_json<B: serde::Serialize, T: DeserializeOwned>(
        &self,
        path: &str,
        body: &B,
        idempotent: bool,
    ) -> Result<T, ClientError> {
        let resp = self
            .send(idempotent, || self.request(Method::POST, path).json(body))
            .await?;
        self.json(resp).await
    }

    async fn post_no_content<B: serde::Serialize>(
        &self,
        path: &str,
        body: &B,
    ) -> Result<(), ClientError> {
        self.send(true, || self.request(Method::POST, path).json(body))
            .await?;
        Ok(())
    }

    // ---- clients ----

    /// Readiness of the server (its database answers).
    pub async fn ready(&self) -> Result<(), ClientError> {
        self.send(false, || self.http.get(format!("{}/readyz", self.url())))
            .await?;
        Ok(())
    }

    /// Submits a job; `idempotency_key` makes retries safe.
    pub async fn submit(
        &self,
        req: &SubmitRequest,
        idempotency_key: &str,
    ) -> Result<JobView, ClientError> {
        let resp = self
            .send(true, || {
                self.request(Method::POST, "/v1/jobs")
                    .header(protocol::IDEMPOTENCY_HEADER, idempotency_key)
                    .json(req)
            })
            .await?;
        self.json(resp).await
    }

    /// Submits many jobs in one request (all or none); `idempotency_key` makes retries safe.
    pub async fn submit_batch(
        &self,
        req: &protocol::BatchSubmitRequest,
        idempotency_key: &str,
    ) -> Result<protocol::BatchSubmitResponse, ClientError> {
        let resp = self
            .send(true, || {
                self.request(Method::POST, "/v1/jobs/batch")
                    .header(protocol::IDEMPOTENCY_HEADER, idempotency_key)
                    .json(req)
            })
            .await?;
        self.json(resp).await
    }

    /// Submits one remote call and waits up to `req.wait_ms` for its result;
    /// `idempotency_key` makes retries safe.
    pub async fn call(
        &self,
        req: &protocol::calls::CallRequest,
        idempotency_key: &str,
    ) -> Result<protocol::calls::CallAnswer, ClientError> {
        let resp = self
            .send(true, || {
                self.request(Method::POST, "/v1/calls")
                    .header(protocol::IDEMPOTENCY_HEADER, idempotency_key)
                    .json(req)
            })
            .await?;
        self.json(resp).await
    }

    /// The finished calls among `req.jobs`, waiting up to `req.wait_ms` for one to finish.
    pub async fn call_results(
        &self,
        req: &protocol::calls::CallResultsRequest,
    ) -> Result<protocol::calls::CallResults, ClientError> {
        self.post_json("/v1/calls/results", req, true).await
    }

    pub async fn list_jobs(&self, state: Option<&str>, limit: u32) -> Result<JobList, ClientError> {
        let mut path = format!("/v1/jobs?limit={limit}");
        if let Some(s) = state {
            path.push_str(&format!("&state={s}"));
        }
        self.get_json(&path).await
    }

    /// A dry run: which workers could run this job. Nothing is stored.
    pub async fn placement(
        &self,
        req: &SubmitRequest,
    ) -> Result<protocol::PlacementReport, ClientError> {
        self.post_json("/v1/placement", req, true).await
    }

    pub async fn job(&self, id: i64) -> Result<JobView, ClientError> {
        self.get_json(&format!("/v1/jobs/{id}")).await
    }

    pub async fn cancel(&self, id: i64) -> Result<CancelResponse, ClientError> {
        self.post_json(
            &format!("/v1/jobs/{id}/cancel"),
            &serde_json::json!({}),
            true,
        )
        .await
    }

    /// One page of log lines after `after` (`TASK:ATTEMPT:SEQ`), of process `rank` only if
    /// given.
    pub async fn logs_page(
        &self,
        id: i64,
        after: Option<&str>,
        rank: Option<u32>,
    ) -> Result<LogPage, ClientError> {
        let mut query: Vec<String> = Vec::new();
        if let Some(a) = after {
            query.push(format!("after={a}"));
        }
        if let Some(r) = rank {
            query.push(format!("rank={r}"));
        }
        let mut path = format!("/v1/jobs/{id}/logs");
        if !query.is_empty() {
            path.push('?');
            path.push_str(&query.join("&"));
        }
        self.get_json(&path).await
    }

    /// Creates a token (admin tokens only); the answer holds its secret, shown this once.
    pub async fn create_token(
        &self,
        req: &protocol::CreateTokenRequest,
    ) -> Result<protocol::CreatedToken, ClientError> {
        // Not retried: a lost answer would leave a token nobody has the secret of.
        self.post_json("/v1/tokens", req, false).await
    }

    pub async fn tokens(&self, all: bool) -> Result<protocol::TokenList, ClientError> {
        self.get_json(&format!("/v1/tokens?all={all}")).await
    }

    pub async fn revoke_token(&self, id: i64) -> Result<protocol::TokenView, ClientError> {
        self.post_json(
            &format!("/v1/tokens/{id}/revoke"),
            &serde_json::json!({}),
            true,
        )
        .await
    }

    /// A one-time link that opens the dashboard logged in as this client's token.
    pub async fn dashboard_link(&self) -> Result<protocol::DashboardLink, ClientError> {
        self.post_json("/v1/dashboard/links", &serde_json::json!({}), false)
            .await
    }

    pub async fn workers(&self) -> Result<WorkerList, ClientError> {
        self.get_json("/v1/workers").await
    }

    pub async fn blob_exists(&self, digest: &str) -> Result<bool, ClientError> {
        let path = format!("/v1/blobs/{digest}");
        match self.send(true, || self.request(Method::HEAD, &path)).await {
            Ok(_) => Ok(true),
            Err(ClientError::Api { status: 404, .. }) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Uploads a file as the blob `digest`, calling `progress(bytes_sent)` as it streams.
    pub async fn upload_blob(
        &self,
        digest: &str,
        file: &Path,
        progress: impl Fn(u64) + Send + Sync + Clone + 'static,
    ) -> Result<(), ClientError> {
        let path = format!("/v1/blobs/{digest}");
        self.put_file(&path, file, progress).await
    }

    async fn put_file(
        &self,
        path: &str,
        file: &Path,
        progress: impl Fn(u64) + Send + Sync + Clone + 'static,
    ) -> Result<(), ClientError> {
        let io = |e| ClientError::Io {
            context: format!("cannot read {}", file.display()),
            source: e,
        };
        let len = tokio::fs::metadata(file).await.map_err(io)?.len();
        let mut backoff = FIRST_BACKOFF;
        let mut tries = 0;
        loop {
            tries += 1;
            let f = tokio::fs::File::open(file).await.map_err(io)?;
            let progress = progress.clone();
            let mut sent = 0u64;
            let stream = tokio_util::io::ReaderStream::new(f).inspect_ok(move |chunk| {
                sent += chunk.len() as u64;
                progress(sent);
            });
            let rb = self
                .request(Method::PUT, path)
                .header(reqwest::header::CONTENT_TYPE, "application/gzip")
                .header(reqwest::header::CONTENT_LENGTH, len)
                .body(reqwest::Body::wrap_stream(stream))
                .timeout(Duration::from_secs(3600));
            let tried = self.url().to_string();
            let result = match rb.send().await {
                Ok(resp) => self.check(resp).await.map(|_| ()),
                Err(e) => Err(self.unreachable(&e)),
            };
            if matches!(result, Err(ClientError::Unreachable { .. })) {
                self.fail_over(&tried);
            }
            match result {
                Err(e) if e.is_transient() && tries <= RETRIES => {
                    tokio::time::sleep(backoff).await;
                    backoff *= 2;
                }
                other => return other,
            }
        }
    }

    /// Streams a download into `dest`, calling `progress(done, total)`.
    async fn download_to(
        &self,
        path: &str,
        dest: &Path,
        mut progress: impl FnMut(u64, Option<u64>),
    ) -> Result<u64, ClientError> {
        use tokio::io::AsyncWriteExt;
        let resp = self
            .send(true, || {
                self.request(Method::GET, path)
                    .timeout(Duration::from_secs(3600))
            })
            .await?;
        let total = resp.content_length();
        let io = |e| ClientError::Io {
            context: format!("cannot write {}", dest.display()),
            source: e,
        };
        let mut file = tokio::fs::File::create(dest).await.map_err(io)?;
        let mut stream = resp.bytes_stream();
        let mut done = 0u64;
        while let Some(chunk) = stream.next().await {
            let chunk: Bytes = chunk.map_err(|e| self.unreachable(&e))?;
            file.write_all(&chunk).await.map_err(io)?;
            done += chunk.len() as u64;
            progress(done, total);
        }
        file.flush().await.map_err(io)?;
        Ok(done)
    }

    pub async fn download_blob(&self, digest: &str, dest: &Path) -> Result<u64, ClientError> {
        self.download_to(&format!("/v1/blobs/{digest}"), dest, |_, _| {})
            .await
    }

    /// Downloads the job's packed outputs to `dest`.
    pub async fn download_outputs(
        &self,
        id: i64,
        dest: &Path,
        progress: impl FnMut(u64, Option<u64>),
    ) -> Result<u64, ClientError> {
        self.download_to(&format!("/v1/jobs/{id}/outputs"), dest, progress)
            .await
    }

    // ---- the worker channel ----

    pub async fn register_worker(
        &self,
        req: &RegisterRequest,
    ) -> Result<RegisterResponse, ClientError> {
        // Not retried here: a lost answer would leave a second registration behind. The
        // worker's own loop retries, and the first one is declared lost after its lease.
        self.post_json("/v1/workers", req, false).await
    }

    /// The long poll; the HTTP timeout leaves room beyond the server's wait.
    pub async fn poll(&self, worker: i64, req: &PollRequest) -> Result<PollResponse, ClientError> {
        let path = format!("/v1/workers/{worker}/poll");
        let timeout = Duration::from_millis(req.wait_ms) + Duration::from_secs(15);
        let resp = self
            .send(false, || {
                self.request(Method::POST, &path).json(req).timeout(timeout)
            })
            .await?;
        self.json(resp).await
    }

    pub async fn heartbeat(
        &self,
        worker: i64,
        req: &HeartbeatRequest,
    ) -> Result<PollResponse, ClientError> {
        let path = format!("/v1/workers/{worker}/heartbeat");
        let resp = self
            .send(false, || {
                self.request(Method::POST, &path)
                    .json(req)
                    .timeout(REQUEST_TIMEOUT)
            })
            .await?;
        self.json(resp).await
    }

    fn task_path(worker: i64, task: i64, attempt: i32, what: &str) -> String {
        format!("/v1/workers/{worker}/tasks/{task}/attempts/{attempt}/{what}")
    }

    pub async fn append_logs(
        &self,
        worker: i64,
        task: i64,
        attempt: i32,
        batch: &LogBatch,
    ) -> Result<(), ClientError> {
        self.post_no_content(&Self::task_path(worker, task, attempt, "logs"), batch)
            .await
    }

    /// Node 0 of a distributed job says where its processes meet.
    pub async fn set_rendezvous(
        &self,
        worker: i64,
        task: i64,
        attempt: i32,
        point: &protocol::RendezvousPoint,
    ) -> Result<(), ClientError> {
        self.post_no_content(&Self::task_path(worker, task, attempt, "rendezvous"), point)
            .await
    }

    /// Where node 0 of the job meets the others, once it has said (the server waits a while
    /// for it before answering nothing).
    pub async fn rendezvous(
        &self,
        worker: i64,
        task: i64,
        attempt: i32,
    ) -> Result<protocol::RendezvousAnswer, ClientError> {
        self.get_json(&Self::task_path(worker, task, attempt, "rendezvous"))
            .await
    }

    pub async fn upload_outputs(
        &self,
        worker: i64,
        task: i64,
        attempt: i32,
        file: &Path,
    ) -> Result<(), ClientError> {
        self.put_file(
            &Self::task_path(worker, task, attempt, "outputs"),
            file,
            |_| {},
        )
        .await
    }

    pub async fn deregister_worker(&self, worker: i64) -> Result<(), ClientError> {
        let path = format!("/v1/workers/{worker}");
        self.send(true, || self.request(Method::DELETE, &path))
            .await?;
        Ok(())
    }

    /// Raw GET for callers that stream a response themselves.
    pub async fn get_stream(
        &self,
        path: &str,
    ) -> Result<impl Stream<Item = Result<Bytes, reqwest::Error>> + use<>, ClientError> {
        Ok(self
            .send(true, || self.request(Method::GET, path))
            .await?
            .bytes_stream())
    }
}
