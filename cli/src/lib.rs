//! `gpulayer`: the one command, as a library so that both the binary (`src/main.rs`) and the
//! Python package's console script (`python/`) enter it. `up` runs an API replica (with an embedded PostgreSQL unless
//! given a database URL, and optionally a worker), `join` runs a worker, and every other
//! command is a client of the REST API.
//!
//! # Layout
//! - [`settings`] — where the server URL and token come from (env, then config file).
//! - [`up`], [`join`]: the server and worker processes; [`certificate`] — the server's TLS
//!   certificate.
//! - [`submit`] — packing a source and submitting a job.
//! - [`jobs`] — jobs, status, wait, cancel, download, workers.
//! - [`resources`] — what workers (or this machine) have.
//! - [`logs`] — printing and following log lines.
//! - [`table`] — human output.
//! - [`sdk`] — the same operations for the Python package, without printing.
//! - [`dashboard`] — opening the web dashboard logged in.

mod certificate;
mod dashboard;
mod jobs;
mod join;
mod logs;
pub mod mcp;
mod resources;
pub mod sdk;
mod settings;
mod submit;
mod table;
mod token;
mod up;

use clap::{Parser, Subcommand};
use std::ffi::OsString;

#[derive(Debug, Parser)]
#[command(
    name = "gpulayer",
    version,
    about = "One layer between your code and every GPU you can reach"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Trust only a server presenting the certificate with this fingerprint (the sha256:...
    /// `gpulayer up` printed) [env: GPULAYER_FINGERPRINT; else `fingerprint` in the config
    /// file].
    #[arg(long, global = true, value_name = "sha256:HEX")]
    fingerprint: Option<String>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Start the control plane (API + embedded PostgreSQL), optionally with a local worker.
    Up(up::UpArgs),
    /// Join this machine to a control plane as a worker (outbound connections only).
    Join(join::JoinArgs),
    /// Submit a command as a job.
    Submit(submit::SubmitArgs),
    /// List jobs, newest first.
    Jobs(jobs::JobsArgs),
    /// Show one job.
    Status(jobs::JobArg),
    /// Print a job's logs (and follow them with --follow).
    Logs(logs::LogsArgs),
    /// Wait for a job to end; exits with its exit code.
    Wait(jobs::WaitArgs),
    /// Download a job's output files.
    Download(jobs::DownloadArgs),
    /// Cancel a job (a running one is stopped, process group and all).
    Cancel(jobs::JobArg),
    /// List workers.
    Workers(jobs::WorkersArgs),
    /// Every worker's devices, frameworks and what is free; `resources detect` probes this machine.
    Resources(resources::ResourcesArgs),
    /// Create, list and revoke tokens (admin tokens only).
    Token(token::TokenArgs),
    /// Open the web dashboard in a browser, logged in (a one-time link; --no-browser prints it).
    Dashboard(dashboard::DashboardArgs),
    /// Serve GPUlayer's tools to a coding agent over MCP on stdio (`claude mcp add gpulayer -- gpulayer mcp`).
    Mcp(mcp::McpArgs),
}

fn init_tracing(default: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("GPULAYER_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init()
        .ok();
}

/// An error that sets its own exit code and has already been reported (or needs no report).
#[derive(Debug)]
pub(crate) struct Exit(pub u8);

impl std::fmt::Display for Exit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "exit {}", self.0)
    }
}

impl std::error::Error for Exit {}

/// Runs the command line `args` (the program's name first) and returns its exit code.
/// Errors are printed here, as one `error: ...` line.
pub fn run(args: impl IntoIterator<Item = OsString>) -> u8 {
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(e) => {
            // --help and --version print and succeed; a usage error prints and exits 2.
            let _ = e.print();
            return e.exit_code().clamp(0, 255) as u8;
        }
    };
    if let Some(f) = &cli.fingerprint {
        settings::set_fingerprint_flag(f);
    }
    let server_side = matches!(cli.command, Command::Up(_) | Command::Join(_));
    // The platform verifier logs each certificate it refuses as an error of its own; the
    // refusal reaches the user once, as our one-line error.
    init_tracing(if server_side {
        "info,sqlx=warn,tower_http=warn,rustls_platform_verifier=off"
    } else {
        "warn,rustls_platform_verifier=off"
    });
    // A worker waits on the network and its children; one thread serves it with fewer
    // wake-ups across threads (it matters when many workers share a machine). The server and
    // the client commands take the multi-threaded runtime.
    let runtime = if matches!(cli.command, Command::Join(_)) {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    } else {
        tokio::runtime::Runtime::new()
    };
    let runtime = match runtime {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return 1;
        }
    };
    let result = runtime.block_on(async move {
        match cli.command {
            Command::Up(a) => up::run(a).await,
            Command::Join(a) => join::run(a).await,
            Command::Submit(a) => submit::run(a).await,
            Command::Jobs(a) => jobs::list(a).await,
            Command::Status(a) => jobs::status(a).await,
            Command::Logs(a) => logs::run(a).await,
            Command::Wait(a) => jobs::wait(a).await,
            Command::Download(a) => jobs::download(a).await,
            Command::Cancel(a) => jobs::cancel(a).await,
            Command::Workers(a) => jobs::workers(a).await,
            Command::Resources(a) => resources::run(a).await,
            Command::Token(a) => token::run(a).await,
            Command::Mcp(a) => mcp::run(a).await,
            Command::Dashboard(a) => dashboard::run(a).await,
        }
    });
    match result {
        Ok(()) => 0,
        Err(e) => match e.downcast_ref::<Exit>() {
            Some(Exit(code)) => *code,
            None => {
                eprintln!("error: {}", settings::explain(&e));
                1
            }
        },
    }
}
