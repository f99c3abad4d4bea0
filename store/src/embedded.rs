//! The embedded default: a private PostgreSQL cluster run from the installed server binaries.
//!
//! `gpulayer up` without `--database-url` calls [`EmbeddedPostgres::start`]: it finds
//! `initdb`/`pg_ctl`, creates the cluster on first start, and runs the server listening on a
//! Unix socket only (no TCP port). PostgreSQL refuses to run as root, so under root the server
//! runs as an unprivileged user (`postgres` if it exists, else `nobody`); when that user cannot
//! enter the data directory (a home like `/root` is 0700) the cluster moves to
//! `/var/lib/gpulayer/postgres-<hash of the data dir>`.
//!
//! The server is started with `pg_ctl`, so it outlives a crashed `gpulayer`; the next start
//! finds it running and reuses it, and a stale pid file is PostgreSQL's own to clear.

use sha2::{Digest, Sha256};
use sqlx::postgres::PgConnectOptions;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

/// The superuser and database name inside the private cluster.
pub const EMBEDDED_USER: &str = "gpulayer";
pub const EMBEDDED_DATABASE: &str = "gpulayer";

/// Unix socket paths are limited to 107 bytes; past this, the socket goes under /tmp.
const MAX_SOCKET_DIR_LEN: usize = 90;

/// How long `pg_ctl` may take to start or stop the server. A first start after a crash may
/// replay WAL, which takes longer than a clean start.
const PG_CTL_TIMEOUT_SECS: u32 = 120;

#[derive(Debug, thiserror::Error)]
pub enum EmbeddedError {
    #[error(
        "no PostgreSQL server binaries found (looked for initdb and pg_ctl on PATH, in /usr/lib/postgresql/*/bin, /usr/pgsql-*/bin, Homebrew and Postgres.app): install them (Debian/Ubuntu: `apt-get install postgresql`, macOS: `brew install postgresql@17`) or pass --database-url"
    )]
    NoServerBinaries,
    #[error("cannot prepare {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "running as root, but found no unprivileged user (`postgres` or `nobody`) to run PostgreSQL as; create one or pass --database-url"
    )]
    NoUnprivilegedUser,
    #[error("{command} failed ({status}): {output}")]
    Command {
        command: String,
        status: String,
        output: String,
    },
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> EmbeddedError + '_ {
    move |source| EmbeddedError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// The OS user the server runs as when we are root.
#[derive(Debug, Clone)]
struct RunAs {
    name: String,
    uid: u32,
    gid: u32,
}

/// A running private cluster. Dropping it leaves the server running; call [`stop`](Self::stop).
#[derive(Debug, Clone)]
pub struct EmbeddedPostgres {
    bin_dir: PathBuf,
    cluster_dir: PathBuf,
    socket_dir: PathBuf,
    run_as: Option<RunAs>,
}

impl EmbeddedPostgres {
    /// Starts (creating on first use) the cluster that belongs to `data_dir`, or attaches to it
    /// if it is already running.
    pub async fn start(data_dir: &Path) -> Result<Self, EmbeddedError> {
        let data_dir = data_dir.to_path_buf();
        tokio::task::spawn_blocking(move || Self::start_blocking(&data_dir))
            .await
            .expect("the start task does not panic")
    }

    fn start_blocking(data_dir: &Path) -> Result<Self, EmbeddedError> {
        std::fs::create_dir_all(data_dir).map_err(io_err(data_dir))?;
        let data_dir = data_dir.canonicalize().map_err(io_err(data_dir))?;
        let bin_dir = find_server_binaries().ok_or(EmbeddedError::NoServerBinaries)?;
        let run_as = if nix::unistd::geteuid().is_root() {
            Some(unprivileged_user()?)
        } else {
            None
        };
        let cluster_dir = match &run_as {
            Some(user) if !user_can_enter(user, &data_dir) => relocated_cluster_dir(&data_dir),
            _ => data_dir.join("cluster"),
        };
        // Tests and operators find the real location here, wherever it ended up.
        let pointer = data_dir.join("cluster.path");
        std::fs::write(&pointer, cluster_dir.to_string_lossy().as_bytes())
            .map_err(io_err(&pointer))?;
        let socket_dir = if cluster_dir.as_os_str().len() > MAX_SOCKET_DIR_LEN {
            PathBuf::from(format!("/tmp/gpulayer-pg-{}", short_hash(&cluster_dir)))
        } else {
            cluster_dir.clone()
        };
        let pg = Self {
            bin_dir,
            cluster_dir,
            socket_dir,
            run_as,
        };
        pg.init_if_missing()?;
        pg.start_if_stopped()?;
        Ok(pg)
    }

