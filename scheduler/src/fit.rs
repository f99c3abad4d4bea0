//! Whether one worker can run one job, and if not, why: one [`Reason`] per worker, in the
//! words `gpulayer` prints.

use domain::{Accelerator, FrameworkSpec, Inventory, JobSpec, Library, Version};
use std::collections::BTreeMap;
use std::fmt;

/// Why a worker cannot take a job. `Display` is the line printed for that worker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reason {
    /// Too few devices of the kind at all.
    NeedsDevices {
        kind: Accelerator,
        needed: u32,
        has: u32,
    },
    /// Enough devices, but too few with the memory asked for.
    NeedsDeviceMemory {
        kind: Accelerator,
        needed: u32,
        bytes: u64,
        has: u32,
        largest: Option<u64>,
    },
    FrameworkMissing {
        library: Library,
    },
    FrameworkVersion {
        library: Library,
        version: String,
        wanted: String,
    },
    /// Installed, but its check on this device kind failed (or it never runs there).
    FrameworkUnusable {
        library: Library,
        kind: Accelerator,
    },
    LabelMismatch {
        key: String,
        wanted: String,
        has: Option<String>,
    },
    /// A remote call pickled by one Python minor version, on a worker running another.
    PythonVersion {
        worker: String,
        caller: String,
    },
    /// The worker is not connected (its lease ran out).
    Offline,
    /// It could run it, but every slot is busy right now.
    Busy {
        slots: u32,
    },
    /// It could run it, but not enough of its devices are free right now.
    DevicesBusy {
        kind: Accelerator,
        needed: u32,
        free: u32,
    },
}

fn gib(bytes: u64) -> String {
    format!("{:.1} GiB", bytes as f64 / f64::from(1u32 << 30))
}

fn kind_upper(kind: Accelerator) -> String {
    kind.as_str().to_ascii_uppercase()
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reason::NeedsDevices { kind, needed, has } => {
                write!(
                    f,
                    "needs {needed} usable {kind} device(s), worker has {has}"
                )
            }
            Reason::NeedsDeviceMemory {
                kind,
                needed,
                bytes,
                has,
                largest,
            } => {
                write!(
                    f,
                    "needs {needed} {kind} device(s) with {} each, worker has {has}",
                    gib(*bytes)
                )?;
                if let Some(l) = largest {
                    write!(f, " (largest {})", gib(*l))?;
                }
                Ok(())
            }
            Reason::FrameworkMissing { library } => {
                write!(f, "framework '{library}' not installed")
            }
            Reason::FrameworkVersion {
                library,
                version,
                wanted,
            } => {
                write!(
                    f,
                    "framework '{library}' {version} does not satisfy {wanted}"
                )
            }
            Reason::FrameworkUnusable { library, kind } => {
                write!(
                    f,
                    "{library} on this worker cannot use {}",
                    kind_upper(*kind)
                )
            }
            Reason::LabelMismatch {
                key,
                wanted,
                has: Some(has),
            } => {
                write!(f, "label {key}={wanted} wanted, worker has {key}={has}")
            }
            Reason::LabelMismatch {
                key,
                wanted,
                has: None,
            } => {
                write!(f, "label {key}={wanted} wanted, worker has no label {key}")
            }
            Reason::PythonVersion { worker, caller } => write!(
                f,
                "runs Python {worker}, the caller runs {caller} (cloudpickle needs the same minor version)"
            ),
            Reason::Offline => f.write_str("worker is offline"),
            Reason::Busy { slots } => write!(f, "all {slots} slot(s) busy"),
            Reason::DevicesBusy { kind, needed, free } => {
                write!(f, "needs {needed} free {kind} device(s), {free} free now")
            }
        }
    }
}

impl Reason {
    /// Whether the worker could take the job once it frees up (as opposed to never).
    pub fn is_temporary(&self) -> bool {
        matches!(
            self,
            Reason::Busy { .. } | Reason::Offline | Reason::DevicesBusy { .. }
        )
    }
}

/// The devices of the job's kind with enough memory, by index.
pub(crate) fn suitable_devices(inventory: &Inventory, spec: &JobSpec) -> Vec<u32> {
    let min = spec.requirements.min_device_memory_bytes.unwrap_or(0);
    inventory
        .devices
        .iter()
        .filter(|d| d.kind == spec.accelerator)
        .filter(|d| min == 0 || d.memory_bytes.is_some_and(|m| m >= min))
        .map(|d| d.index)
        .collect()
}

