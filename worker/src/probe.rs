//! What this machine has, found out rather than assumed: host facts, NVIDIA GPUs (NVML,
//! loaded at run time, with `nvidia-smi` as fallback), Apple Silicon, the GPU interconnect
//! matrix, and whether each GPU framework really computes on the device (see
//! [`crate::frameworks`]).

use domain::{Accelerator, Device, Inventory, Topology};
use std::process::Command;

/// Host facts and devices; frameworks are filled in by [`crate::frameworks`].
pub fn host_inventory() -> Inventory {
    let nvidia = nvidia_gpus();
    let topology = if nvidia.devices.len() > 1 {
        nvidia_topology()
    } else {
        None
    };
    Inventory {
        hostname: nix::unistd::gethostname()
            .ok()
            .and_then(|h| h.into_string().ok())
            .unwrap_or_else(|| "unknown".into()),
        os: std::env::consts::OS.to_string(),
        arch: std::env::consts::ARCH.to_string(),
        cpus: std::thread::available_parallelism()
            .map(|n| n.get() as u32)
            .unwrap_or(1),
        memory_bytes: memory_bytes().unwrap_or(0),
        devices: nvidia.devices.into_iter().chain(apple_gpu()).collect(),
        driver_version: nvidia.driver_version,
        cuda_version: nvidia.cuda_version,
        topology,
        frameworks: vec![],
        python: None,
        simulated: false,
    }
}

fn memory_bytes() -> Option<u64> {
    if let Ok(text) = std::fs::read_to_string("/proc/meminfo") {
        return parse_meminfo(&text);
    }
    // macOS: unified memory is the machine's memory.
    let out = Command::new("sysctl")
        .args(["-n", "hw.memsize"])
        .output()
        .ok()?;
    String::from_utf8_lossy(&out.stdout).trim().parse().ok()
}

fn parse_meminfo(text: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

#[derive(Debug, Default)]
struct NvidiaGpus {
    devices: Vec<Device>,
    driver_version: Option<String>,
    cuda_version: Option<String>,
}

fn nvidia_gpus() -> NvidiaGpus {
    match nvml_gpus() {
        Ok(found) => found,
        Err(e) => {
            tracing::debug!(error = %e, "NVML unavailable; trying nvidia-smi");
            nvidia_smi_gpus()
        }
    }
}

/// NVML is loaded with dlopen, so the same binary runs where there is no NVIDIA driver.
fn nvml_gpus() -> Result<NvidiaGpus, nvml_wrapper::error::NvmlError> {
    let nvml = nvml_wrapper::Nvml::init()?;
    let mut devices = Vec::new();
    for i in 0..nvml.device_count()? {
        let d = nvml.device_by_index(i)?;
        devices.push(Device {
            kind: Accelerator::Cuda,
            index: d.index().unwrap_or(i),
            name: d.name()?,
            memory_bytes: d.memory_info().ok().map(|m| m.total),
            uuid: d.uuid().ok(),
            compute_capability: d
                .cuda_compute_capability()
                .ok()
                .map(|c| format!("{}.{}", c.major, c.minor)),
        });
    }
    Ok(NvidiaGpus {
        devices,
        driver_version: nvml.sys_driver_version().ok(),
        cuda_version: nvml
            .sys_cuda_driver_version()
            .ok()
            .map(|v| format!("{}.{}", v / 1000, (v % 1000) / 10)),
    })
}

fn nvidia_smi_gpus() -> NvidiaGpus {
    let query = |fields: &str| {
        Command::new("nvidia-smi")
            .args([
                &format!("--query-gpu={fields}"),
                "--format=csv,noheader,nounits",
            ])
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).to_string())
    };
    // compute_cap needs a driver from 2022 or later; ask without it where it is unknown.
    let (text, with_cc) = match query("index,name,memory.total,uuid,driver_version,compute_cap") {
        Some(t) => (t, true),
        None => match query("index,name,memory.total,uuid,driver_version") {
            Some(t) => (t, false),
            None => return NvidiaGpus::default(),
        },
    };
    let (devices, driver_version) = parse_nvidia_smi(&text, with_cc);
    let cuda_version = Command::new("nvidia-smi")
        .output()
        .ok()
        .and_then(|o| parse_cuda_version(&String::from_utf8_lossy(&o.stdout)));
    NvidiaGpus {
        devices,
        driver_version,
        cuda_version,
    }
}