    /// Options for connecting to `database` in this cluster over its socket.
    pub fn connect_options(&self, database: &str) -> PgConnectOptions {
        PgConnectOptions::new()
            .socket(&self.socket_dir)
            .username(EMBEDDED_USER)
            .database(database)
    }

    /// A `postgres://` URL for `database`, for handing to another process.
    pub fn url(&self, database: &str) -> String {
        format!(
            "postgres://{EMBEDDED_USER}@localhost/{database}?host={}",
            self.socket_dir.display()
        )
    }

    /// Creates `database` unless it exists.
    pub async fn ensure_database(&self, database: &str) -> Result<(), sqlx::Error> {
        use sqlx::{ConnectOptions, Connection};
        let mut conn = self.connect_options("postgres").connect().await?;
        let exists: bool =
            sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)")
                .bind(database)
                .fetch_one(&mut conn)
                .await?;
        if !exists {
            // Identifiers cannot be bound as parameters; quote it as one.
            let sql = format!("CREATE DATABASE \"{}\"", database.replace('"', "\"\""));
            match sqlx::query(sqlx::AssertSqlSafe(sql))
                .execute(&mut conn)
                .await
            {
                Ok(_) => {}
                // Someone else created it between our check and our create.
                Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("42P04") => {}
                Err(e) => return Err(e),
            }
        }
        conn.close().await
    }

    pub fn cluster_dir(&self) -> &Path {
        &self.cluster_dir
    }

    /// Stops the server (fast shutdown: open transactions roll back, nothing committed is lost).
    pub async fn stop(&self) -> Result<(), EmbeddedError> {
        let pg = self.clone();
        tokio::task::spawn_blocking(move || {
            pg.pg_ctl(&[
                "stop",
                "-m",
                "fast",
                "-w",
                "-t",
                &PG_CTL_TIMEOUT_SECS.to_string(),
            ])
        })
        .await
        .expect("the stop task does not panic")
    }

    fn init_if_missing(&self) -> Result<(), EmbeddedError> {
        if self.cluster_dir.join("PG_VERSION").exists() {
            return Ok(());
        }
        // initdb into a fresh directory beside the final one, then rename: a crash half way
        // leaves no half-made cluster where the next start would look.
        let parent = self.cluster_dir.parent().expect("cluster dir has a parent");
        std::fs::create_dir_all(parent).map_err(io_err(parent))?;
        let staging = parent.join(format!(
            ".{}.initdb-{}",
            self.cluster_dir
                .file_name()
                .unwrap_or_default()
                .to_string_lossy(),
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&staging);
        self.make_private_dir(&staging)?;
        let initdb = self.bin_dir.join("initdb");
        self.run(
            &initdb,
            &[
                "-D",
                &staging.to_string_lossy(),
                "--username",
                EMBEDDED_USER,
                "--auth",
                "trust",
                "--encoding",
                "UTF8",
                "--no-locale",
                "--no-sync",
            ],
        )?;
        // Unix socket only: nothing listens on TCP, and only this OS user can reach the socket.
        let conf = staging.join("postgresql.conf");
        let extra = "\n# Written by gpulayer: private cluster, Unix socket only.\n\
                     listen_addresses = ''\n\
                     unix_socket_permissions = 0700\n\
                     max_connections = 300\n";
        let mut text = std::fs::read_to_string(&conf).map_err(io_err(&conf))?;
        text.push_str(extra);
        std::fs::write(&conf, text).map_err(io_err(&conf))?;
        std::fs::rename(&staging, &self.cluster_dir).map_err(io_err(&self.cluster_dir))?;
        Ok(())
    }

    fn start_if_stopped(&self) -> Result<(), EmbeddedError> {
        self.remove_stale_lock_files();
        if self.is_running() {
            return Ok(());
        }
        if self.socket_dir != self.cluster_dir {
            self.make_private_dir(&self.socket_dir)?;
        }
        let log = self.cluster_dir.join("server.log");
        // pg_ctl hands -o to a shell: quote the directory.
        let mut options = format!("-k '{}'", self.socket_dir.display());
        // Extra server settings for operators (`-c work_mem=64MB ...`), passed through as is.
        if let Ok(extra) = std::env::var("GPULAYER_POSTGRES_OPTIONS") {
            options.push(' ');
            options.push_str(&extra);
        }
        self.pg_ctl(&[
            "start",
            "-w",
            "-t",
            &PG_CTL_TIMEOUT_SECS.to_string(),
            "-l",
            &log.to_string_lossy(),
            "-o",
            &options,
        ])
    }

    /// After a crash the server's lock files name a process that is gone. PostgreSQL clears
    /// them itself when that pid is free, but not when it is a zombie nobody has reaped yet
    /// (containers whose PID 1 reaps slowly): a zombie runs nothing, so its locks go.
    fn remove_stale_lock_files(&self) {
        let locks = [
            self.cluster_dir.join("postmaster.pid"),
            self.socket_dir.join(".s.PGSQL.5432.lock"),
        ];
        for lock in locks {
            let Ok(text) = std::fs::read_to_string(&lock) else {
                continue;
            };
            let Some(pid) = text
                .lines()
                .next()
                .and_then(|l| l.trim().parse::<i32>().ok())
            else {
                continue;
            };
            if !process_runs(pid.abs()) {
                tracing::warn!(lock = %lock.display(), pid, "removing a stale PostgreSQL lock file");
                let _ = std::fs::remove_file(&lock);
            }
        }
    }

    fn is_running(&self) -> bool {
        // `pg_ctl status` exits 0 only when the pid file names a live postmaster.
        self.pg_ctl(&["status"]).is_ok()
    }

    fn pg_ctl(&self, args: &[&str]) -> Result<(), EmbeddedError> {
        let mut full = vec!["-D", self.cluster_dir.to_str().unwrap_or_default()];
        full.extend_from_slice(args);
        self.run(&self.bin_dir.join("pg_ctl"), &full)
    }

    /// Creates `dir` as 0700, owned by the user the server runs as.
    fn make_private_dir(&self, dir: &Path) -> Result<(), EmbeddedError> {
        std::fs::create_dir_all(dir).map_err(io_err(dir))?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
            .map_err(io_err(dir))?;
        if let Some(user) = &self.run_as {
            nix::unistd::chown(
                dir,
                Some(nix::unistd::Uid::from_raw(user.uid)),
                Some(nix::unistd::Gid::from_raw(user.gid)),
            )
            .map_err(|e| EmbeddedError::Io {
                path: dir.to_path_buf(),
                source: e.into(),
            })?;
        }
        Ok(())
    }

    fn run(&self, program: &Path, args: &[&str]) -> Result<(), EmbeddedError> {
        use std::os::unix::process::CommandExt;
        let mut cmd = std::process::Command::new(program);
        cmd.args(args)
            .current_dir("/")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .env("LC_ALL", "C");
        if let Some(user) = &self.run_as {
            cmd.uid(user.uid)
                .gid(user.gid)
                .env("USER", &user.name)
                .env("HOME", "/");
        }
        // pg_ctl start hands its stdout to the server when -l is absent; with -l it returns.
        let out = cmd.output().map_err(io_err(program))?;
        if out.status.success() {
            return Ok(());
        }
        let mut output = String::from_utf8_lossy(&out.stderr).trim().to_string();
        if output.is_empty() {
            output = String::from_utf8_lossy(&out.stdout).trim().to_string();
        }
        let log = self.cluster_dir.join("server.log");
        if let Ok(text) = std::fs::read_to_string(&log) {
            let tail: Vec<&str> = text.lines().rev().take(5).collect();
            if !tail.is_empty() {
                output.push_str(&format!(
                    "; last lines of {}: {}",
                    log.display(),
                    tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
                ));
            }
        }
        Err(EmbeddedError::Command {
            command: format!("{} {}", program.display(), args.join(" ")),
            status: out.status.to_string(),
            output,
        })
    }
}

