//! What a job needs from a worker beyond its accelerator kind: how many devices, how much
//! memory on each, which frameworks (with PEP 440 versions), and which labels.

use crate::version::VersionSpec;
use crate::{Accelerator, SpecError};
use serde::{Deserialize, Serialize};
use std::fmt;

/// A GPU library GPUlayer checks on every worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Library {
    Torch,
    Jax,
    Cupy,
    Mlx,
}

impl Library {
    pub const ALL: [Library; 4] = [Library::Torch, Library::Jax, Library::Cupy, Library::Mlx];

    pub fn as_str(self) -> &'static str {
        match self {
            Library::Torch => "torch",
            Library::Jax => "jax",
            Library::Cupy => "cupy",
            Library::Mlx => "mlx",
        }
    }

    pub fn parse(s: &str) -> Result<Self, SpecError> {
        let name = s.trim().to_ascii_lowercase();
        Self::ALL
            .into_iter()
            .find(|l| l.as_str() == name)
            .ok_or_else(|| SpecError::UnknownFramework(s.trim().to_string()))
    }

    /// The device kinds this library can run on, as GPUlayer checks them.
    pub fn device_kinds(self) -> &'static [Accelerator] {
        match self {
            Library::Torch => &[Accelerator::Cuda, Accelerator::Mps],
            Library::Jax | Library::Cupy => &[Accelerator::Cuda],
            Library::Mlx => &[Accelerator::Mps],
        }
    }
}

impl fmt::Display for Library {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `jax>=0.4`, `torch`, `mlx>=0.10,<1`: a library and the versions that will do.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FrameworkSpec {
    pub library: Library,
    #[serde(default = "VersionSpec::any")]
    pub versions: VersionSpec,
}

impl FrameworkSpec {
    /// Parses `NAME[SPECIFIERS]` as written on the command line.
    pub fn parse(s: &str) -> Result<Self, SpecError> {
        let split = s.find(|c: char| "<>=!~".contains(c)).unwrap_or(s.len());
        let (name, spec) = s.split_at(split);
        if name.trim().is_empty() {
            return Err(SpecError::BadFramework(s.to_string()));
        }
        Ok(Self {
            library: Library::parse(name)?,
            versions: VersionSpec::parse(spec)
                .map_err(|_| SpecError::BadFramework(s.to_string()))?,
        })
    }

    /// Parses the SDK's form: a name and a specifier string (`"mlx", ">=0.10"`).
    pub fn from_parts(name: &str, versions: &str) -> Result<Self, SpecError> {
        Ok(Self {
            library: Library::parse(name)?,
            versions: VersionSpec::parse(versions)
                .map_err(|_| SpecError::BadFramework(format!("{name}{versions}")))?,
        })
    }
}

impl fmt::Display for FrameworkSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}", self.library, self.versions)
    }
}

/// `KEY=VALUE`: the worker must carry this label with this value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LabelSelector {
    pub key: String,
    pub value: String,
}

impl LabelSelector {
    pub fn parse(s: &str) -> Result<Self, SpecError> {
        match s.split_once('=') {
            Some((k, v)) if !k.trim().is_empty() => Ok(Self {
                key: k.trim().to_string(),
                value: v.trim().to_string(),
            }),
            _ => Err(SpecError::BadLabelSelector(s.to_string())),
        }
    }
}

impl fmt::Display for LabelSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}={}", self.key, self.value)
    }
}

/// Everything a job needs besides its accelerator kind. The default asks for nothing more.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Requirements {
    /// Devices of the job's accelerator kind; `None` means 1 for cuda/mps, 0 otherwise.
    #[serde(default)]
    pub devices: Option<u32>,
    /// Least memory each of those devices must have.
    #[serde(default)]
    pub min_device_memory_bytes: Option<u64>,
    #[serde(default)]
    pub frameworks: Vec<FrameworkSpec>,
    #[serde(default)]
    pub labels: Vec<LabelSelector>,
}