fn parse_nvidia_smi(text: &str, with_cc: bool) -> (Vec<Device>, Option<String>) {
    let mut driver = None;
    let devices = text
        .lines()
        .filter_map(|line| {
            let cells: Vec<&str> = line.split(',').map(str::trim).collect();
            if cells.len() < 5 {
                return None;
            }
            driver = Some(cells[4].to_string());
            Some(Device {
                kind: Accelerator::Cuda,
                index: cells[0].parse().ok()?,
                name: cells[1].to_string(),
                memory_bytes: cells[2].parse::<u64>().ok().map(|m| m * 1024 * 1024),
                uuid: Some(cells[3].to_string()).filter(|u| u.starts_with("GPU-")),
                compute_capability: with_cc
                    .then(|| cells.get(5).map(|c| c.to_string()))
                    .flatten(),
            })
        })
        .collect();
    (devices, driver)
}

/// "CUDA Version: 12.4" from the banner of plain `nvidia-smi`.
fn parse_cuda_version(text: &str) -> Option<String> {
    let at = text.find("CUDA Version:")?;
    text[at + "CUDA Version:".len()..]
        .split_whitespace()
        .next()
        .map(str::to_string)
}

fn nvidia_topology() -> Option<Topology> {
    let out = Command::new("nvidia-smi")
        .args(["topo", "-m"])
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    match Topology::parse_nvidia_smi(&String::from_utf8_lossy(&out.stdout)) {
        Ok(t) => Some(t),
        Err(e) => {
            tracing::warn!(error = %e, "cannot read `nvidia-smi topo -m`; choosing GPUs by index");
            None
        }
    }
}

/// The GPU of an Apple Silicon Mac: one `mps` device sharing the machine's memory.
fn apple_gpu() -> Option<Device> {
    if std::env::consts::OS != "macos" || std::env::consts::ARCH != "aarch64" {
        return None;
    }
    let chip = Command::new("sysctl")
        .args(["-n", "machdep.cpu.brand_string"])
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "Apple Silicon".into());
    Some(Device {
        kind: Accelerator::Mps,
        index: 0,
        name: format!("{chip} GPU (Metal)"),
        memory_bytes: memory_bytes(),
        uuid: None,
        compute_capability: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nvidia_smi_csv_becomes_devices_and_a_driver_version() {
        let text = "0, NVIDIA H200, 143771, GPU-0b1c2d3e-aaaa-bbbb-cccc-000000000000, 570.86.15, 9.0\n\
                    1, NVIDIA H200, 143771, GPU-0b1c2d3e-aaaa-bbbb-cccc-000000000001, 570.86.15, 9.0\n\
                    not a line\n";
        let (devices, driver) = parse_nvidia_smi(text, true);
        assert_eq!(devices.len(), 2);
        assert_eq!(devices[1].index, 1);
        assert_eq!(devices[1].name, "NVIDIA H200");
        assert_eq!(devices[1].memory_bytes, Some(143_771 * 1024 * 1024));
        assert_eq!(devices[1].compute_capability.as_deref(), Some("9.0"));
        assert!(devices[0].uuid.as_deref().unwrap().starts_with("GPU-"));
        assert_eq!(driver.as_deref(), Some("570.86.15"));
    }

    #[test]
    fn the_cuda_version_comes_from_the_banner() {
        let banner =
            "| NVIDIA-SMI 570.86.15   Driver Version: 570.86.15   CUDA Version: 12.8     |";
        assert_eq!(parse_cuda_version(banner).as_deref(), Some("12.8"));
        assert_eq!(parse_cuda_version("nothing"), None);
    }

    #[test]
    fn meminfo_total_is_read_in_bytes() {
        assert_eq!(
            parse_meminfo("MemTotal:       24576000 kB\nMemFree: 1 kB\n"),
            Some(24_576_000 * 1024)
        );
        assert_eq!(parse_meminfo("nothing"), None);
    }

    #[test]
    fn this_machine_reports_its_cpus_and_memory() {
        let inv = host_inventory();
        assert!(inv.cpus >= 1);
        assert!(inv.memory_bytes > 0);
        assert!(!inv.simulated);
    }
}
