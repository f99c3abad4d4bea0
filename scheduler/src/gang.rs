//! Placing a multi-node job (a gang): all of its nodes at once or none, as close together as
//! the fleet allows.
//!
//! Locality, closest first: one network group (`gpulayer.dev/network-group`), one zone, one
//! region; across regions only when the job allows it (`--spread region`). Among the groups
//! at the closest level that has enough eligible workers, the one with the most workers free
//! now wins; within it, free workers come first, then those already kept for this gang, then
//! the least loaded.
//!
//! The starvation policy: a gang that cannot start now keeps (reserves) the workers it chose,
//! which then take no other work, so a stream of small jobs cannot hold it off; it starts as
//! soon as all of them are free. Only the gang first in the queue reserves, so two gangs never
//! hold parts of the fleet each.

use crate::place::{Verdict, WorkerView, eligibility, fit_now};
use domain::{JobSpec, Locality, Spread, WorkerId};
use std::collections::BTreeMap;
use std::fmt;

/// How close a gang's nodes are.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Closeness {
    NetworkGroup(String),
    Zone(String),
    Region(String),
    /// No worker carries locality labels: nothing to choose by.
    Unlabelled,
    /// Across regions (allowed by `--spread region`).
    AcrossRegions,
}

impl fmt::Display for Closeness {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Closeness::NetworkGroup(g) => write!(f, "in network group {g}"),
            Closeness::Zone(z) => write!(f, "in zone {z}"),
            Closeness::Region(r) => write!(f, "in region {r}"),
            Closeness::Unlabelled => f.write_str("on workers without locality labels"),
            Closeness::AcrossRegions => f.write_str("across regions (--spread region)"),
        }
    }
}

/// What to do with a gang now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GangDecision {
    /// Start now: node i on `nodes[i]`, with those devices.
    Place {
        nodes: Vec<(WorkerId, Vec<u32>)>,
        closeness: Closeness,
        why: String,
    },
    /// Keep these workers for the gang until all are free (`busy` of them are not yet).
    Reserve {
        workers: Vec<WorkerId>,
        busy: usize,
        closeness: Closeness,
        why: String,
    },
    /// Not on this fleet as it is (too few eligible workers, or none close enough).
    Unplaceable { verdicts: Vec<Verdict>, why: String },
}

/// Decides for the gang `spec` on `workers`. `reserved` are the workers already kept for it.
pub fn place_gang(workers: &[WorkerView], spec: &JobSpec, reserved: &[WorkerId]) -> GangDecision {
    let nodes = spec.layout.nodes as usize;
    let verdicts = eligibility(workers, spec);
    let eligible: Vec<&WorkerView> = workers
        .iter()
        .filter(|w| w.online)
        .zip(&verdicts)
        .filter(|(_, v)| v.reason.is_none())
        .map(|(w, _)| w)
        .collect();
    if eligible.len() < nodes {
        return GangDecision::Unplaceable {
            why: format!("needs {nodes} nodes, {} eligible worker(s)", eligible.len()),
            verdicts,
        };
    }
    let Some((closeness, group)) = closest_group(&eligible, nodes, spec.layout.spread, reserved)
    else {
        return GangDecision::Unplaceable {
            why: format!(
                "needs {nodes} nodes in one region, and no region has {nodes} eligible workers \
                 (--spread region allows splitting across regions)"
            ),
            verdicts,
        };
    };
    let mut ranked: Vec<(&WorkerView, Option<Vec<u32>>)> =
        group.iter().map(|w| (*w, fit_now(w, spec).ok())).collect();
    ranked.sort_by_key(|(w, free)| {
        (
            free.is_none(),
            !reserved.contains(&w.id),
            w.busy_slots * 1000 / w.slots.max(1),
            w.name.clone(),
        )
    });
    ranked.truncate(nodes);
    let busy = ranked.iter().filter(|(_, free)| free.is_none()).count();
    let size = group.len();
    if busy == 0 {
        let why = format!("{nodes} nodes {closeness} ({size} eligible there)");
        GangDecision::Place {
            nodes: ranked
                .into_iter()
                .map(|(w, devices)| (w.id, devices.unwrap_or_default()))
                .collect(),
            closeness,
            why,
        }
    } else {
        let why =
            format!("waiting for {busy} of the {nodes} nodes kept for it {closeness} to free up");
        GangDecision::Reserve {
            workers: ranked.into_iter().map(|(w, _)| w.id).collect(),
            busy,
            closeness,
            why,
        }
    }
}

