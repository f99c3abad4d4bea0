//! How a job spreads over machines: how many nodes, how many processes on each, how far
//! apart its nodes may be; where a worker is (its locality labels); and the environment each
//! process of a multi-process job starts with (torchrun's, without torchrun).

use crate::SpecError;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;

/// More nodes than this in one job is a typo.
pub const MAX_NODES: u32 = 1024;
/// More processes than this on one node is a typo.
pub const MAX_PROCS_PER_NODE: u32 = 1024;

/// The label that puts workers in one rack or fabric (the closest locality).
pub const NETWORK_GROUP_LABEL: &str = "gpulayer.dev/network-group";
/// The label for a worker's cloud zone (`europe-west1-b`).
pub const ZONE_LABEL: &str = "zone";
/// The label for a worker's cloud region (`europe-west1`); derived from the zone if absent.
pub const REGION_LABEL: &str = "region";

/// Nodes × processes, and how far apart the nodes may be.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Layout {
    #[serde(default = "one")]
    pub nodes: u32,
    #[serde(default = "one")]
    pub procs_per_node: u32,
    #[serde(default)]
    pub spread: Spread,
}

fn one() -> u32 {
    1
}

impl Default for Layout {
    fn default() -> Self {
        Self {
            nodes: 1,
            procs_per_node: 1,
            spread: Spread::default(),
        }
    }
}

impl Layout {
    /// A job whose nodes must all be placed at once.
    pub fn is_gang(&self) -> bool {
        self.nodes > 1
    }

    /// A job with more than one process in all: its processes get ranks and a rendezvous.
    pub fn is_distributed(&self) -> bool {
        self.nodes > 1 || self.procs_per_node > 1
    }

    pub fn world_size(&self) -> u32 {
        self.nodes * self.procs_per_node
    }

    pub fn check(&self) -> Result<(), SpecError> {
        if !(1..=MAX_NODES).contains(&self.nodes) {
            return Err(SpecError::Inconsistent(format!(
                "--nodes must be between 1 and {MAX_NODES}, not {}",
                self.nodes
            )));
        }
        if !(1..=MAX_PROCS_PER_NODE).contains(&self.procs_per_node) {
            return Err(SpecError::Inconsistent(format!(
                "--procs-per-node must be between 1 and {MAX_PROCS_PER_NODE}, not {}",
                self.procs_per_node
            )));
        }
        Ok(())
    }
}

/// The widest locality a job's nodes may be split across. Nodes are kept as close as the
/// fleet allows (one network group, else one zone, else one region) whatever this says; it
/// only says where to stop.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Spread {
    /// Across zones of one region, never across regions (splitting a job across regions
    /// cost the reference system 16–24% of its speed).
    #[default]
    Zone,
    /// Across regions too, when no single region has enough workers.
    Region,
}

impl Spread {
    pub fn parse(s: &str) -> Result<Self, SpecError> {
        match s {
            "zone" => Ok(Self::Zone),
            "region" => Ok(Self::Region),
            other => Err(SpecError::Inconsistent(format!(
                "--spread '{other}' is not zone or region (how far apart a job's nodes may be)"
            ))),
        }
    }
}

impl fmt::Display for Spread {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Zone => "zone",
            Self::Region => "region",
        })
    }
}

/// Where a worker is, from its labels: unknown parts are None.
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct Locality {
    pub network_group: Option<String>,
    pub zone: Option<String>,
    pub region: Option<String>,
}

impl Locality {
    /// Reads the locality labels. A region not given is derived from a cloud zone name
    /// (`europe-west1-b` is in `europe-west1`).
    pub fn of(labels: &BTreeMap<String, String>) -> Self {
        let get = |k: &str| labels.get(k).filter(|v| !v.is_empty()).cloned();
        let zone = get(ZONE_LABEL);
        let region = get(REGION_LABEL).or_else(|| zone.as_deref().and_then(region_of_zone));
        Self {
            network_group: get(NETWORK_GROUP_LABEL),
            zone,
            region,
        }
    }
}

/// `europe-west1-b` → `europe-west1`; None for names not shaped like a cloud zone.
pub fn region_of_zone(zone: &str) -> Option<String> {
    let (region, suffix) = zone.rsplit_once('-')?;
    (suffix.len() == 1 && suffix.chars().all(|c| c.is_ascii_lowercase()) && region.contains('-'))
        .then(|| region.to_string())
}

/// What one process of a distributed job is: its ranks and where the rendezvous is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessPlace<'a> {
    /// The job id, which names the run (`TORCHELASTIC_RUN_ID`).
    pub run_id: &'a str,
    pub layout: Layout,
    pub node_rank: u32,
    pub local_rank: u32,
    /// An address of node 0 that the other nodes reach, and a port free there.
    pub master_addr: &'a str,
    pub master_port: u16,
    /// How many times the whole job was started again before this attempt.
    pub restart_count: u32,
    pub max_restarts: u32,
}

