//! `gpulayer resources`: every worker's devices, frameworks (usable, or why not), labels and
//! what is free; `gpulayer resources detect`: the same probe on this machine, no server.

use crate::table;
use anyhow::Result;
use clap::{Args, Subcommand};
use domain::{FrameworkCheck, Inventory};

#[derive(Debug, Args)]
pub(crate) struct ResourcesArgs {
    #[command(subcommand)]
    command: Option<ResourcesCommand>,
    /// Print JSON.
    #[arg(long, global = true)]
    json: bool,
}

#[derive(Debug, Subcommand)]
enum ResourcesCommand {
    /// Probe this machine: CPUs, memory, GPUs, interconnect, and framework checks.
    Detect {
        /// The Python interpreter to check frameworks with (the one your jobs use).
        #[arg(long, default_value = "python3")]
        python: String,
        /// Run the framework checks again instead of using cached results.
        #[arg(long)]
        refresh: bool,
    },
}

fn framework_line(c: &FrameworkCheck) -> String {
    let name = c.name();
    let version = c
        .version
        .as_deref()
        .map(|v| format!(" {v}"))
        .unwrap_or_default();
    if c.usable {
        format!("{name}{version}: usable")
    } else {
        format!(
            "{name}{version}: not usable: {}",
            c.reason.as_deref().unwrap_or("unknown")
        )
    }
}

/// The inventory as indented lines under a worker's heading.
fn print_inventory(inv: &Inventory, busy: &[u32]) {
    println!(
        "  host: {} ({} {}), {} CPUs, {} memory{}",
        inv.hostname,
        inv.os,
        inv.arch,
        inv.cpus,
        table::bytes(inv.memory_bytes),
        if inv.simulated {
            ", SIMULATED inventory"
        } else {
            ""
        }
    );
    if let Some(driver) = &inv.driver_version {
        println!(
            "  nvidia driver {driver}, CUDA {}",
            inv.cuda_version.as_deref().unwrap_or("?")
        );
    }
    if inv.devices.is_empty() {
        println!("  devices: none (cpu only)");
    }
    for d in &inv.devices {
        let memory = d
            .memory_bytes
            .map(table::bytes)
            .unwrap_or_else(|| "?".into());
        let cc = d
            .compute_capability
            .as_deref()
            .map(|c| format!(", sm {c}"))
            .unwrap_or_default();
        let state = if busy.contains(&d.index) {
            "busy"
        } else {
            "free"
        };
        println!(
            "  {}:{}  {}  {memory}{cc}  {state}",
            d.kind, d.index, d.name
        );
    }
    if let Some(t) = &inv.topology {
        let cells: Vec<String> = (0..t.gpus())
            .map(|i| {
                (0..t.gpus())
                    .map(|j| format!("{:>5}", t.link(i, j).to_string()))
                    .collect::<String>()
            })
            .collect();
        println!("  interconnect:");
        for (i, row) in cells.iter().enumerate() {
            println!("    GPU{i}{row}");
        }
    }
    if inv.frameworks.is_empty() {
        println!("  frameworks: not checked");
    }
    for c in &inv.frameworks {
        println!("  {}", framework_line(c));
    }
}

pub(crate) async fn run(args: ResourcesArgs) -> Result<()> {
    match args.command {
        Some(ResourcesCommand::Detect { python, refresh }) => {
            let cache = crate::settings::default_data_dir().join("framework-checks.json");
            let inventory = worker::detect(&python, refresh, Some(cache)).await;
            if args.json {
                println!("{}", serde_json::to_string_pretty(&inventory)?);
            } else {
                println!("this machine ({})", inventory.hostname);
                print_inventory(&inventory, &[]);
            }
            Ok(())
        }
        None => {
            let Some(list) = crate::jobs::worker_list(args.json).await? else {
                return Ok(());
            };
            for w in list.workers.iter().filter(|w| w.state != "stopped") {
                let labels = if w.labels.is_empty() {
                    String::new()
                } else {
                    let l: Vec<String> = w.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
                    format!("  labels: {}", l.join(", "))
                };
                println!(
                    "{} (worker {})  {}  {}/{} slots busy{labels}",
                    w.name, w.id, w.state, w.busy_slots, w.slots
                );
                print_inventory(&w.inventory, &w.busy_devices);
            }
            Ok(())
        }
    }
}
