//! The subset chooser on the machines people run: an NVLink island on a DGX-1, PCIe switch
//! pairs on PCIe boxes, one socket before two.

use domain::Topology;
use scheduler::devices::choose;

fn topology(name: &str) -> Topology {
    let path = format!(
        "{}/tests/fixtures/topo/{name}.txt",
        env!("CARGO_MANIFEST_DIR")
    );
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    Topology::parse_nvidia_smi(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn all_but(n: u32, busy: &[u32]) -> Vec<u32> {
    (0..n).filter(|d| !busy.contains(d)).collect()
}

#[test]
fn the_subset_chooser_picks_nvlink_islands_and_shared_switches() {
    // (fixture, busy devices, how many, expected choice)
    let cases: &[(&str, &[u32], usize, &[u32])] = &[
        // DGX-1 hybrid cube mesh: each quad is fully NVLinked; across quads mostly SYS.
        ("dgx1-v100", &[], 4, &[0, 1, 2, 3]),
        ("dgx1-v100", &[0, 1], 4, &[4, 5, 6, 7]),
        // The best pair is a double NVLink (NV2); 0-3 is the first one.
        ("dgx1-v100", &[], 2, &[0, 3]),
        ("dgx1-v100", &[0], 2, &[1, 2]),
        ("dgx1-v100", &[], 8, &[0, 1, 2, 3, 4, 5, 6, 7]),
        // NVSwitch: every pair alike, so the lowest indices.
        ("nvswitch-8x-h100", &[], 4, &[0, 1, 2, 3]),
        ("nvswitch-8x-h100", &[1, 3], 3, &[0, 2, 4]),
        // Two PCIe switches: a pair on one switch beats a pair across.
        ("pcie-4x-two-switches", &[], 2, &[0, 1]),
        ("pcie-4x-two-switches", &[0], 2, &[2, 3]),
        // Two sockets: stay on one socket, and on a switch pair within it.
        ("pcie-8x-dual-socket", &[], 4, &[0, 1, 2, 3]),
        ("pcie-8x-dual-socket", &[1], 4, &[4, 5, 6, 7]),
        ("pcie-8x-dual-socket", &[1], 3, &[0, 2, 3]),
        ("pcie-8x-dual-socket", &[0, 2], 2, &[4, 5]),
        ("t4-2x", &[], 2, &[0, 1]),
        ("t4-2x", &[0], 2, &[]),
    ];
    for (name, busy, k, expect) in cases {
        let t = topology(name);
        let got = choose(&all_but(t.gpus() as u32, busy), *k, Some(&t));
        let expect = (!expect.is_empty()).then(|| expect.to_vec());
        assert_eq!(got, expect, "{name}, busy {busy:?}, {k} wanted");
    }
}

#[test]
fn every_fixture_parses_with_its_gpu_count() {
    for (name, gpus) in [
        ("dgx1-v100", 8),
        ("nvswitch-8x-h100", 8),
        ("pcie-4x-two-switches", 4),
        ("pcie-8x-dual-socket", 8),
        ("t4-2x", 2),
    ] {
        assert_eq!(topology(name).gpus(), gpus, "{name}");
    }
}
