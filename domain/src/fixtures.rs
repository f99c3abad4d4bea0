//! Small values for tests in every crate: a worker inventory with N devices, a trivial job.
//! Compiled only for this crate's tests and for crates that enable the `fixtures` feature
//! in their dev-dependencies.

use crate::{Accelerator, Command, Device, Inventory, JobSpec};

/// A Linux worker named `name` with one device of each kind listed.
pub fn inventory(name: &str, devices: &[Accelerator]) -> Inventory {
    Inventory {
        hostname: name.to_string(),
        os: "linux".into(),
        arch: "x86_64".into(),
        cpus: 8,
        memory_bytes: 1 << 34,
        devices: devices
            .iter()
            .enumerate()
            .map(|(i, kind)| Device {
                kind: *kind,
                index: i as u32,
                name: "gpu".into(),
                memory_bytes: Some(16 << 30),
                uuid: Some(format!("GPU-{name}-{i}")),
                compute_capability: None,
            })
            .collect(),
        driver_version: None,
        cuda_version: None,
        topology: None,
        frameworks: vec![],
        python: None,
        simulated: true,
    }
}

/// A worker with `n` CUDA devices.
pub fn cuda_inventory(name: &str, n: usize) -> Inventory {
    inventory(name, &vec![Accelerator::Cuda; n])
}

/// `true`, asking for `accelerator`.
pub fn job(accelerator: Accelerator) -> JobSpec {
    JobSpec {
        name: None,
        command: Command::parse(vec!["true".into()]).expect("a valid command"),
        accelerator,
        source: None,
        outputs: vec![],
        env: vec![],
        requirements: Default::default(),
        retries: None,
        retry_failed: false,
        priority: 0,
        timeout_seconds: None,
        layout: Default::default(),
        call: None,
    }
}
