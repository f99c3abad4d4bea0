//! What this machine has: host facts and accelerator devices.
//!
//! CUDA devices are listed with `nvidia-smi` when it is installed. (Checking that each
//! framework really runs on them, and NVML, come with the hardware-truth work.)

use domain::{Accelerator, Device, Inventory};
use std::process::Command;

pub fn inventory() -> Inventory {
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
        devices: cuda_devices().into_iter().chain(mps_device()).collect(),
    }
}

fn memory_bytes() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    parse_meminfo(&text)
}

fn parse_meminfo(text: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

fn cuda_devices() -> Vec<Device> {
    let out = Command::new("nvidia-smi")
        .args([
            "--query-gpu=index,name,memory.total",
            "--format=csv,noheader,nounits",
        ])
        .output();
    match out {
        Ok(o) if o.status.success() => parse_nvidia_smi(&String::from_utf8_lossy(&o.stdout)),
        _ => vec![],
    }
}

fn parse_nvidia_smi(text: &str) -> Vec<Device> {
    text.lines()
        .filter_map(|line| {
            let mut parts = line.split(',').map(str::trim);
            let index = parts.next()?.parse().ok()?;
            let name = parts.next()?.to_string();
            let memory_mib: Option<u64> = parts.next().and_then(|m| m.parse().ok());
            Some(Device {
                kind: Accelerator::Cuda,
                index,
                name,
                memory_bytes: memory_mib.map(|m| m * 1024 * 1024),
            })
        })
        .collect()
}

fn mps_device() -> Option<Device> {
    (std::env::consts::OS == "macos" && std::env::consts::ARCH == "aarch64").then(|| Device {
        kind: Accelerator::Mps,
        index: 0,
        name: "Apple Silicon GPU".into(),
        memory_bytes: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nvidia_smi_csv_becomes_devices() {
        let text = "0, NVIDIA H200, 143771\n1, NVIDIA H200, 143771\nnot a line\n";
        let devices = parse_nvidia_smi(text);
        assert_eq!(devices.len(), 2);
        assert_eq!(devices[1].index, 1);
        assert_eq!(devices[1].name, "NVIDIA H200");
        assert_eq!(devices[1].memory_bytes, Some(143_771 * 1024 * 1024));
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
        let inv = inventory();
        assert!(inv.cpus >= 1);
        assert!(inv.memory_bytes > 0, "Linux has /proc/meminfo");
    }
}
