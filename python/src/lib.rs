//! `gpulayer._native`: the Rust client under the Python package — the `gpulayer` command
//! (`run_cli`, which the console script enters) and a blocking `Client` over the typed HTTP
//! client (tokens, retries, replica fail-over), speaking JSON strings to the Python layer.
//!
//! Every call releases the GIL while it waits and checks for Ctrl-C every 100 ms, so a
//! long `wait` or log follow stays interruptible. Errors arrive as one `NativeError(kind,
//! message, detail)`, which `gpulayer.errors` turns into the public exception types.

// pyo3's macros expand to `unsafe` blocks for the CPython ABI; this crate writes none itself.
#![allow(unsafe_code)]

use cli::sdk::{self, Client, ClientError};
use protocol::{ErrorCode, LogStreamMessage};
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use std::ffi::OsString;
use std::future::Future;
use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

pyo3::create_exception!(
    _native,
    NativeError,
    PyException,
    "An error of the native client: args are (kind, message, detail or None)."
);

/// How often a blocking call looks up from its wait to see whether Ctrl-C was pressed.
const SIGNAL_CHECK: Duration = Duration::from_millis(100);

fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("gpulayer-client")
            .enable_all()
            .build()
            .expect("a tokio runtime")
    })
}

/// The kind of an error, for `gpulayer.errors`: which exception it becomes.
fn native_error(e: anyhow::Error) -> PyErr {
    let (kind, detail) = match e.downcast_ref::<ClientError>() {
        Some(ClientError::Unreachable { .. }) => ("connection", None),
        Some(ClientError::BadUrl { .. }) => ("connection", None),
        Some(
            ClientError::FingerprintMismatch { .. }
            | ClientError::UntrustedCertificate { .. }
            | ClientError::PinWithoutTls { .. }
            | ClientError::BadFingerprint { .. },
        ) => ("connection", None),
        Some(ClientError::Unauthorized { .. }) => ("unauthorized", None),
        Some(ClientError::Unplaceable(report)) => {
            ("scheduling", serde_json::to_string(report).ok())
        }
        Some(ClientError::Api { code, .. }) => (
            match code {
                ErrorCode::NotFound => "not_found",
                ErrorCode::BadRequest => "bad_input",
                ErrorCode::Conflict => "conflict",
                ErrorCode::PayloadTooLarge => "too_large",
                _ => "api",
            },
            None,
        ),
        Some(_) => ("api", None),
        None if e.downcast_ref::<domain::SpecError>().is_some() => ("bad_input", None),
        None => ("error", None),
    };
    NativeError::new_err((kind, sdk::explain(&e), detail))
}

/// Runs `fut` on the client runtime without the GIL, stopping (with KeyboardInterrupt)
/// when Ctrl-C is pressed.
fn block_on<T: Send + 'static>(
    py: Python<'_>,
    fut: impl Future<Output = anyhow::Result<T>> + Send + 'static,
) -> PyResult<T> {
    let mut task = runtime().spawn(fut);
    loop {
        let done = py.detach(|| {
            runtime().block_on(async { tokio::time::timeout(SIGNAL_CHECK, &mut task).await.ok() })
        });
        match done {
            Some(Ok(result)) => return result.map_err(native_error),
            Some(Err(join)) => {
                return Err(NativeError::new_err((
                    "error",
                    format!("the client task failed: {join}"),
                    None::<String>,
                )));
            }
            None => {
                if let Err(interrupted) = py.check_signals() {
                    task.abort();
                    return Err(interrupted);
                }
            }
        }
    }
}

/// A temporary file holding `data` (the client uploads files, streaming them).
fn tempfile_with(data: &[u8]) -> anyhow::Result<tempfile::NamedTempFile> {
    use std::io::Write;
    let mut file = tempfile::NamedTempFile::new()?;
    file.write_all(data)?;
    file.flush()?;
    Ok(file)
}

fn json<T: serde::Serialize>(v: &T) -> anyhow::Result<String> {
    Ok(serde_json::to_string(v)?)
}

/// Runs the `gpulayer` command line `args` (program name first) in this process and
/// returns its exit code.
#[pyfunction]
fn run_cli(py: Python<'_>, args: Vec<String>) -> u8 {
    py.detach(|| cli::run(args.into_iter().map(OsString::from)))
}

