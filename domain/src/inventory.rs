//! What a worker has: its host facts and its accelerators.

use crate::SpecError;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// A kind of compute a job can ask for.
///
/// `Cpu` and `Any` are satisfied by every worker: every machine has a CPU, and `Any` means
/// "I do not care". `Cuda` and `Mps` need a device of that kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Accelerator {
    Cpu,
    Cuda,
    Mps,
    Any,
}

impl Accelerator {
    pub const ALL: [Accelerator; 4] = [Self::Cpu, Self::Cuda, Self::Mps, Self::Any];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Cpu => "cpu",
            Self::Cuda => "cuda",
            Self::Mps => "mps",
            Self::Any => "any",
        }
    }

    /// The device kind a job with this accelerator needs, if any.
    pub fn needs_device(self) -> bool {
        matches!(self, Self::Cuda | Self::Mps)
    }
}

impl fmt::Display for Accelerator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Accelerator {
    type Err = SpecError;
    fn from_str(s: &str) -> Result<Self, SpecError> {
        Self::ALL
            .into_iter()
            .find(|a| a.as_str() == s.trim().to_ascii_lowercase())
            .ok_or_else(|| SpecError::UnknownAccelerator(s.to_string()))
    }
}

/// One accelerator device a worker found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Device {
    pub kind: Accelerator,
    /// Index as the framework numbers it (`cuda:0`), 0 for single-device kinds like `mps`.
    pub index: u32,
    /// Human name, such as `NVIDIA H200` or `Apple M2 Max`.
    pub name: String,
    pub memory_bytes: Option<u64>,
    /// `GPU-8f6...` for NVIDIA devices; what `CUDA_VISIBLE_DEVICES` is given.
    #[serde(default)]
    pub uuid: Option<String>,
    /// `9.0` for an H100.
    #[serde(default)]
    pub compute_capability: Option<String>,
}

/// The outcome of running one framework on one device kind in a subprocess.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FrameworkCheck {
    pub library: crate::Library,
    /// The device kind checked (`cuda` for `torch.cuda`, `mps` for `torch.mps` and `mlx`).
    pub device: Accelerator,
    /// The installed version, when the library imports.
    pub version: Option<String>,
    /// True only when a computation ran on the device and gave the right answer.
    pub usable: bool,
    /// Why not, in words, when not usable.
    pub reason: Option<String>,
}

impl FrameworkCheck {
    /// `torch.cuda`, `mlx`.
    pub fn name(&self) -> String {
        match self.library {
            crate::Library::Mlx => "mlx".to_string(),
            l => format!("{l}.{}", self.device),
        }
    }
}

/// What a worker reports about itself when it registers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Inventory {
    pub hostname: String,
    pub os: String,
    pub arch: String,
    pub cpus: u32,
    pub memory_bytes: u64,
    pub devices: Vec<Device>,
    /// NVIDIA driver and the CUDA version it supports, when there is one.
    #[serde(default)]
    pub driver_version: Option<String>,
    #[serde(default)]
    pub cuda_version: Option<String>,
    /// The GPU interconnect matrix, indexed like the CUDA devices' `index`.
    #[serde(default)]
    pub topology: Option<crate::Topology>,
    #[serde(default)]
    pub frameworks: Vec<FrameworkCheck>,
    /// The version of the Python interpreter jobs and remote calls run with (`3.11.7`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub python: Option<String>,
    /// True when the worker advertises a recorded inventory instead of probing (tests and
    /// load tests: `gpulayer join --inventory FILE`).
    #[serde(default)]
    pub simulated: bool,
}

impl Inventory {
    /// How many devices of this kind the worker has.
    pub fn count(&self, kind: Accelerator) -> usize {
        self.devices.iter().filter(|d| d.kind == kind).count()
    }

    /// What the worker found out about `library` on `device`, if it checked.
    pub fn framework(
        &self,
        library: crate::Library,
        device: Accelerator,
    ) -> Option<&FrameworkCheck> {
        self.frameworks
            .iter()
            .find(|f| f.library == library && f.device == device)
    }

    /// The installed version of `library` from any of its checks.
    pub fn framework_version(&self, library: crate::Library) -> Option<&str> {
        self.frameworks
            .iter()
            .filter(|f| f.library == library)
            .find_map(|f| f.version.as_deref())
    }

    /// The `major.minor` of the interpreter remote calls run with here (what a call's
    /// `python` must equal), if the worker probed one.
    pub fn call_python(&self) -> Option<&str> {
        self.python.as_deref().and_then(crate::CallSpec::minor_of)
    }

    /// The accelerator kinds whose jobs this worker could run at all.
    pub fn runnable_accelerators(&self) -> Vec<Accelerator> {
        Accelerator::ALL
            .into_iter()
            .filter(|a| !a.needs_device() || self.count(*a) > 0)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runnable_accelerators_follow_the_devices() {
        use Accelerator::*;
        let cases: &[(&[Accelerator], &[Accelerator])] = &[
            (&[], &[Cpu, Any]),
            (&[Cuda, Cuda], &[Cpu, Cuda, Any]),
            (&[Mps], &[Cpu, Mps, Any]),
        ];
        for (devices, expect) in cases {
            assert_eq!(
                crate::fixtures::inventory("w", devices).runnable_accelerators(),
                expect.to_vec(),
                "{devices:?}"
            );
        }
    }

    #[test]
    fn accelerator_names_parse_case_insensitively_and_reject_the_rest() {
        assert_eq!("CUDA".parse::<Accelerator>().unwrap(), Accelerator::Cuda);
        assert_eq!(
            "tpu".parse::<Accelerator>().unwrap_err().to_string(),
            "unknown accelerator 'tpu': use one of cpu, cuda, mps, any"
        );
    }
}
