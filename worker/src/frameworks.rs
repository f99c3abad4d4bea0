//! Framework checks: for each of torch.cuda, jax.cuda, cupy.cuda, torch.mps and mlx, a
//! subprocess of the interpreter jobs run with imports the library, computes on the device
//! and checks the answer. Only a check that computed correctly makes a framework usable; an
//! import error, a CPU-only build, a broken driver, a crash or a hang is recorded with its
//! reason.
//!
//! Results are cached per interpreter and installed package versions (and driver), since an
//! import of torch or jax costs seconds; `refresh` runs them again.

use domain::{Accelerator, FrameworkCheck, Library};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

const CHECK_SCRIPT: &str = include_str!("framework_check.py");

/// A check that has not answered by then is stuck (a hung driver, usually).
pub const DEFAULT_CHECK_TIMEOUT: Duration = Duration::from_secs(120);

/// (name, library, device kind) of every check.
const CHECKS: [(&str, Library, Accelerator); 5] = [
    ("torch.cuda", Library::Torch, Accelerator::Cuda),
    ("jax.cuda", Library::Jax, Accelerator::Cuda),
    ("cupy.cuda", Library::Cupy, Accelerator::Cuda),
    ("torch.mps", Library::Torch, Accelerator::Mps),
    ("mlx", Library::Mlx, Accelerator::Mps),
];

/// Prints the interpreter and the versions of every package a check depends on: the cache
/// key. Cheap: no library is imported.
const KEY_SCRIPT: &str = r#"
import importlib.metadata as m, json, sys
names = ["torch", "jax", "jaxlib", "jax-cuda12-plugin", "jax-cuda13-plugin", "cupy", "cupy-cuda12x", "cupy-cuda13x", "cupy-cuda11x", "mlx", "nvidia-cuda-runtime-cu12", "nvidia-cuda-runtime"]
versions = {}
for n in names:
    try:
        versions[n] = m.version(n)
    except m.PackageNotFoundError:
        pass
print(json.dumps({"python": sys.executable, "version": sys.version, "packages": versions}, sort_keys=True))
"#;

#[derive(Debug, Clone)]
pub struct CheckOptions {
    /// The interpreter jobs run with.
    pub python: String,
    pub timeout: Duration,
    /// Where results are cached; None disables the cache.
    pub cache_file: Option<PathBuf>,
    /// Ignore the cache and check again.
    pub refresh: bool,
    /// Part of the cache key: a new driver can break or fix a framework.
    pub driver_version: Option<String>,
}

#[derive(Debug, Serialize, Deserialize)]
struct Cached {
    key: String,
    checks: Vec<FrameworkCheck>,
}

#[derive(Debug, Deserialize)]
struct CheckOutput {
    version: Option<String>,
    usable: bool,
    reason: Option<String>,
}

/// The checks that make sense here: CUDA ones everywhere (so a CUDA build on a machine
/// without a driver says so), Metal ones on Apple Silicon only.
fn applicable() -> Vec<(&'static str, Library, Accelerator)> {
    let apple = std::env::consts::OS == "macos" && std::env::consts::ARCH == "aarch64";
    CHECKS
        .into_iter()
        .filter(|(_, _, kind)| *kind == Accelerator::Cuda || apple)
        .collect()
}

async fn python_output(
    python: &str,
    args: &[&str],
    timeout: Duration,
) -> Result<std::process::Output, String> {
    let child = tokio::process::Command::new(python)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("cannot run {python}: {e} (install Python 3 or pass --python)"))?;
    match tokio::time::timeout(timeout, child.wait_with_output()).await {
        Ok(Ok(out)) => Ok(out),
        Ok(Err(e)) => Err(format!("{python} failed: {e}")),
        Err(_) => Err(format!(
            "the check did not finish within {} s (a hung driver?)",
            timeout.as_secs()
        )),
    }
}