/// Where PostgreSQL server binaries are usually installed, each a folder of versioned
/// installs: Debian/Ubuntu, Homebrew (Intel and Apple Silicon), Postgres.app, RHEL's PGDG.
const SEARCH_ROOTS: &[&str] = &[
    "/usr/lib/postgresql",
    "/usr/local/opt",
    "/opt/homebrew/opt",
    "/Applications/Postgres.app/Contents/Versions",
    "/usr",
];

/// Finds a directory holding `initdb`, `pg_ctl` and `postgres`: PATH first, then the usual
/// places, newest version first.
pub fn find_server_binaries() -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let roots: Vec<PathBuf> = SEARCH_ROOTS.iter().map(PathBuf::from).collect();
    find_server_binaries_in(&path, &roots)
}

fn find_server_binaries_in(path: &std::ffi::OsStr, roots: &[PathBuf]) -> Option<PathBuf> {
    let complete = |dir: &Path| {
        ["initdb", "pg_ctl", "postgres"]
            .iter()
            .all(|b| dir.join(b).is_file())
    };
    for dir in std::env::split_paths(path) {
        if let Ok(real) = dir.join("pg_ctl").canonicalize() {
            // Debian links pg_ctl into PATH; its siblings live beside the link's target.
            if let Some(real_dir) = real.parent().filter(|d| complete(d)) {
                return Some(real_dir.to_path_buf());
            }
        }
    }
    let mut found: Vec<PathBuf> = Vec::new();
    for root in roots {
        let Ok(entries) = std::fs::read_dir(root) else {
            continue;
        };
        let versioned_root = root.ends_with("postgresql") || root.ends_with("Versions");
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().to_string();
            let wanted =
                versioned_root || name.starts_with("postgresql") || name.starts_with("pgsql");
            let bin = entry.path().join("bin");
            if wanted && complete(&bin) {
                found.push(bin);
            }
        }
    }
    // Highest version number wins (`/usr/lib/postgresql/17` over `/15`).
    found.sort_by_key(|p| {
        p.to_string_lossy()
            .split(|c: char| !c.is_ascii_digit())
            .filter_map(|n| n.parse::<u32>().ok())
            .collect::<Vec<_>>()
    });
    found.pop()
}

