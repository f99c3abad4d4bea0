//! Properties: the chosen subset is optimal (checked against brute force on small
//! machines), no device is handed out twice, and never more than asked for.

use domain::fixtures::{cuda_inventory, job};
use domain::{Accelerator, Link, Requirements, Topology, WorkerId};
use proptest::prelude::*;
use scheduler::devices::choose;
use scheduler::{Decision, WorkerView, place};
use std::collections::BTreeMap;

const LINKS: [Link; 7] = [
    Link::NvLink(1),
    Link::NvLink(2),
    Link::Pix,
    Link::Pxb,
    Link::Phb,
    Link::Node,
    Link::Sys,
];

fn topology_strategy(max: usize) -> impl Strategy<Value = Topology> {
    (2..=max).prop_flat_map(|n| {
        proptest::collection::vec(0..LINKS.len(), n * (n - 1) / 2).prop_map(move |cells| {
            let mut links = vec![vec![Link::SelfLink; n]; n];
            let pairs = (0..n).flat_map(|i| (i + 1..n).map(move |j| (i, j)));
            for ((i, j), cell) in pairs.zip(cells) {
                links[i][j] = LINKS[cell];
                links[j][i] = LINKS[cell];
            }
            Topology::new(links).expect("symmetric by construction")
        })
    })
}

/// The slowest link of a subset, by brute force over bitmasks (independent of `choose`).
fn bottleneck(t: &Topology, subset: &[u32]) -> u32 {
    let mut min = u32::MAX;
    for (i, a) in subset.iter().enumerate() {
        for b in &subset[i + 1..] {
            min = min.min(t.link(*a as usize, *b as usize).score());
        }
    }
    min
}

fn best_bottleneck(t: &Topology, free: &[u32], k: usize) -> Option<u32> {
    (0u32..1 << free.len())
        .filter(|m| m.count_ones() as usize == k)
        .map(|m| {
            let subset: Vec<u32> = (0..free.len())
                .filter(|i| m & (1 << i) != 0)
                .map(|i| free[i])
                .collect();
            bottleneck(t, &subset)
        })
        .max()
}

proptest! {
    #[test]
    fn the_chosen_subset_has_the_best_bottleneck(t in topology_strategy(7), free_mask in 0u32..128, k in 0usize..7) {
        let free: Vec<u32> = (0..t.gpus() as u32).filter(|i| free_mask & (1 << i) != 0).collect();
        let got = choose(&free, k, Some(&t));
        if k > free.len() {
            prop_assert_eq!(got, None);
        } else {
            let got = got.expect("enough free devices");
            prop_assert_eq!(got.len(), k, "exactly as many as asked");
            prop_assert!(got.iter().all(|d| free.contains(d)), "only free devices");
            let mut unique = got.clone();
            unique.dedup();
            prop_assert_eq!(unique.len(), k, "no device twice");
            prop_assert_eq!(Some(bottleneck(&t, &got)), best_bottleneck(&t, &free, k));
        }
    }

    #[test]
    fn jobs_placed_one_after_another_never_share_a_device(sizes in proptest::collection::vec(1u32..4, 1..8)) {
        let mut worker = WorkerView {
            id: WorkerId(1),
            name: "box".into(),
            inventory: cuda_inventory("box", 8),
            labels: BTreeMap::new(),
            online: true,
            slots: 100,
            busy_slots: 0,
            busy_devices: vec![],
        };
        let mut handed_out = 0;
        for n in sizes {
            let spec = domain::JobSpec {
                requirements: Requirements { devices: Some(n), ..Default::default() },
                ..job(Accelerator::Cuda)
            };
            match place(std::slice::from_ref(&worker), &spec) {
                Decision::Place { devices, .. } => {
                    prop_assert_eq!(devices.len() as u32, n);
                    prop_assert!(devices.iter().all(|d| !worker.busy_devices.contains(d)));
                    worker.busy_devices.extend(devices);
                    worker.busy_slots += 1;
                    handed_out += n;
                }
                Decision::Unplaceable(_) => prop_assert!(handed_out + n > 8, "refused only when too few are free"),
            }
        }
    }
}

/// The queue claims jobs that ask only for their accelerator kind without asking the
/// scheduler (`JobSpec::is_plain`): `check` must accept every such job on
/// every worker that offers the kind, and the predicate must not hold for jobs `check` can
/// turn down.
#[test]
fn jobs_that_ask_only_for_their_kind_fit_every_worker_offering_it() {
    use domain::{FrameworkSpec, LabelSelector};
    let inventories = [
        domain::fixtures::inventory("cpu-only", &[]),
        cuda_inventory("one-gpu", 1),
        domain::fixtures::inventory("mac", &[Accelerator::Mps]),
    ];
    let labels = [
        BTreeMap::new(),
        BTreeMap::from([("zone".to_string(), "a".to_string())]),
    ];
    let framework = FrameworkSpec::parse("torch>=2").unwrap();
    let label = LabelSelector::parse("zone=b").unwrap();
    let variants = [
        ("nothing", Requirements::default(), true),
        (
            "zero devices",
            Requirements {
                devices: Some(0),
                ..Default::default()
            },
            true,
        ),
        (
            "device memory without devices",
            Requirements {
                devices: Some(0),
                min_device_memory_bytes: Some(1 << 40),
                ..Default::default()
            },
            true,
        ),
        (
            "a framework",
            Requirements {
                frameworks: vec![framework],
                ..Default::default()
            },
            false,
        ),
        (
            "a label",
            Requirements {
                labels: vec![label],
                ..Default::default()
            },
            false,
        ),
    ];
    for kind in [
        Accelerator::Cpu,
        Accelerator::Any,
        Accelerator::Cuda,
        Accelerator::Mps,
    ] {
        for (what, requirements, plain_unless_devices) in &variants {
            let spec = domain::JobSpec {
                requirements: requirements.clone(),
                ..job(kind)
            };
            let plain = spec.is_plain();
            let expected = *plain_unless_devices && spec.devices_per_node() == 0;
            assert_eq!(plain, expected, "{kind} job with {what}");
            if !plain {
                continue;
            }
            for inventory in &inventories {
                if !inventory.runnable_accelerators().contains(&kind) {
                    continue;
                }
                for l in &labels {
                    assert_eq!(
                        scheduler::check(inventory, l, &spec),
                        Ok(()),
                        "{kind} job with {what} on {}",
                        inventory.hostname
                    );
                }
            }
        }
    }
}