impl ProcessPlace<'_> {
    pub fn global_rank(&self) -> u32 {
        self.node_rank * self.layout.procs_per_node + self.local_rank
    }

    /// The variables torchrun's agent gives each process (torch 2.15,
    /// `local_elastic_agent.py`), plus `NODE_RANK`, and `OMP_NUM_THREADS=1` when the job did
    /// not set it and a node runs several processes (as torchrun does). Never
    /// `TORCHELASTIC_USE_AGENT_STORE=True`: rank 0 hosts the store itself, as no agent does.
    /// `job_env` is what the job set itself; its names are left alone.
    pub fn env(&self, job_env: &dyn Fn(&str) -> bool) -> Vec<(&'static str, String)> {
        let l = self.layout;
        let mut env = vec![
            ("RANK", self.global_rank().to_string()),
            ("LOCAL_RANK", self.local_rank.to_string()),
            ("WORLD_SIZE", l.world_size().to_string()),
            ("LOCAL_WORLD_SIZE", l.procs_per_node.to_string()),
            ("GROUP_RANK", self.node_rank.to_string()),
            ("GROUP_WORLD_SIZE", l.nodes.to_string()),
            ("ROLE_RANK", self.global_rank().to_string()),
            ("ROLE_NAME", "default".to_string()),
            ("ROLE_WORLD_SIZE", l.world_size().to_string()),
            ("NODE_RANK", self.node_rank.to_string()),
            ("MASTER_ADDR", self.master_addr.to_string()),
            ("MASTER_PORT", self.master_port.to_string()),
            ("TORCHELASTIC_RUN_ID", self.run_id.to_string()),
            ("TORCHELASTIC_RESTART_COUNT", self.restart_count.to_string()),
            ("TORCHELASTIC_MAX_RESTARTS", self.max_restarts.to_string()),
            ("TORCHELASTIC_USE_AGENT_STORE", "False".to_string()),
        ];
        if !job_env("TORCH_NCCL_ASYNC_ERROR_HANDLING") {
            env.push(("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1".to_string()));
        }
        if l.procs_per_node > 1 && !job_env("OMP_NUM_THREADS") {
            env.push(("OMP_NUM_THREADS", "1".to_string()));
        }
        env
    }
}

/// Variables a distributed job's processes get from GPUlayer; the job may not set them.
pub const RANK_ENV: &[&str] = &[
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_RANK",
    "ROLE_NAME",
    "ROLE_WORLD_SIZE",
    "NODE_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS",
    "TORCHELASTIC_USE_AGENT_STORE",
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_are_checked() {
        let cases = [
            (1, 1, Ok(())),
            (4, 8, Ok(())),
            (0, 1, Err("--nodes must be between 1 and 1024, not 0")),
            (
                1,
                0,
                Err("--procs-per-node must be between 1 and 1024, not 0"),
            ),
            (2000, 1, Err("--nodes must be between 1 and 1024, not 2000")),
        ];
        for (nodes, procs_per_node, expect) in cases {
            let got = Layout {
                nodes,
                procs_per_node,
                spread: Spread::Zone,
            }
            .check()
            .map_err(|e| e.to_string());
            assert_eq!(
                got,
                expect.map_err(str::to_string),
                "{nodes}x{procs_per_node}"
            );
        }
        assert!(Spread::parse("rack").is_err());
        assert_eq!(Spread::parse("region"), Ok(Spread::Region));
    }

    #[test]
    fn a_missing_region_comes_from_the_zone_name() {
        let labels = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let l = Locality::of(&labels(&[("zone", "europe-west1-b")]));
        assert_eq!(l.region.as_deref(), Some("europe-west1"));
        let l = Locality::of(&labels(&[("zone", "rack-3"), (NETWORK_GROUP_LABEL, "ib0")]));
        assert_eq!((l.region, l.network_group.as_deref()), (None, Some("ib0")));
        let l = Locality::of(&labels(&[("zone", "us-east1-c"), ("region", "mine")]));
        assert_eq!(l.region.as_deref(), Some("mine"));
        assert_eq!(Locality::of(&labels(&[])), Locality::default());
    }

    #[test]
    fn every_process_gets_torchruns_environment() {
        let place = ProcessPlace {
            run_id: "42",
            layout: Layout {
                nodes: 2,
                procs_per_node: 2,
                spread: Spread::Zone,
            },
            node_rank: 1,
            local_rank: 1,
            master_addr: "10.0.0.5",
            master_port: 29500,
            restart_count: 0,
            max_restarts: 3,
        };
        let env: BTreeMap<&str, String> = place.env(&|_| false).into_iter().collect();
        let expect = [
            ("RANK", "3"),
            ("LOCAL_RANK", "1"),
            ("WORLD_SIZE", "4"),
            ("LOCAL_WORLD_SIZE", "2"),
            ("GROUP_RANK", "1"),
            ("GROUP_WORLD_SIZE", "2"),
            ("ROLE_RANK", "3"),
            ("ROLE_NAME", "default"),
            ("ROLE_WORLD_SIZE", "4"),
            ("NODE_RANK", "1"),
            ("MASTER_ADDR", "10.0.0.5"),
            ("MASTER_PORT", "29500"),
            ("TORCHELASTIC_RUN_ID", "42"),
            ("TORCHELASTIC_RESTART_COUNT", "0"),
            ("TORCHELASTIC_MAX_RESTARTS", "3"),
            ("TORCHELASTIC_USE_AGENT_STORE", "False"),
            ("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"),
            ("OMP_NUM_THREADS", "1"),
        ];
        assert_eq!(env.len(), expect.len(), "{env:?}");
        for (k, v) in expect {
            assert_eq!(env.get(k).map(String::as_str), Some(v), "{k}");
        }
        // What the job set itself stays the job's.
        let own = place.env(&|name| name == "OMP_NUM_THREADS");
        assert!(own.iter().all(|(k, _)| *k != "OMP_NUM_THREADS"));
        // Every variable set is one the job may not set itself (but the two it may).
        for (k, _) in place.env(&|_| false) {
            assert!(
                RANK_ENV.contains(&k)
                    || ["TORCH_NCCL_ASYNC_ERROR_HANDLING", "OMP_NUM_THREADS"].contains(&k),
                "{k}"
            );
        }
    }
}