/// Whether `pid` is a live (not zombie) process.
fn process_runs(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the parenthesised command name.
        Ok(stat) => {
            stat.rsplit(')')
                .next()
                .and_then(|r| r.split_whitespace().next())
                != Some("Z")
        }
        // No /proc (macOS): ask the kernel; a zombie is rare enough there to ignore.
        Err(_) if !Path::new("/proc/self").exists() => {
            nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_ok()
        }
        Err(_) => false,
    }
}

fn unprivileged_user() -> Result<RunAs, EmbeddedError> {
    for name in ["postgres", "nobody"] {
        if let Ok(Some(user)) = nix::unistd::User::from_name(name) {
            return Ok(RunAs {
                name: name.to_string(),
                uid: user.uid.as_raw(),
                gid: user.gid.as_raw(),
            });
        }
    }
    Err(EmbeddedError::NoUnprivilegedUser)
}

/// Whether `user` can reach `dir`: execute on it and every ancestor. It need not write there:
/// the cluster directory is created by us and handed to the user. Decided from mode bits
/// (ACLs are rare on data dirs).
fn user_can_enter(user: &RunAs, dir: &Path) -> bool {
    let allows = |path: &Path, bit: u32| {
        let Ok(meta) = std::fs::metadata(path) else {
            return false;
        };
        let mode = meta.mode();
        if meta.uid() == user.uid {
            mode & (bit << 6) != 0
        } else if meta.gid() == user.gid {
            mode & (bit << 3) != 0
        } else {
            mode & bit != 0
        }
    };
    dir.ancestors().all(|a| allows(a, 0o1))
}

fn relocated_cluster_dir(data_dir: &Path) -> PathBuf {
    PathBuf::from("/var/lib/gpulayer").join(format!("postgres-{}", short_hash(data_dir)))
}

fn short_hash(path: &Path) -> String {
    let digest = Sha256::digest(path.as_os_str().as_encoded_bytes());
    hex::encode(&digest[..8])
}

