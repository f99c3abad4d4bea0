//! `gpulayer join`: run this machine as a worker of a control plane.

use anyhow::{Context, Result, bail};
use clap::Args;
use std::collections::BTreeMap;
use std::path::PathBuf;

#[derive(Debug, Args)]
pub(crate) struct JoinArgs {
    /// The server's URL, as `gpulayer up` printed it (with its --fingerprint, the
    /// certificate the server must present).
    url: String,
    /// The join token (glj_...) that `gpulayer up` printed.
    #[arg(long, env = "GPULAYER_JOIN_TOKEN", hide_env_values = true)]
    token: String,
    /// This worker's name [default: the host name].
    #[arg(long)]
    name: Option<String>,
    /// A label for placement, KEY=VALUE (repeatable).
    #[arg(long = "label", value_name = "KEY=VALUE")]
    labels: Vec<String>,
    /// How many jobs this worker runs at once.
    #[arg(long, default_value_t = 1)]
    slots: u32,
    /// Where job work directories and the source cache live.
    /// [default: $XDG_DATA_HOME/gpulayer/worker-NAME]
    #[arg(long)]
    work_dir: Option<PathBuf>,
    /// Keep each job's work directory after it ends (for debugging).
    #[arg(long)]
    keep_work_dirs: bool,
    /// The address the other workers of a multi-node job reach this one at
    /// [default: this machine's address on the route to the server].
    #[arg(long, value_name = "ADDR")]
    advertise_addr: Option<String>,
    /// The Python interpreter jobs run with; frameworks are checked with it.
    #[arg(long, default_value = "python3")]
    python: String,
    /// Run the framework checks again instead of using cached results.
    #[arg(long)]
    refresh_checks: bool,
    /// TESTING: advertise the inventory in this JSON file instead of probing (shown as
    /// simulated). For load tests and tests of placement on hardware you do not have.
    #[arg(long, value_name = "FILE")]
    inventory: Option<PathBuf>,
    /// Print one JSON object per registration (worker_id, name, url, slots) on stdout.
    #[arg(long)]
    json: bool,
}

fn parse_labels(raw: &[String]) -> Result<BTreeMap<String, String>> {
    raw.iter()
        .map(|l| match l.split_once('=') {
            Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
            _ => bail!("label '{l}' is not KEY=VALUE (e.g. --label zone=us-east1-b)"),
        })
        .collect()
}

fn read_inventory(path: &std::path::Path) -> Result<domain::Inventory> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read --inventory {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("--inventory {} is not an inventory (the JSON `gpulayer resources detect --json` prints)", path.display()))
}

pub(crate) async fn run(args: JoinArgs) -> Result<()> {
    if args.slots == 0 {
        bail!("--slots must be at least 1");
    }
    let labels = parse_labels(&args.labels)?;
    let inventory = match &args.inventory {
        Some(path) => worker::InventorySource::Recorded(Box::new(read_inventory(path)?)),
        None => worker::InventorySource::Probe {
            python: args.python.clone(),
            refresh: args.refresh_checks,
        },
    };
    crate::settings::set_token_source(
        "--token (or GPULAYER_JOIN_TOKEN): use the join line `gpulayer up` printed",
    );
    let name = args.name.unwrap_or_else(crate::up::hostname);
    let work_root = args
        .work_dir
        .unwrap_or_else(|| crate::settings::default_data_dir().join(format!("worker-{name}")));
    std::fs::create_dir_all(&work_root)
        .with_context(|| format!("cannot create {}", work_root.display()))?;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let (url, slots, json) = (args.url.clone(), args.slots, args.json);
    let announced_name = name.clone();
    tokio::spawn(async move {
        while let Some(id) = rx.recv().await {
            if json {
                let line = serde_json::json!({"worker_id": id, "name": announced_name, "url": url, "slots": slots});
                println!("{line}");
            } else {
                println!(
                    "joined {url} as worker {id} ('{announced_name}', {slots} slot(s)); waiting for jobs (Ctrl-C to leave)"
                );
            }
        }
    });
    let fingerprint = crate::settings::fingerprint_setting(None)?;
    if fingerprint.is_none() && args.url.starts_with("https://") {
        tracing::info!(
            "no --fingerprint given: the server's certificate must be one this system trusts"
        );
    }
    let config = worker::WorkerConfig {
        url: args.url,
        token: args.token,
        fingerprint,
        name,
        labels,
        slots: args.slots,
        work_root,
        keep_work_dirs: args.keep_work_dirs,
        advertise_addr: args.advertise_addr,
        registered: Some(tx),
        inventory,
    };
    worker::run(config, crate::up::shutdown_signal()).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_are_key_value_pairs() {
        let ok =
            parse_labels(&["zone=a".into(), "gpulayer.dev/network-group=rack1".into()]).unwrap();
        assert_eq!(ok["gpulayer.dev/network-group"], "rack1");
        let err = parse_labels(&["zone".into()]).unwrap_err().to_string();
        assert_eq!(
            err,
            "label 'zone' is not KEY=VALUE (e.g. --label zone=us-east1-b)"
        );
    }
}