/// A connection to a GPUlayer server.
#[pyclass(module = "gpulayer._native", frozen)]
struct NativeClient {
    inner: Client,
}

#[pymethods]
impl NativeClient {
    #[new]
    #[pyo3(signature = (url=None, token=None, fingerprint=None))]
    fn new(url: Option<&str>, token: Option<&str>, fingerprint: Option<&str>) -> PyResult<Self> {
        let inner = sdk::connect(url, token, fingerprint).map_err(native_error)?;
        Ok(Self { inner })
    }

    /// The server URL in use now.
    #[getter]
    fn url(&self) -> String {
        self.inner.url().to_string()
    }

    /// The JobSpec (JSON) that `gpulayer submit ARGS` would submit, checked as the CLI does.
    fn spec(&self, args: Vec<String>) -> PyResult<String> {
        sdk::spec_from_args(&args)
            .and_then(|s| json(&s))
            .map_err(native_error)
    }

    /// Which workers could run the job, and why not the others (PlacementReport JSON).
    fn placement(&self, py: Python<'_>, spec: String) -> PyResult<String> {
        let client = self.inner.clone();
        block_on(py, async move {
            let spec = serde_json::from_str(&spec)?;
            json(&sdk::placement(&client, &spec).await?)
        })
    }

    /// Submits a job (JobSpec JSON), shipping `source` first; refuses with kind
    /// `scheduling` (detail: the PlacementReport), before anything is uploaded or stored,
    /// when no worker could ever run it. Returns the JobView JSON.
    #[pyo3(signature = (spec, source=None))]
    fn submit(&self, py: Python<'_>, spec: String, source: Option<PathBuf>) -> PyResult<String> {
        let client = self.inner.clone();
        block_on(py, async move {
            let mut spec: domain::JobSpec = serde_json::from_str(&spec)?;
            if let Some(dir) = source {
                // Asked first only when there is something to upload: the submit itself
                // refuses a job nobody could run, with the same report.
                let report = sdk::placement(&client, &spec).await?;
                if report.eligible_workers == 0 && !report.verdicts.is_empty() {
                    return Err(ClientError::Unplaceable(report).into());
                }
                spec.source = Some(sdk::ship_source(&client, &dir).await?);
            }
            let key = uuid::Uuid::new_v4().to_string();
            json(
                &client
                    .submit(&protocol::SubmitRequest { spec }, &key)
                    .await?,
            )
        })
    }

    /// Submits one remote call (JobSpec JSON with `call`) and waits up to `wait_ms` for its
    /// result (CallAnswer JSON: the job, and the result if it finished in time).
    fn call(&self, py: Python<'_>, spec: String, wait_ms: u64) -> PyResult<String> {
        let client = self.inner.clone();
        block_on(py, async move {
            let spec: domain::JobSpec = serde_json::from_str(&spec)?;
            let key = uuid::Uuid::new_v4().to_string();
            json(
                &client
                    .call(&protocol::calls::CallRequest { spec, wait_ms }, &key)
                    .await?,
            )
        })
    }

    /// One job (JobView JSON).
    fn job(&self, py: Python<'_>, id: i64) -> PyResult<String> {
        let client = self.inner.clone();
        block_on(py, async move { json(&client.job(id).await?) })
    }

    /// Jobs, newest first (JobList JSON).
    #[pyo3(signature = (state=None, limit=50))]
    fn jobs(&self, py: Python<'_>, state: Option<String>, limit: u32) -> PyResult<String> {
        let client = self.inner.clone();
        block_on(py, async move {
            json(&client.list_jobs(state.as_deref(), limit).await?)
        })
    }

    /// Cancels a job (CancelResponse JSON).
    fn cancel(&self, py: Python<'_>, id: i64) -> PyResult<String> {
        let client = self.inner.clone();
        block_on(py, async move { json(&client.cancel(id).await?) })
    }

    /// The workers (WorkerList JSON).
    fn workers(&self, py: Python<'_>) -> PyResult<String> {
        let client = self.inner.clone();
        block_on(py, async move { json(&client.workers().await?) })
    }

