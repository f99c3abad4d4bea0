//! Worker processes on this machine: each is `gpulayer join` as a child process with its own
//! work directory. Stopping sends SIGTERM, so the worker stops its jobs and deregisters.

use crate::{JoinTarget, ProvisionError, Provisioner, WorkerRequest};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;
use tokio::process::{Child, Command};

/// How long a worker gets to stop its jobs and deregister before it is killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(15);

#[derive(Debug)]
pub struct LocalProvisioner {
    /// The `gpulayer` binary to run.
    program: PathBuf,
    /// Each worker gets `<root>/<name>` as its work directory.
    root: PathBuf,
    children: BTreeMap<String, Child>,
}

impl LocalProvisioner {
    pub fn new(program: PathBuf, root: PathBuf) -> Self {
        Self {
            program,
            root,
            children: BTreeMap::new(),
        }
    }
}

impl Provisioner for LocalProvisioner {
    fn kind(&self) -> &'static str {
        "local"
    }

    async fn provision(
        &mut self,
        target: &JoinTarget,
        request: &WorkerRequest,
    ) -> Result<(), ProvisionError> {
        let spawn_err = |source| ProvisionError::Spawn {
            name: request.name.clone(),
            program: self.program.display().to_string(),
            source,
        };
        let work_dir = self.root.join(&request.name);
        std::fs::create_dir_all(&work_dir).map_err(spawn_err)?;
        let mut cmd = Command::new(&self.program);
        cmd.arg("join")
            .arg(&target.url)
            .args([
                "--name",
                &request.name,
                "--slots",
                &request.slots.to_string(),
            ])
            .arg("--work-dir")
            .arg(&work_dir)
            // The token goes by environment, not argv, so `ps` does not show it.
            .env("GPULAYER_JOIN_TOKEN", &target.join_token)
            .stdin(Stdio::null())
            .kill_on_drop(true);
        for (k, v) in &request.labels {
            cmd.arg("--label").arg(format!("{k}={v}"));
        }
        if let Some(f) = &target.fingerprint {
            cmd.arg("--fingerprint").arg(f);
        }
        let child = cmd.spawn().map_err(spawn_err)?;
        self.children.insert(request.name.clone(), child);
        Ok(())
    }

    async fn release(&mut self, name: &str) -> Result<(), ProvisionError> {
        let mut child = self
            .children
            .remove(name)
            .ok_or_else(|| ProvisionError::Unknown(name.to_string()))?;
        if let Some(pid) = child.id() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGTERM,
            );
        }
        match tokio::time::timeout(STOP_TIMEOUT, child.wait()).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(source)) => Err(ProvisionError::Stop {
                name: name.to_string(),
                source,
            }),
            Err(_) => child.kill().await.map_err(|source| ProvisionError::Stop {
                name: name.to_string(),
                source,
            }),
        }
    }

    fn running(&self) -> Vec<String> {
        self.children.keys().cloned().collect()
    }
}
