//! Real `gpulayer` processes: an API server, workers, and CLI invocations against them.
//! Every child is killed when its handle drops, so a failed test leaves nothing running.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long a server may take to print its ready line (it migrates a fresh database first).
const SERVER_START_TIMEOUT: Duration = Duration::from_secs(60);

/// Options for [`Server::start`].
#[derive(Debug, Clone)]
pub struct ServerOptions {
    /// Seconds of silence after which a worker is declared lost.
    pub lease_seconds: u64,
    /// Also run a worker inside the server process.
    pub with_worker: bool,
    /// More arguments for `gpulayer up`.
    pub extra_args: Vec<String>,
    /// More environment for `gpulayer up`.
    pub env: Vec<(String, String)>,
}

impl Default for ServerOptions {
    fn default() -> Self {
        Self {
            lease_seconds: 10,
            with_worker: false,
            extra_args: vec![],
            env: vec![],
        }
    }
}

/// A `gpulayer up` process on an ephemeral port.
#[derive(Debug)]
pub struct Server {
    pub url: String,
    /// The `sha256:` fingerprint of the server's certificate (none with --insecure-http).
    pub fingerprint: Option<String>,
    /// The server's certificate, PEM, where `up` wrote it.
    pub certificate: Option<PathBuf>,
    pub admin_token: String,
    pub join_token: String,
    pub data_dir: tempfile::TempDir,
    child: Child,
    bin: PathBuf,
}

