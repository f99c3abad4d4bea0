//! Which devices of a worker a job gets: among the free ones, the subset of the requested
//! size whose slowest link is fastest (an NVLink island over a PCIe switch over the CPU
//! interconnect); ties go to more total bandwidth, then to lower indices.

use domain::Topology;

/// Above this many candidate subsets the exhaustive search gives way to a greedy one. An
/// 8-of-16 choice is 12,870 subsets, well under it.
const MAX_SUBSETS: u64 = 200_000;

fn binomial(n: u64, k: u64) -> u64 {
    (0..k).fold(1u64, |acc, i| acc.saturating_mul(n - i) / (i + 1))
}

/// (slowest link, sum of links) of a subset: compared as a pair, higher is better.
fn quality(topology: &Topology, subset: &[u32]) -> (u32, u32) {
    let mut min = u32::MAX;
    let mut sum = 0;
    for (i, &a) in subset.iter().enumerate() {
        for &b in &subset[i + 1..] {
            let s = topology.link(a as usize, b as usize).score();
            min = min.min(s);
            sum += s;
        }
    }
    (min, sum)
}

/// Chooses `k` of `free` (device indices). Without a topology, or when any index is outside
/// it, the lowest indices win. None when fewer than `k` are free.
pub fn choose(free: &[u32], k: usize, topology: Option<&Topology>) -> Option<Vec<u32>> {
    let mut free = free.to_vec();
    free.sort_unstable();
    free.dedup();
    if k > free.len() {
        return None;
    }
    let topology = topology.filter(|t| free.iter().all(|&i| (i as usize) < t.gpus()));
    let Some(topology) = topology else {
        return Some(free[..k].to_vec());
    };
    if k <= 1 {
        return Some(free[..k].to_vec());
    }
    if binomial(free.len() as u64, k as u64) > MAX_SUBSETS {
        return Some(greedy(&free, k, topology));
    }
    let mut best: Option<(Vec<u32>, (u32, u32))> = None;
    let mut pick: Vec<usize> = (0..k).collect();
    loop {
        let subset: Vec<u32> = pick.iter().map(|&i| free[i]).collect();
        let q = quality(topology, &subset);
        // Lexicographic enumeration: only a strictly better subset replaces an earlier one,
        // so ties keep the lower indices.
        if best.as_ref().is_none_or(|(_, bq)| q > *bq) {
            best = Some((subset, q));
        }
        // Next combination.
        let mut i = k;
        loop {
            if i == 0 {
                return best.map(|(s, _)| s);
            }
            i -= 1;
            if pick[i] < free.len() - k + i {
                break;
            }
        }
        pick[i] += 1;
        for j in i + 1..k {
            pick[j] = pick[j - 1] + 1;
        }
    }
}

/// For very large machines: start from the best pair, then add the device whose worst link
/// to the chosen ones is best.
fn greedy(free: &[u32], k: usize, topology: &Topology) -> Vec<u32> {
    let mut chosen: Vec<u32> = Vec::new();
    let mut best_pair = (free[0], free[1]);
    let mut best_score = 0;
    for (i, &a) in free.iter().enumerate() {
        for &b in &free[i + 1..] {
            let s = topology.link(a as usize, b as usize).score();
            if s > best_score {
                best_score = s;
                best_pair = (a, b);
            }
        }
    }
    chosen.extend([best_pair.0, best_pair.1]);
    while chosen.len() < k {
        let next = free
            .iter()
            .filter(|d| !chosen.contains(d))
            .max_by_key(|&&d| {
                let worst = chosen
                    .iter()
                    .map(|&c| topology.link(c as usize, d as usize).score())
                    .min()
                    .unwrap_or(0);
                (worst, std::cmp::Reverse(d))
            })
            .copied()
            .expect("k <= free.len()");
        chosen.push(next);
    }
    chosen.sort_unstable();
    chosen
}

/// Why a job holds `chosen` (device indices) on a worker with `topology`, in words for its
/// page: the one free device, the lowest free indices (no interconnect matrix), or the
/// slowest link inside the subset, which `choose` made as fast as the free devices allowed.
pub fn why(chosen: &[u32], topology: Option<&Topology>) -> String {
    if chosen.len() <= 1 {
        return if chosen.is_empty() {
            String::new()
        } else {
            "a free device".into()
        };
    }
    let Some(t) = topology.filter(|t| chosen.iter().all(|&d| (d as usize) < t.gpus())) else {
        return "the lowest free indices (the worker reported no interconnect matrix)".into();
    };
    let mut slowest: Option<domain::Link> = None;
    for (i, &a) in chosen.iter().enumerate() {
        for &b in &chosen[i + 1..] {
            let link = t.link(a as usize, b as usize);
            if slowest.is_none_or(|s| link.score() < s.score()) {
                slowest = Some(link);
            }
        }
    }
    let link = slowest.unwrap_or(domain::Link::SelfLink);
    let words = match link {
        domain::Link::NvLink(_) => "NVLink",
        domain::Link::Pix => "one PCIe switch",
        domain::Link::Pxb => "several PCIe switches",
        domain::Link::Phb => "a PCIe host bridge",
        domain::Link::Node => "across host bridges of one NUMA node",
        domain::Link::Sys => "across CPU sockets",
        domain::Link::SelfLink => "the same device",
    };
    format!(
        "slowest link between them {link} ({words}): the free subset whose slowest link is fastest"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn why_names_the_slowest_link_of_the_subset_or_the_reason_there_is_none() {
        use domain::Link::{NvLink, SelfLink, Sys};
        let t = Topology::new(vec![
            vec![SelfLink, NvLink(12), Sys],
            vec![NvLink(12), SelfLink, Sys],
            vec![Sys, Sys, SelfLink],
        ])
        .unwrap();
        let table: [(&[u32], Option<&Topology>, &str); 5] = [
            (&[0, 1], Some(&t), "slowest link between them NV12 (NVLink)"),
            (&[0, 1, 2], Some(&t), "SYS (across CPU sockets)"),
            (&[2], Some(&t), "a free device"),
            (&[0, 1], None, "no interconnect matrix"),
            (&[0, 7], Some(&t), "no interconnect matrix"),
        ];
        for (chosen, topology, want) in table {
            let got = why(chosen, topology);
            assert!(got.contains(want), "{chosen:?}: {got}");
        }
        assert_eq!(why(&[], None), "");
    }

    #[test]
    fn without_a_topology_the_lowest_free_indices_win() {
        assert_eq!(choose(&[5, 1, 3], 2, None), Some(vec![1, 3]));
        assert_eq!(choose(&[1], 2, None), None);
        assert_eq!(choose(&[], 0, None), Some(vec![]));
    }

    #[test]
    fn binomials_are_exact_for_small_inputs() {
        assert_eq!(binomial(16, 8), 12_870);
        assert_eq!(binomial(8, 0), 1);
    }
}
