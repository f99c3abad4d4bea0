//! Process groups: a job's command runs as the leader of its own group so that stopping it
//! reaches every child and grandchild it started.

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::time::Duration;

/// How long a stopped job gets between SIGTERM and SIGKILL. Short, because a cancel must
/// take effect within a second.
pub const STOP_GRACE: Duration = Duration::from_millis(500);

/// Sends `signal` to the whole group led by `pid`. A group that is already gone is fine.
pub fn signal_group(pid: u32, signal: Signal) {
    let _ = killpg(Pid::from_raw(pid as i32), signal);
}

/// The shell convention: the exit code, or 128 + the signal that killed it.
pub fn exit_code(status: ExitStatus) -> i32 {
    status
        .code()
        .or_else(|| status.signal().map(|s| 128 + s))
        .unwrap_or(-1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_follow_the_shell_convention() {
        let ok = std::process::Command::new("sh")
            .args(["-c", "exit 3"])
            .status()
            .unwrap();
        assert_eq!(exit_code(ok), 3);
        let killed = std::process::Command::new("sh")
            .args(["-c", "kill -9 $$"])
            .status()
            .unwrap();
        assert_eq!(exit_code(killed), 137);
    }
}