impl Server {
    pub fn start(bin: &Path, database_url: &str, options: ServerOptions) -> Self {
        let data_dir = tempfile::tempdir().expect("server data dir");
        let mut cmd = Command::new(bin);
        cmd.args([
            "up",
            "--json",
            "--listen",
            "127.0.0.1:0",
            "--database-url",
            database_url,
        ])
        .arg("--data-dir")
        .arg(data_dir.path())
        .args(["--lease-seconds", &options.lease_seconds.to_string()])
        .env("XDG_CONFIG_HOME", data_dir.path().join("config"))
        .env_remove("GPULAYER_URL")
        .env_remove("GPULAYER_TOKEN")
        .env_remove("GPULAYER_FINGERPRINT")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
        if options.with_worker {
            cmd.arg("--with-worker");
        }
        cmd.args(&options.extra_args)
            .envs(options.env.iter().map(|(k, v)| (k, v)));
        let mut child = cmd.spawn().expect("spawn gpulayer up");
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut lines = BufReader::new(stdout).lines();
            if let Some(Ok(first)) = lines.next() {
                let _ = tx.send(first);
            }
            // Keep draining so the server never blocks on a full pipe.
            for line in lines.map_while(Result::ok) {
                println!("[server] {line}");
            }
        });
        let first = rx.recv_timeout(SERVER_START_TIMEOUT).unwrap_or_else(|_| {
            panic!("gpulayer up printed no ready line within {SERVER_START_TIMEOUT:?}")
        });
        let ready: serde_json::Value = serde_json::from_str(&first)
            .unwrap_or_else(|e| panic!("gpulayer up's first line is not JSON ({e}): {first}"));
        // A replica joining a database that already has an admin token prints none.
        let field = |k: &str| ready[k].as_str().unwrap_or_default().to_string();
        Self {
            url: field("url"),
            fingerprint: ready["fingerprint"].as_str().map(str::to_string),
            certificate: ready["tls_certificate"].as_str().map(PathBuf::from),
            admin_token: field("admin_token"),
            join_token: field("join_token"),
            data_dir,
            child,
            bin: bin.to_path_buf(),
        }
    }

    /// A CLI bound to this server with the admin token.
    pub fn cli(&self) -> Cli {
        Cli {
            bin: self.bin.clone(),
            url: self.url.clone(),
            token: self.admin_token.clone(),
            fingerprint: self.fingerprint.clone(),
            config_home: self.data_dir.path().join("cli-config"),
        }
    }

    /// A raw HTTP client that trusts this server's certificate (and nothing else).
    pub fn http(&self) -> reqwest::Client {
        match &self.fingerprint {
            Some(f) => {
                client::tls::pinned_reqwest(client::Fingerprint::parse(f).expect("fingerprint"))
                    .expect("a pinned HTTP client")
            }
            None => reqwest::Client::new(),
        }
    }

    /// Starts a `gpulayer join` worker with this server's join token.
    pub fn join(&self, name: &str, extra: &[&str]) -> Worker {
        self.join_to(&self.url, name, extra)
    }

    /// Starts a worker that dials `urls` (one, or several replicas comma-separated).
    pub fn join_to(&self, urls: &str, name: &str, extra: &[&str]) -> Worker {
        let dir = tempfile::tempdir().expect("worker dir");
        let mut cmd = Command::new(&self.bin);
        cmd.args(["join", urls, "--token", &self.join_token, "--name", name])
            .arg("--work-dir")
            .arg(dir.path());
        if let Some(f) = &self.fingerprint {
            cmd.args(["--fingerprint", f]);
        }
        let child = cmd
            .args(extra)
            .env_remove("GPULAYER_URL")
            .env_remove("GPULAYER_TOKEN")
            .env_remove("GPULAYER_FINGERPRINT")
            .stdin(Stdio::null())
            .spawn()
            .expect("spawn gpulayer join");
        Worker {
            name: name.to_string(),
            child,
            work_dir: dir,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// `kill -9`: the replica dies mid-request.
    pub fn kill_hard(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A `gpulayer join` process.
#[derive(Debug)]
pub struct Worker {
    pub name: String,
    pub work_dir: tempfile::TempDir,
    child: Child,
}

impl Worker {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// `kill -9`: the worker gets no chance to say goodbye.
    pub fn kill_hard(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.kill_hard();
    }
}

/// The `gpulayer` CLI pointed at one server.
#[derive(Debug, Clone)]
pub struct Cli {
    pub bin: PathBuf,
    pub url: String,
    pub token: String,
    /// Pinned through GPULAYER_FINGERPRINT when set.
    pub fingerprint: Option<String>,
    pub config_home: PathBuf,
}

/// What one CLI run printed and how it exited.
#[derive(Debug, Clone)]
pub struct CliOutput {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl CliOutput {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.stdout).unwrap_or_else(|e| {
            panic!(
                "stdout is not JSON ({e}): {}\nstderr: {}",
                self.stdout, self.stderr
            )
        })
    }

    /// Panics with everything printed unless the command exited 0.
    pub fn success(self) -> Self {
        assert_eq!(
            self.code, 0,
            "command failed\nstdout: {}\nstderr: {}",
            self.stdout, self.stderr
        );
        self
    }
}

impl Cli {
    pub fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(&self.bin);
        cmd.args(args)
            .env("GPULAYER_URL", &self.url)
            .env("GPULAYER_TOKEN", &self.token)
            .env("XDG_CONFIG_HOME", &self.config_home)
            .stdin(Stdio::null());
        match &self.fingerprint {
            Some(f) => cmd.env("GPULAYER_FINGERPRINT", f),
            None => cmd.env_remove("GPULAYER_FINGERPRINT"),
        };
        cmd
    }

    /// Runs the CLI to completion.
    pub fn run(&self, args: &[&str]) -> CliOutput {
        let out = self.command(args).output().expect("run gpulayer");
        CliOutput {
            code: out.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }

    /// Submits `args` (everything after `submit`) and returns the new job's id.
    pub fn submit(&self, args: &[&str]) -> i64 {
        let mut full = vec!["submit", "--json"];
        full.extend_from_slice(args);
        let out = self.run(&full).success();
        out.json()["id"]
            .as_i64()
            .expect("submit --json prints an id")
    }

    /// The job's `status --json`.
    pub fn status(&self, job: i64) -> serde_json::Value {
        self.run(&["status", &job.to_string(), "--json"])
            .success()
            .json()
    }
}

/// Polls `check` every 50 ms until it returns Some, or panics with `what` after `timeout`.
pub fn wait_for<T>(what: &str, timeout: Duration, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = check() {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}