/// The closest group with at least `nodes` eligible workers, and its workers.
fn closest_group<'a>(
    eligible: &[&'a WorkerView],
    nodes: usize,
    spread: Spread,
    reserved: &[WorkerId],
) -> Option<(Closeness, Vec<&'a WorkerView>)> {
    let places: Vec<Locality> = eligible.iter().map(|w| Locality::of(&w.labels)).collect();
    if places.iter().all(|p| *p == Locality::default()) {
        return Some((Closeness::Unlabelled, eligible.to_vec()));
    }
    type Key = fn(&Locality) -> Option<&String>;
    type Level = (Key, fn(String) -> Closeness);
    let levels: [Level; 3] = [
        (|l| l.network_group.as_ref(), Closeness::NetworkGroup),
        (|l| l.zone.as_ref(), Closeness::Zone),
        (|l| l.region.as_ref(), Closeness::Region),
    ];
    for (key, closeness) in levels {
        let mut groups: BTreeMap<&String, Vec<&'a WorkerView>> = BTreeMap::new();
        for (w, place) in eligible.iter().zip(&places) {
            if let Some(k) = key(place) {
                groups.entry(k).or_default().push(w);
            }
        }
        // The group where most workers are free now (then most kept for this gang, then the
        // largest): the gang starts soonest there.
        let best = groups
            .into_iter()
            .filter(|(_, ws)| ws.len() >= nodes)
            .max_by_key(|(name, ws)| {
                let free = ws.iter().filter(|w| w.busy_slots < w.slots).count();
                let kept = ws.iter().filter(|w| reserved.contains(&w.id)).count();
                (free.min(nodes), kept, ws.len(), std::cmp::Reverse(*name))
            });
        if let Some((name, ws)) = best {
            return Some((closeness(name.clone()), ws));
        }
    }
    (spread == Spread::Region).then(|| (Closeness::AcrossRegions, eligible.to_vec()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use domain::fixtures::{inventory, job};
    use domain::{Accelerator, Layout};

    fn worker(id: i64, labels: &[(&str, &str)], busy: u32) -> WorkerView {
        WorkerView {
            id: WorkerId(id),
            name: format!("w{id}"),
            inventory: inventory(&format!("w{id}"), &[]),
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            online: true,
            slots: 1,
            busy_slots: busy,
            busy_devices: vec![],
        }
    }

    fn gang(nodes: u32, spread: Spread) -> JobSpec {
        JobSpec {
            layout: Layout {
                nodes,
                procs_per_node: 1,
                spread,
            },
            ..job(Accelerator::Cpu)
        }
    }

    fn ids(nodes: &[(WorkerId, Vec<u32>)]) -> Vec<i64> {
        nodes.iter().map(|(w, _)| w.0).collect()
    }

    const NG: &str = domain::layout::NETWORK_GROUP_LABEL;

    #[test]
    fn a_gang_stays_in_one_network_group_when_one_is_big_enough() {
        let fleet = [
            worker(1, &[("zone", "eu-west1-b"), (NG, "a")], 0),
            worker(2, &[("zone", "eu-west1-b"), (NG, "b")], 0),
            worker(3, &[("zone", "eu-west1-c"), (NG, "a")], 0),
            worker(4, &[("zone", "eu-west1-b"), (NG, "b")], 0),
            worker(5, &[("zone", "eu-west1-b"), (NG, "b")], 0),
        ];
        match place_gang(&fleet, &gang(3, Spread::Zone), &[]) {
            GangDecision::Place {
                nodes, closeness, ..
            } => {
                assert_eq!(ids(&nodes), vec![2, 4, 5]);
                assert_eq!(closeness, Closeness::NetworkGroup("b".into()));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn without_a_big_enough_group_the_zone_then_the_region_is_kept() {
        let fleet = [
            worker(1, &[("zone", "eu-west1-b")], 0),
            worker(2, &[("zone", "eu-west1-b")], 0),
            worker(3, &[("zone", "eu-west1-c")], 0),
            worker(4, &[("zone", "us-east1-b")], 0),
        ];
        let cases = [
            (2, Closeness::Zone("eu-west1-b".into()), vec![1, 2]),
            (3, Closeness::Region("eu-west1".into()), vec![1, 2, 3]),
        ];
        for (n, expect, expect_ids) in cases {
            match place_gang(&fleet, &gang(n, Spread::Zone), &[]) {
                GangDecision::Place {
                    nodes,
                    closeness,
                    why,
                } => {
                    assert_eq!(closeness, expect, "{n}");
                    assert_eq!(ids(&nodes), expect_ids, "{n}");
                    assert!(why.starts_with(&format!("{n} nodes in ")), "{why}");
                }
                other => panic!("{n}: {other:?}"),
            }
        }
    }

    #[test]
    fn regions_are_never_split_unless_the_job_allows_it() {
        let fleet = [
            worker(1, &[("zone", "eu-west1-b")], 0),
            worker(2, &[("zone", "eu-west1-c")], 0),
            worker(3, &[("zone", "us-east1-b")], 0),
        ];
        match place_gang(&fleet, &gang(3, Spread::Zone), &[]) {
            GangDecision::Unplaceable { why, .. } => {
                assert!(why.contains("no region has 3 eligible workers"), "{why}");
                assert!(why.contains("--spread region"), "{why}");
            }
            other => panic!("{other:?}"),
        }
        match place_gang(&fleet, &gang(3, Spread::Region), &[]) {
            GangDecision::Place { closeness, .. } => {
                assert_eq!(closeness, Closeness::AcrossRegions)
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_gang_that_must_wait_keeps_the_workers_it_chose() {
        let fleet = [
            worker(1, &[], 1),
            worker(2, &[], 0),
            worker(3, &[], 1),
            worker(4, &[], 1),
        ];
        // Two nodes: one free worker and the one kept already beats the rest.
        match place_gang(&fleet, &gang(2, Spread::Zone), &[WorkerId(3)]) {
            GangDecision::Reserve {
                workers,
                busy,
                closeness,
                ..
            } => {
                assert_eq!(workers, vec![WorkerId(2), WorkerId(3)]);
                assert_eq!(busy, 1);
                assert_eq!(closeness, Closeness::Unlabelled);
            }
            other => panic!("{other:?}"),
        }
        let all_free: Vec<WorkerView> = fleet
            .iter()
            .cloned()
            .map(|w| WorkerView { busy_slots: 0, ..w })
            .collect();
        assert!(matches!(
            place_gang(&all_free, &gang(2, Spread::Zone), &[WorkerId(3)]),
            GangDecision::Place { .. }
        ));
    }

    #[test]
    fn more_nodes_than_eligible_workers_is_unplaceable_with_each_workers_verdict() {
        let mut fleet = vec![worker(1, &[], 0), worker(2, &[], 0)];
        fleet[1].online = false;
        match place_gang(&fleet, &gang(2, Spread::Zone), &[]) {
            GangDecision::Unplaceable { why, verdicts } => {
                assert_eq!(why, "needs 2 nodes, 1 eligible worker(s)");
                assert_eq!(verdicts.len(), 1, "offline workers give no verdict");
            }
            other => panic!("{other:?}"),
        }
    }
}