async fn run_one(
    python: &str,
    name: &str,
    library: Library,
    device: Accelerator,
    timeout: Duration,
) -> FrameworkCheck {
    let failed = |reason: String| FrameworkCheck {
        library,
        device,
        version: None,
        usable: false,
        reason: Some(reason),
    };
    let out = match python_output(python, &["-c", CHECK_SCRIPT, name], timeout).await {
        Ok(out) => out,
        Err(reason) => return failed(reason),
    };
    let stdout = String::from_utf8_lossy(&out.stdout);
    let parsed = stdout
        .lines()
        .rev()
        .find_map(|l| serde_json::from_str::<CheckOutput>(l).ok());
    match parsed {
        Some(o) => FrameworkCheck {
            library,
            device,
            version: o.version,
            usable: o.usable,
            reason: if o.usable { None } else { o.reason },
        },
        None => {
            let stderr = String::from_utf8_lossy(&out.stderr);
            let last = stderr
                .lines()
                .rev()
                .find(|l| !l.trim().is_empty())
                .unwrap_or("no output");
            failed(format!("the {name} check crashed ({}): {last}", out.status))
        }
    }
}

/// The version of `python` (`3.11.7`), or None when it does not run.
pub async fn python_version(python: &str) -> Option<String> {
    let script = "import sys; print('%d.%d.%d' % sys.version_info[:3])";
    let out = python_output(python, &["-c", script], Duration::from_secs(30))
        .await
        .ok()?;
    let version = String::from_utf8_lossy(&out.stdout).trim().to_string();
    (out.status.success() && domain::CallSpec::minor_of(&version).is_some()).then_some(version)
}

/// Runs (or reads from the cache) every applicable check.
pub async fn check_frameworks(opts: &CheckOptions) -> Vec<FrameworkCheck> {
    let key = match python_output(&opts.python, &["-c", KEY_SCRIPT], opts.timeout).await {
        Ok(out) if out.status.success() => {
            format!(
                "{}|driver={:?}",
                String::from_utf8_lossy(&out.stdout).trim(),
                opts.driver_version
            )
        }
        Ok(out) => {
            let reason = format!(
                "{} cannot run: {}",
                opts.python,
                String::from_utf8_lossy(&out.stderr).trim()
            );
            return unusable_everywhere(&reason);
        }
        Err(reason) => return unusable_everywhere(&reason),
    };
    if !opts.refresh
        && let Some(cached) = read_cache(opts, &key)
    {
        return cached;
    }
    let runs = applicable()
        .into_iter()
        .map(|(name, library, device)| run_one(&opts.python, name, library, device, opts.timeout));
    let checks: Vec<FrameworkCheck> = futures_util::future::join_all(runs).await;
    write_cache(opts, &key, &checks);
    checks
}

fn unusable_everywhere(reason: &str) -> Vec<FrameworkCheck> {
    applicable()
        .into_iter()
        .map(|(_, library, device)| FrameworkCheck {
            library,
            device,
            version: None,
            usable: false,
            reason: Some(reason.to_string()),
        })
        .collect()
}

fn read_cache(opts: &CheckOptions, key: &str) -> Option<Vec<FrameworkCheck>> {
    let path = opts.cache_file.as_ref()?;
    let cached: Cached = serde_json::from_str(&std::fs::read_to_string(path).ok()?).ok()?;
    (cached.key == key).then_some(cached.checks)
}

fn write_cache(opts: &CheckOptions, key: &str, checks: &[FrameworkCheck]) {
    let Some(path) = &opts.cache_file else { return };
    let cached = Cached {
        key: key.to_string(),
        checks: checks.to_vec(),
    };
    if let Some(dir) = path.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    if let Ok(text) = serde_json::to_string_pretty(&cached) {
        let _ = std::fs::write(path, text);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(python: &str) -> CheckOptions {
        CheckOptions {
            python: python.into(),
            timeout: Duration::from_secs(60),
            cache_file: None,
            refresh: false,
            driver_version: None,
        }
    }

    #[tokio::test]
    async fn a_missing_interpreter_makes_every_check_unusable_with_the_reason() {
        let checks = check_frameworks(&opts("/no/such/python3")).await;
        assert!(!checks.is_empty());
        for c in checks {
            assert!(!c.usable);
            assert!(
                c.reason
                    .as_deref()
                    .unwrap()
                    .contains("cannot run /no/such/python3"),
                "{c:?}"
            );
        }
    }

    #[tokio::test]
    async fn a_library_that_is_not_installed_is_reported_as_such() {
        // cupy is not installed by the test set-up (torch is; see scripts/test).
        let checks = check_frameworks(&opts("python3")).await;
        let cupy = checks.iter().find(|c| c.library == Library::Cupy).unwrap();
        assert!(!cupy.usable);
        assert_eq!(cupy.version, None);
        assert_eq!(cupy.reason.as_deref(), Some("cupy is not installed"));
    }
}