    /// Waits until job `id` ends and returns its JobView JSON, or None after `timeout`
    /// seconds.
    #[pyo3(signature = (id, timeout=None))]
    fn wait(&self, py: Python<'_>, id: i64, timeout: Option<f64>) -> PyResult<Option<String>> {
        let client = self.inner.clone();
        block_on(py, async move {
            // Negative waits not at all; one too long for a Duration waits forever.
            let timeout = timeout.and_then(|s| Duration::try_from_secs_f64(s.max(0.0)).ok());
            sdk::wait(&client, id, timeout)
                .await?
                .map(|job| json(&job))
                .transpose()
        })
    }

    /// Every stored log line of job `id` (LogLine JSON objects), optionally of one rank.
    #[pyo3(signature = (id, rank=None))]
    fn logs(&self, py: Python<'_>, id: i64, rank: Option<u32>) -> PyResult<Vec<String>> {
        let client = self.inner.clone();
        block_on(py, async move {
            let lines = sdk::stored_lines(&client, id, rank).await?;
            lines.iter().map(json).collect()
        })
    }

    /// Streams job `id`'s log lines to `on_line` (each a LogLine JSON object) until the job
    /// ends; returns the end message (JSON: state, exit_code, reason).
    #[pyo3(signature = (id, on_line, rank=None))]
    fn follow_logs(
        &self,
        py: Python<'_>,
        id: i64,
        on_line: Py<PyAny>,
        rank: Option<u32>,
    ) -> PyResult<String> {
        let client = self.inner.clone();
        block_on(py, async move {
            let end = client
                .follow_rank_logs(id, rank, |line| {
                    if let Ok(text) = serde_json::to_string(line) {
                        Python::attach(|py| {
                            if let Err(e) = on_line.call1(py, (text,)) {
                                e.print(py);
                            }
                        });
                    }
                })
                .await?;
            match end {
                LogStreamMessage::End {
                    state,
                    exit_code,
                    reason,
                } => json(&serde_json::json!({
                    "state": state, "exit_code": exit_code, "reason": reason,
                })),
                LogStreamMessage::Line(_) => anyhow::bail!("the log stream ended without an end"),
            }
        })
    }

    /// Stores `data` under its sha256 `digest` unless the server has it already (a pickled
    /// function: uploaded once however often it is called).
    fn put_blob(&self, py: Python<'_>, digest: String, data: Vec<u8>) -> PyResult<()> {
        let client = self.inner.clone();
        block_on(py, async move {
            if client.blob_exists(&digest).await? {
                return Ok(());
            }
            let file = tempfile_with(&data)?;
            client.upload_blob(&digest, file.path(), |_| {}).await?;
            Ok(())
        })
    }

    /// Submits many jobs (JobSpec JSON objects, one per string) in one request; their ids
    /// in order. Refused whole on any bad spec.
    fn submit_many(&self, py: Python<'_>, specs: Vec<String>) -> PyResult<Vec<i64>> {
        let client = self.inner.clone();
        block_on(py, async move {
            let jobs = specs
                .iter()
                .map(|s| serde_json::from_str(s))
                .collect::<Result<Vec<serde_json::Value>, _>>()?;
            let key = uuid::Uuid::new_v4().to_string();
            let done = client
                .submit_batch(&protocol::BatchSubmitRequest { jobs }, &key)
                .await?;
            Ok(done.ids.into_iter().map(|id| id.0).collect())
        })
    }

    /// The finished calls among `jobs` (CallResults JSON), waiting up to `wait_ms` for one.
    #[pyo3(signature = (jobs, wait_ms=0))]
    fn call_results(&self, py: Python<'_>, jobs: Vec<i64>, wait_ms: u64) -> PyResult<String> {
        let client = self.inner.clone();
        block_on(py, async move {
            let req = protocol::calls::CallResultsRequest { jobs, wait_ms };
            json(&client.call_results(&req).await?)
        })
    }

    /// Downloads job `id`'s outputs into `dest`; returns the files written (relative paths).
    fn download(&self, py: Python<'_>, id: i64, dest: PathBuf) -> PyResult<Vec<String>> {
        let client = self.inner.clone();
        block_on(py, async move {
            let (_, files) = sdk::download(&client, id, &dest).await?;
            Ok(files
                .iter()
                .map(|f| f.to_string_lossy().into_owned())
                .collect())
        })
    }
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("NativeError", m.py().get_type::<NativeError>())?;
    m.add_class::<NativeClient>()?;
    m.add_function(wrap_pyfunction!(run_cli, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