impl Requirements {
    /// How many devices a job with `accelerator` needs.
    pub fn device_count(&self, accelerator: Accelerator) -> u32 {
        match (self.devices, accelerator.needs_device()) {
            (Some(n), true) => n,
            (None, true) => 1,
            (_, false) => 0,
        }
    }
}

/// Parses a device count as typed (`--devices 2`); zero is allowed for cpu jobs only, and
/// the caller checks that against the accelerator.
pub fn parse_device_count(s: &str) -> Result<u32, SpecError> {
    s.trim()
        .parse::<u32>()
        .map_err(|_| SpecError::BadDeviceCount(s.to_string()))
}

/// Parses a memory size: `40GiB`, `40G`, `16000MiB`, `512M`, or plain bytes.
pub fn parse_memory(s: &str) -> Result<u64, SpecError> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let n: f64 = number
        .parse()
        .map_err(|_| SpecError::BadMemory(s.to_string()))?;
    let factor: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kb" | "kib" => 1024.0,
        "m" | "mb" | "mib" => 1024.0 * 1024.0,
        "g" | "gb" | "gib" => 1024.0 * 1024.0 * 1024.0,
        "t" | "tb" | "tib" => 1024.0_f64.powi(4),
        _ => return Err(SpecError::BadMemory(s.to_string())),
    };
    if n < 0.0 || !n.is_finite() {
        return Err(SpecError::BadMemory(s.to_string()));
    }
    Ok((n * factor) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn framework_specs_parse_name_and_versions() {
        let cases = [
            ("jax>=0.4", "jax", ">=0.4"),
            ("torch", "torch", ""),
            ("MLX >=0.10, <1", "mlx", ">=0.10, <1"),
        ];
        for (input, library, versions) in cases {
            let f = FrameworkSpec::parse(input).unwrap();
            assert_eq!(f.library.as_str(), library);
            assert_eq!(f.versions.to_string(), versions);
        }
        assert_eq!(
            FrameworkSpec::parse("tensorflow>=2")
                .unwrap_err()
                .to_string(),
            "unknown framework 'tensorflow': GPUlayer checks torch, jax, cupy and mlx"
        );
        assert_eq!(
            FrameworkSpec::parse("jax>=>0.4").unwrap_err().to_string(),
            "framework spec 'jax>=>0.4' is not NAME[SPECIFIERS] (e.g. 'jax>=0.4' or 'torch>=2,<3')"
        );
        assert!(FrameworkSpec::from_parts("mlx", ">=0.10").is_ok());
    }

    #[test]
    fn label_selectors_and_sizes_parse_or_name_the_bad_value() {
        assert_eq!(
            LabelSelector::parse("zone=europe-west1-b").unwrap().value,
            "europe-west1-b"
        );
        assert!(
            LabelSelector::parse("zone")
                .unwrap_err()
                .to_string()
                .contains("'zone'")
        );
        assert_eq!(parse_memory("40GiB").unwrap(), 40 << 30);
        assert_eq!(parse_memory("512M").unwrap(), 512 << 20);
        assert_eq!(parse_memory("1.5g").unwrap(), 3 << 29);
        assert!(
            parse_memory("-1G")
                .unwrap_err()
                .to_string()
                .contains("'-1G'")
        );
        assert!(
            parse_device_count("-2")
                .unwrap_err()
                .to_string()
                .contains("'-2'")
        );
    }

    #[test]
    fn device_counts_default_to_one_for_gpus_and_zero_for_cpus() {
        let none = Requirements::default();
        assert_eq!(none.device_count(Accelerator::Cuda), 1);
        assert_eq!(none.device_count(Accelerator::Cpu), 0);
        let two = Requirements {
            devices: Some(2),
            ..Default::default()
        };
        assert_eq!(two.device_count(Accelerator::Mps), 2);
        assert_eq!(two.device_count(Accelerator::Any), 0);
    }
}
