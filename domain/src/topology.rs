//! The GPU interconnect matrix of one machine, as `nvidia-smi topo -m` prints it.

use serde::{Deserialize, Serialize};
use std::fmt;

/// How two GPUs reach each other, best first: NVLink (more links, more bandwidth), then
/// PCIe paths through one switch (PIX), several switches (PXB), the host bridge (PHB), the
/// interconnect between PCIe host bridges of one NUMA node (NODE), or across sockets (SYS).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Link {
    SelfLink,
    NvLink(u8),
    Pix,
    Pxb,
    Phb,
    Node,
    Sys,
}

impl Link {
    /// A rank where higher is faster; only the order matters (and sums of it break ties).
    pub fn score(self) -> u32 {
        match self {
            Link::SelfLink => 1000,
            Link::NvLink(n) => 100 + u32::from(n),
            Link::Pix => 50,
            Link::Pxb => 40,
            Link::Phb => 30,
            Link::Node => 20,
            Link::Sys => 10,
        }
    }

    pub fn parse(cell: &str) -> Option<Link> {
        let c = cell.trim();
        Some(match c {
            "X" => Link::SelfLink,
            "PIX" => Link::Pix,
            "PXB" => Link::Pxb,
            "PHB" => Link::Phb,
            "NODE" => Link::Node,
            // SOC is what older drivers called SYS.
            "SYS" | "SOC" => Link::Sys,
            _ => Link::NvLink(c.strip_prefix("NV")?.parse().ok()?),
        })
    }
}

impl fmt::Display for Link {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Link::SelfLink => f.write_str("X"),
            Link::NvLink(n) => write!(f, "NV{n}"),
            Link::Pix => f.write_str("PIX"),
            Link::Pxb => f.write_str("PXB"),
            Link::Phb => f.write_str("PHB"),
            Link::Node => f.write_str("NODE"),
            Link::Sys => f.write_str("SYS"),
        }
    }
}

