//! MCP: GPUlayer's tools for coding agents, over stdio (`gpulayer mcp`) and over Streamable
//! HTTP (`/mcp` on every API replica). Each tool is the CLI's own operation (`sdk`) run with
//! the caller's token against the API, so the API's role checks apply as they do to the CLI.

use crate::sdk;
use anyhow::Result;
use clap::Args;
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::tool::ToolCallContext;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
    ListToolsResult, PaginatedRequestParams, ServerCapabilities, ServerConfig,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler, schemars, tool, tool_router};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

/// The tools that change something: not offered in read-only mode or to read-only tokens.
const WRITING_TOOLS: [&str; 2] = ["gpulayer_submit", "gpulayer_cancel"];

/// The longest `gpulayer_wait` blocks in one call (an agent can call it again).
const MAX_WAIT_SECONDS: u64 = 600;

#[derive(Debug, Args)]
pub(crate) struct McpArgs {
    /// Offer only the reading tools (no submit, no cancel).
    #[arg(long)]
    read_only: bool,
}

/// Where a tool call's client comes from.
#[derive(Clone)]
enum Access {
    /// The stdio server: one client, from GPULAYER_URL / GPULAYER_TOKEN or the config file.
    Fixed(sdk::Client),
    /// `/mcp` on a replica: a client of this replica with the request's own bearer token.
    PerRequest {
        api_url: String,
        pin: Option<client::Fingerprint>,
    },
}

