//! `gpulayer up`: one API replica, with an embedded PostgreSQL when no database URL is given,
//! and optionally a worker in the same process.

use crate::settings;
use anyhow::{Context, Result};
use clap::Args;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use store::{EmbeddedPostgres, Role, Store};

#[derive(Debug, Args)]
pub(crate) struct UpArgs {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:8470")]
    listen: SocketAddr,
    /// Where the embedded PostgreSQL, the object store and the join token live.
    /// [default: $XDG_DATA_HOME/gpulayer or ~/.local/share/gpulayer]
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Use this PostgreSQL instead of the embedded one (makes this process one of several
    /// replicas sharing it).
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    database_url: Option<String>,
    /// Where sources and outputs go: s3://BUCKET[/PREFIX], gs://BUCKET[/PREFIX] or a
    /// directory [default: DATA_DIR/objects]. S3 reads the usual AWS_* variables
    /// (AWS_ENDPOINT for S3-compatible servers), GCS the GOOGLE_* ones. Replicas behind one
    /// load balancer must share it.
    #[arg(long, env = "GPULAYER_STORE")]
    store: Option<String>,
    /// Also run a worker in this process (a one-machine set-up).
    #[arg(long)]
    with_worker: bool,
    /// Slots of the --with-worker worker (jobs it runs at once).
    #[arg(long, default_value_t = 1)]
    worker_slots: u32,
    /// The Python interpreter of the --with-worker worker (jobs, framework checks and
    /// remote functions run with it).
    #[arg(long, default_value = "python3")]
    worker_python: String,
    /// Seconds without a heartbeat after which a worker is declared lost.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u64).range(1..=3600))]
    lease_seconds: u64,
    /// Days a finished job (its logs, events and outputs) is kept before it is deleted.
    #[arg(long, default_value_t = 14, value_parser = clap::value_parser!(u64).range(1..=36500))]
    retention_days: u64,
    /// Print one JSON object (url, tokens, join command) once ready, instead of prose.
    #[arg(long)]
    json: bool,
    /// A `Host` that `/mcp` accepts (repeatable; a name, or name:port) [default: loopback
    /// and this server's own address]: MCP clients in browsers are kept from a DNS-rebinding
    /// attack this way.
    #[arg(long = "mcp-allowed-host", value_name = "HOST")]
    mcp_allowed_hosts: Vec<String>,
    /// Present this PEM certificate (chain, leaf first) instead of the self-signed one made
    /// on the first start; with --tls-key.
    #[arg(long, value_name = "PEM", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The PEM private key of --tls-cert.
    #[arg(long, value_name = "PEM", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Serve plain HTTP, without TLS. Only on a loopback --listen address: anywhere else
    /// tokens would cross the network in the clear.
    #[arg(long, conflicts_with_all = ["tls_cert", "tls_key"])]
    insecure_http: bool,
}

/// Waits for Ctrl-C or SIGTERM.
pub(crate) async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("install the SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

pub(crate) async fn run(args: UpArgs) -> Result<()> {
    if args.insecure_http && !args.listen.ip().is_loopback() {
        anyhow::bail!(
            "--insecure-http is allowed only on a loopback --listen address (e.g. 127.0.0.1:8470), not {}: elsewhere tokens would cross the network in the clear (leave TLS on and pin the fingerprint `gpulayer up` prints)",
            args.listen
        );
    }
    let data_dir = args
        .data_dir
        .clone()
        .unwrap_or_else(settings::default_data_dir);
    std::fs::create_dir_all(&data_dir)
        .with_context(|| format!("cannot create {}", data_dir.display()))?;

    let (store, embedded) = match &args.database_url {
        Some(url) => {
            let options =
                Store::parse_url(url).context("--database-url is not a valid PostgreSQL URL")?;
            let store = Store::open(options)
                .await
                .context("cannot open the database given by --database-url")?;
            (store, None)
        }
        None => {
            let pg = EmbeddedPostgres::start(&data_dir.join("postgres"))
                .await
                .context("cannot start the embedded PostgreSQL")?;
            pg.ensure_database(store::embedded::EMBEDDED_DATABASE)
                .await
                .context("cannot create the gpulayer database")?;
            let store = Store::open(pg.connect_options(store::embedded::EMBEDDED_DATABASE))
                .await
                .context("cannot open the embedded database")?;
            (store, Some(pg))
        }
    };

    let objects = object_store_for(args.store.as_deref(), &data_dir)?;
    check_object_store(&objects, args.store.as_deref()).await?;

    let admin_token = if store.has_token_with_role(Role::Admin).await? {
        None
    } else {
        let secret = api::mint_secret(Role::Admin.secret_prefix());
        store.insert_token("admin", Role::Admin, &secret).await?;
        Some(secret)
    };
    let join_token = join_token(&store, &data_dir).await?;

    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("cannot listen on {} (is another `gpulayer up` running? pick another with --listen)", args.listen))?;
    let bound = listener.local_addr()?;
    let identity = if args.insecure_http {
        None
    } else {
        let given = args.tls_cert.as_deref().zip(args.tls_key.as_deref());
        Some(crate::certificate::identity(&store, given, &certificate_names(bound)).await?)
    };
    let fingerprint = identity.as_ref().map(|i| i.fingerprint);
    let scheme = if identity.is_some() { "https" } else { "http" };
    let url = format!("{scheme}://{}", public_addr(bound));
    // The certificate (not its key) beside the data, for tools that take a CA file
    // (`curl --cacert`, Python's ssl).
    let certificate_path = match &identity {
        Some(i) => {
            let path = data_dir.join("server-cert.pem");
            settings::write_private(&path, &i.certificate.certificate_pem)?;
            Some(path)
        }
        None => None,
    };

    let config_path = settings::config_path();
    let mut config = settings::read_config(&config_path).unwrap_or_default();
    config.url = Some(url.clone());
    config.fingerprint = fingerprint.map(|f| f.to_string());
    if let Some(t) = &admin_token {
        config.token = Some(t.clone());
    }
    settings::write_config(&config_path, &config)?;

    let pin_flag = fingerprint
        .map(|f| format!(" --fingerprint {f}"))
        .unwrap_or_default();
    let join_command = format!("gpulayer join {url} --token {join_token}{pin_flag}");
    if args.json {
        let ready = serde_json::json!({
            "url": url,
            "fingerprint": fingerprint.map(|f| f.to_string()),
            "tls_certificate": certificate_path,
            "admin_token": admin_token,
            "join_token": join_token,
            "join_command": join_command,
            "mcp_url": format!("{url}/mcp"),
            "config_path": config_path,
            "data_dir": data_dir,
        });
        println!("{ready}");
    } else {
        println!("GPUlayer API listening on {url}");
        match fingerprint {
            Some(f) => println!("certificate fingerprint: {f}"),
            None => println!("plain HTTP (--insecure-http): for this machine only"),
        }
        match &admin_token {
            Some(t) => println!(
                "admin token: {t}\n  (shown once; saved to {})",
                config_path.display()
            ),
            None => println!(
                "admin token: created on first start (see {})",
                config_path.display()
            ),
        }
        println!("join a worker with:\n  {join_command}");
        let pin_env = fingerprint
            .map(|f| format!(" GPULAYER_FINGERPRINT={f}"))
            .unwrap_or_default();
        println!(
            "client settings (saved to {}):\n  GPULAYER_URL={url}{pin_env} GPULAYER_TOKEN=<a token>",
            config_path.display()
        );
        println!(
            "MCP for coding agents: {url}/mcp (or `gpulayer mcp` on stdio; see docs/agents.md)"
        );
    }

    let config = api::ServerConfig {
        lease: Duration::from_secs(args.lease_seconds),
        retention: Duration::from_secs(args.retention_days * 86_400),
        secure_cookies: fingerprint.is_some(),
    };
    let state = api::AppState::new(store.clone(), objects, config);
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let worker = args.with_worker.then(|| {
        let config = worker::WorkerConfig {
            url: url.clone(),
            token: join_token.clone(),
            fingerprint,
            name: hostname(),
            labels: Default::default(),
            slots: args.worker_slots.max(1),
            work_root: data_dir.join("worker"),
            keep_work_dirs: false,
            advertise_addr: None,
            registered: None,
            inventory: worker::InventorySource::Probe {
                python: args.worker_python.clone(),
                refresh: false,
            },
        };
        let mut stop = stop_rx.clone();
        tokio::spawn(async move {
            let stopped = async move {
                let _ = stop.wait_for(|s| *s).await;
            };
            if let Err(e) = worker::run(config, stopped).await {
                tracing::error!(error = %e, "the embedded worker stopped");
            }
        })
    });
    // The server stops after the worker: a worker leaving reports its last ends and
    // deregisters through it (else the server would take it for lost a lease later).
    let (server_stop_tx, mut server_stop) = tokio::sync::watch::channel(false);
    let mcp_hosts = if args.mcp_allowed_hosts.is_empty() {
        vec![
            "localhost".into(),
            "127.0.0.1".into(),
            "::1".into(),
            public_addr(bound),
        ]
    } else {
        args.mcp_allowed_hosts.clone()
    };
    let mcp = crate::mcp::http_service(url.clone(), fingerprint, mcp_hosts, state.clone());
    let stopped = async move {
        let _ = server_stop.wait_for(|s| *s).await;
    };
    let server = match identity {
        Some(i) => {
            let tls = api::tls::TlsListener::new(listener, i.config)?;
            tokio::spawn(api::serve(tls, state, mcp, stopped))
        }
        None => tokio::spawn(api::serve(listener, state, mcp, stopped)),
    };

    shutdown_signal().await;
    tracing::info!("shutting down");
    let _ = stop_tx.send(true);
    if let Some(w) = worker {
        let _ = tokio::time::timeout(Duration::from_secs(15), w).await;
    }
    let _ = server_stop_tx.send(true);
    let _ = tokio::time::timeout(Duration::from_secs(10), server).await;
    store.close().await;
    if let Some(pg) = embedded {
        pg.stop()
            .await
            .context("cannot stop the embedded PostgreSQL")?;
    }
    Ok(())
}

/// The object store `--store` names, or a directory under the data dir.
fn object_store_for(
    url: Option<&str>,
    data_dir: &Path,
) -> Result<Arc<dyn object_store::ObjectStore>> {
    use object_store::path::Path as ObjectPath;
    use object_store::prefix::PrefixStore;
    let bad = |url: &str, e: &dyn std::fmt::Display| {
        anyhow::anyhow!(
            "--store {url}: {e} (use s3://BUCKET[/PREFIX], gs://BUCKET[/PREFIX] or a directory)"
        )
    };
    let with_prefix = |url: &str,
                       store: Arc<dyn object_store::ObjectStore>|
     -> Arc<dyn object_store::ObjectStore> {
        let path = url
            .split_once("://")
            .map(|(_, rest)| rest)
            .unwrap_or_default();
        match path.split_once('/').map(|(_, p)| p.trim_matches('/')) {
            Some(prefix) if !prefix.is_empty() => {
                Arc::new(PrefixStore::new(store, ObjectPath::from(prefix)))
            }
            _ => store,
        }
    };
    match url {
        Some(url) if url.starts_with("s3://") => {
            let s3 = object_store::aws::AmazonS3Builder::from_env()
                .with_url(url)
                .build()
                .map_err(|e| bad(url, &e))?;
            Ok(with_prefix(url, Arc::new(s3)))
        }
        Some(url) if url.starts_with("gs://") => {
            let gcs = object_store::gcp::GoogleCloudStorageBuilder::from_env()
                .with_url(url)
                .build()
                .map_err(|e| bad(url, &e))?;
            Ok(with_prefix(url, Arc::new(gcs)))
        }
        Some(url) if url.contains("://") && !url.starts_with("file://") => {
            Err(bad(url, &"unknown scheme"))
        }
        other => {
            let dir = match other {
                Some(u) => PathBuf::from(u.trim_start_matches("file://")),
                None => data_dir.join("objects"),
            };
            std::fs::create_dir_all(&dir)
                .with_context(|| format!("cannot create {}", dir.display()))?;
            let local = object_store::local::LocalFileSystem::new_with_prefix(&dir)
                .with_context(|| format!("cannot use {} as the object store", dir.display()))?;
            Ok(Arc::new(local))
        }
    }
}

/// Writes and deletes one small object, so a wrong bucket or missing credentials stop `up`
/// with a clear error instead of failing the first upload.
async fn check_object_store(
    objects: &Arc<dyn object_store::ObjectStore>,
    url: Option<&str>,
) -> Result<()> {
    use object_store::ObjectStoreExt;
    let path = object_store::path::Path::from(format!("health/{}", api::mint_secret("check-")));
    let what = url.unwrap_or("the local object store");
    objects
        .put(&path, bytes::Bytes::from_static(b"ok").into())
        .await
        .with_context(|| {
            format!("cannot write to {what} (check the bucket and the credentials)")
        })?;
    objects
        .delete(&path)
        .await
        .with_context(|| format!("cannot delete from {what}"))?;
    Ok(())
}

/// The join token kept in the data dir, so every start prints the same join line. Only its
/// hash is in the database; a token that no longer matches is replaced.
async fn join_token(store: &Store, data_dir: &Path) -> Result<String> {
    let path = data_dir.join("join-token");
    if let Ok(secret) = std::fs::read_to_string(&path) {
        let secret = secret.trim().to_string();
        if let Some(t) = store.find_token(&secret).await?
            && t.role == Role::Worker
        {
            return Ok(secret);
        }
    }
    let secret = api::mint_secret(Role::Worker.secret_prefix());
    store.insert_token("join", Role::Worker, &secret).await?;
    settings::write_private(&path, &secret)?;
    Ok(secret)
}

/// The names a self-signed certificate carries: loopback, this host, the address listened on.
fn certificate_names(bound: SocketAddr) -> Vec<String> {
    let mut names = vec!["localhost".to_string(), "127.0.0.1".into(), "::1".into()];
    names.push(hostname());
    if !bound.ip().is_unspecified() && !bound.ip().is_loopback() {
        names.push(bound.ip().to_string());
    }
    names
}

/// An address others can dial: a wildcard listen address becomes this host's name.
fn public_addr(bound: SocketAddr) -> String {
    if bound.ip().is_unspecified() {
        format!("{}:{}", hostname(), bound.port())
    } else {
        bound.to_string()
    }
}

pub(crate) fn hostname() -> String {
    nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".into())
}