/// The GPU-to-GPU link matrix, indexed by the GPU numbers `nvidia-smi` uses.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "Vec<Vec<String>>", into = "Vec<Vec<String>>")]
pub struct Topology {
    links: Vec<Vec<Link>>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TopologyError {
    #[error("no GPU columns in the `nvidia-smi topo -m` output")]
    NoGpus,
    #[error("row {row} of the topology has {found} GPU cells, expected {expected}")]
    RowLength {
        row: usize,
        found: usize,
        expected: usize,
    },
    #[error("unknown link '{0}' in the topology")]
    UnknownLink(String),
    #[error("the topology is not square or not symmetric")]
    Shape,
}

/// Drops the terminal escape codes nvidia-smi puts around its header.
fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for d in chars.by_ref() {
                if d.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

impl Topology {
    pub fn new(links: Vec<Vec<Link>>) -> Result<Self, TopologyError> {
        let n = links.len();
        if n == 0 {
            return Err(TopologyError::NoGpus);
        }
        for (i, row) in links.iter().enumerate() {
            if row.len() != n {
                return Err(TopologyError::Shape);
            }
            for (j, link) in row.iter().enumerate() {
                if links[j][i].score() != link.score() || (i == j) != (*link == Link::SelfLink) {
                    return Err(TopologyError::Shape);
                }
            }
        }
        Ok(Self { links })
    }

    /// Parses `nvidia-smi topo -m`: GPU columns come first in the header; NIC columns,
    /// CPU/NUMA affinity and the legend are ignored.
    pub fn parse_nvidia_smi(text: &str) -> Result<Self, TopologyError> {
        let text = strip_ansi(text);
        let mut lines = text.lines().filter(|l| !l.trim().is_empty());
        let header = lines.next().ok_or(TopologyError::NoGpus)?;
        let is_gpu = |t: &str| {
            t.strip_prefix("GPU")
                .is_some_and(|n| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()))
        };
        let n = header.split_whitespace().take_while(|t| is_gpu(t)).count();
        if n == 0 {
            return Err(TopologyError::NoGpus);
        }
        let mut links = Vec::with_capacity(n);
        for line in lines {
            let mut cells = line.split_whitespace();
            let Some(name) = cells.next() else { continue };
            if !is_gpu(name) {
                continue;
            }
            let row: Vec<&str> = cells.take(n).collect();
            if row.len() != n {
                return Err(TopologyError::RowLength {
                    row: links.len(),
                    found: row.len(),
                    expected: n,
                });
            }
            let parsed = row
                .iter()
                .map(|c| Link::parse(c).ok_or_else(|| TopologyError::UnknownLink(c.to_string())))
                .collect::<Result<Vec<_>, _>>()?;
            links.push(parsed);
        }
        Self::new(links)
    }

    pub fn gpus(&self) -> usize {
        self.links.len()
    }

    pub fn link(&self, a: usize, b: usize) -> Link {
        self.links[a][b]
    }
}

impl TryFrom<Vec<Vec<String>>> for Topology {
    type Error = TopologyError;
    fn try_from(rows: Vec<Vec<String>>) -> Result<Self, TopologyError> {
        let links = rows
            .iter()
            .map(|r| {
                r.iter()
                    .map(|c| Link::parse(c).ok_or_else(|| TopologyError::UnknownLink(c.clone())))
                    .collect::<Result<Vec<_>, _>>()
            })
            .collect::<Result<Vec<_>, _>>()?;
        Self::new(links)
    }
}

impl From<Topology> for Vec<Vec<String>> {
    fn from(t: Topology) -> Self {
        t.links
            .iter()
            .map(|r| r.iter().map(Link::to_string).collect())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TWO_T4: &str = "\u{1b}[4mGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\u{1b}[0m\n\
        GPU0\t X \tPHB\t0-7\t0\n\
        GPU1\tPHB\t X \t0-7\t0\n\n\
        Legend:\n\n  X    = Self\n  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge\n";

    #[test]
    fn nvidia_smi_output_with_escape_codes_and_a_legend_parses() {
        let t = Topology::parse_nvidia_smi(TWO_T4).unwrap();
        assert_eq!(t.gpus(), 2);
        assert_eq!(t.link(0, 1), Link::Phb);
        assert_eq!(t.link(1, 1), Link::SelfLink);
    }

    #[test]
    fn nic_columns_are_ignored() {
        let text = "\tGPU0\tGPU1\tNIC0\tCPU Affinity\n\
            GPU0\t X \tNV12\tPXB\t0-31\n\
            GPU1\tNV12\t X \tPXB\t0-31\n\
            NIC0\tPXB\tPXB\t X \n";
        let t = Topology::parse_nvidia_smi(text).unwrap();
        assert_eq!(t.link(0, 1), Link::NvLink(12));
    }

    #[test]
    fn broken_matrices_are_refused() {
        assert_eq!(
            Topology::parse_nvidia_smi("nothing here"),
            Err(TopologyError::NoGpus)
        );
        let asymmetric = "\tGPU0\tGPU1\nGPU0\t X \tNV1\nGPU1\tSYS\t X \n";
        assert_eq!(
            Topology::parse_nvidia_smi(asymmetric),
            Err(TopologyError::Shape)
        );
        let unknown = "\tGPU0\tGPU1\nGPU0\t X \tFOO\nGPU1\tFOO\t X \n";
        assert_eq!(
            Topology::parse_nvidia_smi(unknown),
            Err(TopologyError::UnknownLink("FOO".into()))
        );
    }

    #[test]
    fn links_rank_nvlink_over_pcie_over_sockets() {
        let order = [
            Link::NvLink(2),
            Link::NvLink(1),
            Link::Pix,
            Link::Pxb,
            Link::Phb,
            Link::Node,
            Link::Sys,
        ];
        for pair in order.windows(2) {
            assert!(
                pair[0].score() > pair[1].score(),
                "{} > {}",
                pair[0],
                pair[1]
            );
        }
    }
}