#[derive(Clone)]
pub struct GpulayerMcp {
    access: Access,
    read_only: bool,
    tool_router: ToolRouter<Self>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct NoArgs {}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct SubmitArgs {
    /// The command to run, as an argv list: ["python", "train.py", "--epochs", "3"].
    pub command: Vec<String>,
    /// A local project directory (absolute path) to ship; the command runs inside it.
    /// `.gitignore` and `.gpulayerignore` are honoured: keep datasets out of it.
    pub directory: Option<String>,
    /// "cpu", "cuda", "mps" or "any" (default "any").
    pub accelerator: Option<String>,
    /// How many devices of that kind (per node).
    pub devices: Option<u32>,
    /// Least memory on each device, e.g. "40GiB".
    pub min_device_memory: Option<String>,
    /// Frameworks the job needs, with PEP 440 versions: ["torch>=2"].
    #[serde(default)]
    pub frameworks: Vec<String>,
    /// Worker labels the job needs: {"zone": "europe-west1-b"}.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Environment variables for the job.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Globs (relative to the job's directory) of files to bring back as outputs, besides
    /// everything written to $GPULAYER_OUTPUT_DIR.
    #[serde(default)]
    pub outputs: Vec<String>,
    /// Machines for a distributed job (each runs procs_per_node processes with torchrun's
    /// variables set).
    pub nodes: Option<u32>,
    pub procs_per_node: Option<u32>,
    /// A name to find the job by.
    pub name: Option<String>,
    /// Stop the job after this many seconds.
    pub timeout_seconds: Option<u64>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct JobArgs {
    /// The job's id (as gpulayer_submit or gpulayer_jobs gave it).
    pub job: i64,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct WaitArgs {
    pub job: i64,
    /// Seconds to wait at most (default 60, at most 600); the job keeps running after.
    pub timeout_seconds: Option<u64>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct LogsArgs {
    pub job: i64,
    /// Only this process's lines (its global rank) of a multi-node job.
    pub rank: Option<u32>,
    /// Skip this many lines first (to page through long logs).
    pub offset: Option<usize>,
    /// Only the last this-many lines (after the offset). Default 200.
    pub tail: Option<usize>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct DownloadArgs {
    pub job: i64,
    /// A local directory (absolute path) to unpack the outputs into; created if missing.
    pub directory: String,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct JobsArgs {
    /// Only jobs in this state: pending, assigned, running, succeeded, failed, cancelled.
    pub state: Option<String>,
    /// At most this many, newest first (default 20).
    pub limit: Option<u32>,
}

fn json(value: impl serde::Serialize) -> Result<CallToolResult, ErrorData> {
    let text = serde_json::to_string_pretty(&value)
        .map_err(|e| ErrorData::internal_error(e.to_string(), None))?;
    Ok(CallToolResult::success(vec![ContentBlock::text(text)]))
}

/// A failure the agent should read (and act on), not a protocol error.
fn failed(e: anyhow::Error) -> Result<CallToolResult, ErrorData> {
    let text = match e.downcast_ref::<sdk::ClientError>() {
        Some(sdk::ClientError::Unplaceable(report)) => unplaceable(report),
        _ => sdk::explain(&e),
    };
    Ok(CallToolResult::error(vec![ContentBlock::text(text)]))
}

/// No worker could ever run the job: every worker's reason, as `gpulayer submit` prints it
/// (the whole table is the useful part).
fn unplaceable(report: &protocol::PlacementReport) -> String {
    format!("scheduling: no eligible worker\n{}", report.table)
}

macro_rules! attempt {
    ($e:expr) => {
        match $e {
            Ok(v) => v,
            Err(e) => return failed(anyhow::Error::from(e)),
        }
    };
}

#[tool_router(router = tool_router)]
impl GpulayerMcp {
    fn new(access: Access, read_only: bool) -> Self {
        let mut tool_router = Self::tool_router();
        if read_only {
            for name in WRITING_TOOLS {
                tool_router.remove_route(name);
            }
        }
        GpulayerMcp {
            access,
            read_only,
            tool_router,
        }
    }

    /// The client for this call: the stdio server's, or one with the HTTP request's token.
    fn client(&self, ctx: &RequestContext<RoleServer>) -> Result<sdk::Client> {
        match &self.access {
            Access::Fixed(c) => Ok(c.clone()),
            Access::PerRequest { api_url, pin } => {
                let parts = ctx
                    .extensions
                    .get::<http::request::Parts>()
                    .ok_or_else(|| anyhow::anyhow!("no HTTP request behind this call"))?;
                let token = bearer(&parts.headers)
                    .ok_or_else(|| anyhow::anyhow!("missing bearer token"))?;
                Ok(sdk::Client::pinned(api_url, Some(token), *pin)?)
            }
        }
    }

    #[tool(
        name = "gpulayer_resources",
        description = "Every GPUlayer worker: its state (online/lost), slots busy, CPUs and memory, each device (kind, index, name, memory, busy or free), which frameworks can really compute there (torch.cuda, jax.cuda, mlx...) and its labels. Call this first to see what GPUs are free before submitting."
    )]
    async fn resources(
        &self,
        ctx: RequestContext<RoleServer>,
        _: Parameters<NoArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        let client = attempt!(self.client(&ctx));
        json(attempt!(client.workers().await))
    }

    #[tool(
        name = "gpulayer_submit",
        description = "Run a command as a GPUlayer job on a worker that has what it needs. Ships a local project directory (the command runs inside it), with requirements: accelerator (cpu/cuda/mps/any), devices, min_device_memory, frameworks ('torch>=2'), labels, env, output globs, nodes and procs_per_node for distributed jobs. Returns the job (its id, state). If no worker could ever run it, returns an error with one line per worker saying why (e.g. 'needs 2 usable cuda device(s), worker has 1'): change the request rather than retrying it."
    )]
    async fn submit(
        &self,
        ctx: RequestContext<RoleServer>,
        Parameters(a): Parameters<SubmitArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        let client = attempt!(self.client(&ctx));
        let mut args: Vec<String> = Vec::new();
        let mut flag = |k: &str, v: String| {
            args.push(k.to_string());
            args.push(v);
        };
        flag(
            "--accelerator",
            a.accelerator.unwrap_or_else(|| "any".into()),
        );
        if let Some(d) = a.devices {
            flag("--devices", d.to_string());
        }
        if let Some(m) = a.min_device_memory {
            flag("--min-device-memory", m);
        }
        for f in a.frameworks {
            flag("--framework", f);
        }
        for (k, v) in a.labels {
            flag("--where", format!("{k}={v}"));
        }
        for (k, v) in a.env {
            flag("--env", format!("{k}={v}"));
        }
        for g in a.outputs {
            flag("--output", g);
        }
        if let Some(n) = a.nodes {
            flag("--nodes", n.to_string());
        }
        if let Some(p) = a.procs_per_node {
            flag("--procs-per-node", p.to_string());
        }
        if let Some(n) = a.name {
            flag("--name", n);
        }
        if let Some(t) = a.timeout_seconds {
            flag("--timeout", t.to_string());
        }
        args.push("--".into());
        args.extend(a.command);
        let mut spec = attempt!(sdk::spec_from_args(&args));
        if let Some(dir) = a.directory {
            // Before a source is uploaded: could any worker ever run the job? (The submit
            // answers that too, but only after the upload.)
            let report = attempt!(sdk::placement(&client, &spec).await);
            if !report.verdicts.is_empty() && report.eligible_workers == 0 {
                return Ok(CallToolResult::error(vec![ContentBlock::text(
                    unplaceable(&report),
                )]));
            }
            spec.source = Some(attempt!(
                sdk::ship_source(&client, &PathBuf::from(dir)).await
            ));
        }
        let key = uuid::Uuid::new_v4().to_string();
        json(attempt!(
            client.submit(&protocol::SubmitRequest { spec }, &key).await
        ))
    }

    #[tool(
        name = "gpulayer_wait",
        description = "Wait for a job to end, at most timeout_seconds (default 60, at most 600). Returns the job with its final state (succeeded, failed, cancelled), exit_code and reason; or, if it is still going, its current state with still_running=true (call again to keep waiting)."
    )]
    async fn wait(
        &self,
        ctx: RequestContext<RoleServer>,
        Parameters(a): Parameters<WaitArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        let client = attempt!(self.client(&ctx));
        let secs = a.timeout_seconds.unwrap_or(60).min(MAX_WAIT_SECONDS);
        match attempt!(sdk::wait(&client, a.job, Some(Duration::from_secs(secs))).await) {
            Some(job) => json(serde_json::json!({"still_running": false, "job": job})),
            None => json(
                serde_json::json!({"still_running": true, "job": attempt!(client.job(a.job).await)}),
            ),
        }
    }