fn check_framework(
    inventory: &Inventory,
    accelerator: Accelerator,
    want: &FrameworkSpec,
) -> Result<(), Reason> {
    let library = want.library;
    let Some(version) = inventory.framework_version(library) else {
        return Err(Reason::FrameworkMissing { library });
    };
    if !want.versions.is_any() {
        let ok = Version::parse(version).is_ok_and(|v| want.versions.matches(&v));
        if !ok {
            return Err(Reason::FrameworkVersion {
                library,
                version: version.to_string(),
                wanted: want.versions.to_string(),
            });
        }
    }
    if accelerator.needs_device() {
        let usable = inventory
            .framework(library, accelerator)
            .is_some_and(|c| c.usable);
        if !usable {
            return Err(Reason::FrameworkUnusable {
                library,
                kind: accelerator,
            });
        }
    }
    Ok(())
}

/// Checks the job's needs against what the worker has, ignoring what is busy right now.
/// Hardware first (the most telling reason), then frameworks, then labels.
pub fn check(
    inventory: &Inventory,
    labels: &BTreeMap<String, String>,
    spec: &JobSpec,
) -> Result<(), Reason> {
    let kind = spec.accelerator;
    let needed = spec.devices_per_node();
    if needed > 0 {
        let has = inventory.count(kind) as u32;
        if has < needed {
            return Err(Reason::NeedsDevices { kind, needed, has });
        }
        if let Some(bytes) = spec.requirements.min_device_memory_bytes {
            let big_enough = suitable_devices(inventory, spec).len() as u32;
            if big_enough < needed {
                let largest = inventory
                    .devices
                    .iter()
                    .filter(|d| d.kind == kind)
                    .filter_map(|d| d.memory_bytes)
                    .max();
                return Err(Reason::NeedsDeviceMemory {
                    kind,
                    needed,
                    bytes,
                    has: big_enough,
                    largest,
                });
            }
        }
    }
    for want in &spec.requirements.frameworks {
        check_framework(inventory, kind, want)?;
    }
    // A worker that did not say (a recorded inventory) is given the benefit of the doubt.
    if let (Some(call), Some(version)) = (&spec.call, &inventory.python)
        && domain::CallSpec::minor_of(version) != Some(call.python.as_str())
    {
        return Err(Reason::PythonVersion {
            worker: version.clone(),
            caller: call.python.clone(),
        });
    }
    for selector in &spec.requirements.labels {
        let has = labels.get(&selector.key);
        if has != Some(&selector.value) {
            return Err(Reason::LabelMismatch {
                key: selector.key.clone(),
                wanted: selector.value.clone(),
                has: has.cloned(),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use domain::fixtures::{cuda_inventory, inventory, job};
    use domain::{FrameworkCheck, LabelSelector, Requirements};

    fn with(accelerator: Accelerator, requirements: Requirements) -> JobSpec {
        JobSpec {
            requirements,
            ..job(accelerator)
        }
    }

    fn frameworks(inv: &mut Inventory, checks: &[(Library, Accelerator, Option<&str>, bool)]) {
        inv.frameworks = checks
            .iter()
            .map(|(library, device, version, usable)| FrameworkCheck {
                library: *library,
                device: *device,
                version: version.map(str::to_string),
                usable: *usable,
                reason: (!usable).then(|| "no".to_string()),
            })
            .collect();
    }

    #[test]
    fn every_reason_reads_as_the_cli_prints_it() {
        use Accelerator::*;
        let mut box1 = cuda_inventory("gpu-box-1", 1);
        frameworks(
            &mut box1,
            &[
                (Library::Torch, Cuda, Some("2.5.1+cu124"), true),
                (Library::Jax, Cuda, Some("0.3.1"), true),
            ],
        );
        let mut laptop = inventory("laptop", &[]);
        frameworks(
            &mut laptop,
            &[(Library::Torch, Cuda, Some("2.5.1+cpu"), false)],
        );
        let mut mac = inventory("mac-studio", &[Mps]);
        frameworks(
            &mut mac,
            &[
                (Library::Mlx, Mps, Some("0.21.0"), true),
                (Library::Torch, Mps, Some("2.5.1"), true),
            ],
        );
        let labels: BTreeMap<String, String> =
            [("zone".to_string(), "us-east1-b".to_string())].into();
        let none = BTreeMap::new();
        let fw = |s: &str| FrameworkSpec::parse(s).unwrap();

        type Case<'a> = (
            &'a Inventory,
            &'a BTreeMap<String, String>,
            JobSpec,
            Result<(), &'a str>,
        );
        let cases: Vec<Case> = vec![
            (
                &box1,
                &none,
                with(
                    Cuda,
                    Requirements {
                        devices: Some(2),
                        ..Default::default()
                    },
                ),
                Err("needs 2 usable cuda device(s), worker has 1"),
            ),
            (&box1, &none, with(Cuda, Requirements::default()), Ok(())),
            (
                &mac,
                &none,
                with(Cuda, Requirements::default()),
                Err("needs 1 usable cuda device(s), worker has 0"),
            ),
            (
                &mac,
                &none,
                with(
                    Mps,
                    Requirements {
                        frameworks: vec![fw("jax")],
                        ..Default::default()
                    },
                ),
                Err("framework 'jax' not installed"),
            ),
            (
                &mac,
                &none,
                with(
                    Mps,
                    Requirements {
                        frameworks: vec![fw("mlx>=0.10")],
                        ..Default::default()
                    },
                ),
                Ok(()),
            ),
            (
                &mac,
                &none,
                with(
                    Mps,
                    Requirements {
                        frameworks: vec![fw("mlx>=1.0")],
                        ..Default::default()
                    },
                ),
                Err("framework 'mlx' 0.21.0 does not satisfy >=1.0"),
            ),
            (
                &laptop,
                &none,
                with(
                    Cpu,
                    Requirements {
                        frameworks: vec![fw("torch>=2")],
                        ..Default::default()
                    },
                ),
                Ok(()),
            ),
            (
                &box1,
                &none,
                with(
                    Cuda,
                    Requirements {
                        frameworks: vec![fw("jax>=0.4")],
                        ..Default::default()
                    },
                ),
                Err("framework 'jax' 0.3.1 does not satisfy >=0.4"),
            ),
            (
                &box1,
                &none,
                with(
                    Cuda,
                    Requirements {
                        frameworks: vec![fw("cupy")],
                        ..Default::default()
                    },
                ),
                Err("framework 'cupy' not installed"),
            ),
            (
                &box1,
                &none,
                with(
                    Cuda,
                    Requirements {
                        min_device_memory_bytes: Some(40 << 30),
                        ..Default::default()
                    },
                ),
                Err("needs 1 cuda device(s) with 40.0 GiB each, worker has 0 (largest 16.0 GiB)"),
            ),
            (
                &box1,
                &labels,
                with(
                    Any,
                    Requirements {
                        labels: vec![LabelSelector::parse("zone=europe-west1-b").unwrap()],
                        ..Default::default()
                    },
                ),
                Err("label zone=europe-west1-b wanted, worker has zone=us-east1-b"),
            ),
            (
                &box1,
                &none,
                with(
                    Any,
                    Requirements {
                        labels: vec![LabelSelector::parse("zone=a").unwrap()],
                        ..Default::default()
                    },
                ),
                Err("label zone=a wanted, worker has no label zone"),
            ),
            (
                &box1,
                &labels,
                with(
                    Any,
                    Requirements {
                        labels: vec![LabelSelector::parse("zone=us-east1-b").unwrap()],
                        ..Default::default()
                    },
                ),
                Ok(()),
            ),
        ];
        for (inv, labels, spec, expect) in cases {
            let got = check(inv, labels, &spec).map_err(|r| r.to_string());
            assert_eq!(
                got,
                expect.map_err(str::to_string),
                "{} running {:?}",
                inv.hostname,
                spec.requirements
            );
        }
        // The laptop's torch cannot use CUDA: the worker checked and it failed.
        let mut with_gpu = laptop.clone();
        with_gpu.devices = cuda_inventory("x", 1).devices;
        let spec = with(
            Cuda,
            Requirements {
                frameworks: vec![fw("torch")],
                ..Default::default()
            },
        );
        assert_eq!(
            check(&with_gpu, &none, &spec).unwrap_err().to_string(),
            "torch on this worker cannot use CUDA"
        );
    }

    #[test]
    fn a_call_goes_only_where_python_has_the_callers_minor_version() {
        let call = |python: &str| JobSpec {
            call: Some(domain::CallSpec {
                function: domain::Digest::parse(&"a".repeat(64)).unwrap(),
                args: String::new(),
                python: python.into(),
            }),
            ..job(Accelerator::Any)
        };
        let none = BTreeMap::new();
        let with_python = |v: Option<&str>| Inventory {
            python: v.map(str::to_string),
            ..inventory("w", &[])
        };
        let cases = [
            (Some("3.11.7"), "3.11", Ok(())),
            (Some("3.11.0rc1"), "3.11", Ok(())),
            (
                Some("3.12.1"),
                "3.11",
                Err(
                    "runs Python 3.12.1, the caller runs 3.11 (cloudpickle needs the same minor version)",
                ),
            ),
            (
                Some("3.1.0"),
                "3.11",
                Err(
                    "runs Python 3.1.0, the caller runs 3.11 (cloudpickle needs the same minor version)",
                ),
            ),
            // A recorded inventory that does not say: allowed.
            (None, "3.11", Ok(())),
        ];
        for (worker, caller, expect) in cases {
            let got = check(&with_python(worker), &none, &call(caller)).map_err(|r| r.to_string());
            assert_eq!(
                got,
                expect.map_err(str::to_string),
                "{worker:?} vs {caller}"
            );
        }
        // A command job does not care.
        assert_eq!(
            check(&with_python(Some("2.7.18")), &none, &job(Accelerator::Any)),
            Ok(())
        );
    }
}