/// Waits until `options` accepts connections, for clusters started by someone else.
pub async fn wait_until_ready(
    options: &PgConnectOptions,
    timeout: Duration,
) -> Result<(), sqlx::Error> {
    use sqlx::ConnectOptions;
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        match options.connect().await {
            Ok(_) => return Ok(()),
            Err(e) if tokio::time::Instant::now() >= deadline => return Err(e),
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_installed_server_binaries_are_found() {
        // Every machine that builds GPUlayer has them: scripts/test installs them.
        let bin = find_server_binaries().expect("PostgreSQL server binaries are installed");
        assert!(bin.join("initdb").is_file(), "{}", bin.display());
    }

    #[test]
    fn a_user_enters_a_directory_only_through_executable_ancestors() {
        use std::os::unix::fs::PermissionsExt;
        let nobody = RunAs {
            name: "nobody".into(),
            uid: 65534,
            gid: 65534,
        };
        let top = tempfile::tempdir().unwrap();
        let inner = top.path().join("inner");
        std::fs::create_dir(&inner).unwrap();
        for (mode, expect) in [(0o700, false), (0o711, true), (0o755, true)] {
            std::fs::set_permissions(top.path(), std::fs::Permissions::from_mode(mode)).unwrap();
            let parents_open = top.path().ancestors().skip(1).all(|a| {
                std::fs::metadata(a)
                    .map(|m| m.permissions().mode() & 0o001 != 0)
                    .unwrap_or(false)
            });
            if !parents_open {
                eprintln!(
                    "skipped: an ancestor of {} is closed to others",
                    top.path().display()
                );
                return;
            }
            assert_eq!(user_can_enter(&nobody, &inner), expect, "mode {mode:o}");
        }
    }

    fn fake_install(dir: &Path) {
        std::fs::create_dir_all(dir).unwrap();
        for b in ["initdb", "pg_ctl", "postgres"] {
            std::fs::write(dir.join(b), "").unwrap();
        }
    }

    #[test]
    fn the_newest_install_in_the_usual_places_wins_and_none_is_none() {
        let root = tempfile::tempdir().unwrap();
        let debian = root.path().join("postgresql");
        fake_install(&debian.join("13/bin"));
        fake_install(&debian.join("16/bin"));
        std::fs::create_dir_all(debian.join("17/bin")).unwrap(); // incomplete: ignored
        let brew = root.path().join("opt");
        fake_install(&brew.join("postgresql@9/bin"));
        std::fs::create_dir_all(brew.join("unrelated/bin")).unwrap();
        let empty_path = std::ffi::OsStr::new("");
        assert_eq!(
            find_server_binaries_in(empty_path, &[debian.clone(), brew.clone()]),
            Some(debian.join("16/bin"))
        );
        assert_eq!(
            find_server_binaries_in(empty_path, std::slice::from_ref(&brew)),
            Some(brew.join("postgresql@9/bin"))
        );
        assert_eq!(
            find_server_binaries_in(empty_path, &[root.path().join("nothing")]),
            None
        );
        let msg = EmbeddedError::NoServerBinaries.to_string();
        assert!(
            msg.contains("apt-get install postgresql") && msg.contains("--database-url"),
            "{msg}"
        );
    }

    #[test]
    fn server_binaries_on_path_are_found_first() {
        let root = tempfile::tempdir().unwrap();
        let on_path = root.path().join("bin");
        fake_install(&on_path);
        let other = root.path().join("postgresql");
        fake_install(&other.join("99/bin"));
        let path = std::env::join_paths([root.path().join("missing"), on_path.clone()]).unwrap();
        let found = find_server_binaries_in(&path, &[other]).unwrap();
        assert_eq!(found, on_path.canonicalize().unwrap());
    }

    #[test]
    fn relocated_clusters_are_stable_per_data_dir() {
        let a = relocated_cluster_dir(Path::new("/root/.local/share/gpulayer"));
        let b = relocated_cluster_dir(Path::new("/root/.local/share/gpulayer"));
        let c = relocated_cluster_dir(Path::new("/root/other"));
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert!(a.starts_with("/var/lib/gpulayer"));
    }
}