    #[tool(
        name = "gpulayer_job_logs",
        description = "A job's output lines so far (stdout and stderr of every process, oldest first), each with its stream and, for multi-node jobs, its rank. rank keeps one process's lines; offset skips lines; tail keeps the last N (default 200). Read the last lines of a failed job before changing anything."
    )]
    async fn job_logs(
        &self,
        ctx: RequestContext<RoleServer>,
        Parameters(a): Parameters<LogsArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        let client = attempt!(self.client(&ctx));
        let lines = attempt!(sdk::stored_lines(&client, a.job, a.rank).await);
        let total = lines.len();
        let after_offset: Vec<_> = lines.into_iter().skip(a.offset.unwrap_or(0)).collect();
        let tail = a.tail.unwrap_or(200);
        let start = after_offset.len().saturating_sub(tail);
        let shown: Vec<serde_json::Value> = after_offset[start..]
            .iter()
            .map(|l| serde_json::json!({"stream": l.stream, "rank": l.rank, "text": l.text}))
            .collect();
        json(serde_json::json!({"total_lines": total, "lines": shown}))
    }

    #[tool(
        name = "gpulayer_download_outputs",
        description = "Download a finished job's outputs (files it wrote to $GPULAYER_OUTPUT_DIR or matching its output globs; checkpoints) and unpack them into a local directory. Multi-node jobs come as rank-R/ directories. Returns the files written."
    )]
    async fn download_outputs(
        &self,
        ctx: RequestContext<RoleServer>,
        Parameters(a): Parameters<DownloadArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        let client = attempt!(self.client(&ctx));
        let (bytes, files) =
            attempt!(sdk::download(&client, a.job, &PathBuf::from(&a.directory)).await);
        json(serde_json::json!({"directory": a.directory, "bytes": bytes, "files": files}))
    }

    #[tool(
        name = "gpulayer_jobs",
        description = "Jobs, newest first: id, name, state, accelerator, worker, submitted by which token, exit code, command. Filter by state; limit (default 20)."
    )]
    async fn jobs(
        &self,
        ctx: RequestContext<RoleServer>,
        Parameters(a): Parameters<JobsArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        let client = attempt!(self.client(&ctx));
        json(attempt!(
            client
                .list_jobs(a.state.as_deref(), a.limit.unwrap_or(20))
                .await
        ))
    }

    #[tool(
        name = "gpulayer_cancel",
        description = "Cancel a job: a pending one never starts, a running one is stopped (its whole process group, on every node). Returns the state it was in."
    )]
    async fn cancel(
        &self,
        ctx: RequestContext<RoleServer>,
        Parameters(a): Parameters<JobArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        let client = attempt!(self.client(&ctx));
        json(attempt!(client.cancel(a.job).await))
    }
}

/// The bearer token of a request, if it carries one.
fn bearer(headers: &http::HeaderMap) -> Option<&str> {
    headers
        .get(http::header::AUTHORIZATION)?
        .to_str()
        .ok()?
        .strip_prefix("Bearer ")
        .map(str::trim)
        .filter(|t| !t.is_empty())
}

impl GpulayerMcp {
    /// Whether this call may use the writing tools: not in read-only mode, and not with a
    /// read-only token (the API would refuse them anyway; they are not even offered).
    fn offers_writing_tools(&self, ctx: &RequestContext<RoleServer>) -> bool {
        if self.read_only {
            return false;
        }
        let Some(parts) = ctx.extensions.get::<http::request::Parts>() else {
            return true;
        };
        parts
            .extensions
            .get::<api::Caller>()
            .is_none_or(|c| c.require(api::auth::Permission::SubmitJobs).is_ok())
    }
}

impl ServerHandler for GpulayerMcp {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("gpulayer", env!("CARGO_PKG_VERSION")))
            .with_instructions(
                "GPUlayer runs commands as jobs on every GPU the user can reach. \
                 gpulayer_resources shows the workers and free devices; gpulayer_submit ships \
                 a project directory and starts a job; gpulayer_wait, gpulayer_job_logs and \
                 gpulayer_download_outputs follow it to its results.",
            )
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let writing = self.offers_writing_tools(&ctx);
        let tools = self
            .tool_router
            .list_all()
            .into_iter()
            .filter(|t| writing || !WRITING_TOOLS.contains(&t.name.as_ref()))
            .collect();
        Ok(ListToolsResult::with_all_items(tools))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        if WRITING_TOOLS.contains(&request.name.as_ref()) && !self.offers_writing_tools(&ctx) {
            return Err(ErrorData::invalid_params(
                format!("{} is not offered to a read-only caller", request.name),
                None,
            ));
        }
        self.tool_router
            .call(ToolCallContext::new(self, request, ctx))
            .await
    }
}

/// `gpulayer mcp`: the tools over stdio, with the CLI's settings.
pub(crate) async fn run(args: McpArgs) -> Result<()> {
    let client = crate::settings::client()?;
    let server = GpulayerMcp::new(Access::Fixed(client), args.read_only);
    let running = rmcp::ServiceExt::serve(server, rmcp::transport::stdio())
        .await
        .map_err(|e| anyhow::anyhow!("cannot start the MCP server on stdio: {e}"))?;
    running
        .waiting()
        .await
        .map_err(|e| anyhow::anyhow!("the MCP server stopped: {e}"))?;
    Ok(())
}

/// `/mcp` for an API replica whose own API is at `api_url`: Streamable HTTP (stateless for
/// the 2026-07-28 protocol, sessions for older clients), a bearer token on every request
/// (checked before MCP sees it), `Host` limited to `allowed_hosts`.
pub fn http_service(
    api_url: String,
    pin: Option<client::Fingerprint>,
    allowed_hosts: Vec<String>,
    state: api::server::AppState,
) -> axum::Router {
    use rmcp::transport::streamable_http_server::{
        StreamableHttpServerConfig, StreamableHttpService, session::local::LocalSessionManager,
    };
    let mut config = StreamableHttpServerConfig::default();
    config.allowed_hosts = allowed_hosts;
    config.legacy_session_mode = true;
    let service = StreamableHttpService::new(
        move || {
            Ok(GpulayerMcp::new(
                Access::PerRequest {
                    api_url: api_url.clone(),
                    pin,
                },
                false,
            ))
        },
        std::sync::Arc::new(LocalSessionManager::default()),
        config,
    );
    axum::Router::new()
        .nest_service("/mcp", service)
        .layer(axum::middleware::from_fn_with_state(state, authenticate))
}

/// Every `/mcp` request carries a known bearer token; its caller rides along for the tools.
async fn authenticate(
    axum::extract::State(state): axum::extract::State<api::server::AppState>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::extract::FromRequestParts;
    use axum::response::IntoResponse;
    let (mut parts, body) = request.into_parts();
    match api::Caller::from_request_parts(&mut parts, &state).await {
        Ok(caller) => {
            parts.extensions.insert(caller);
            next.run(axum::extract::Request::from_parts(parts, body))
                .await
        }
        Err(e) => e.into_response(),
    }
}
