//! Job and task states and the legal transitions between them (see docs/state_machine.md).

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

macro_rules! state_enum {
    ($name:ident, $what:literal) => {
        impl $name {
            pub fn as_str(self) -> &'static str {
                match self {
                    Self::Pending => "pending",
                    Self::Assigned => "assigned",
                    Self::Running => "running",
                    Self::Succeeded => "succeeded",
                    Self::Failed => "failed",
                    Self::Cancelled => "cancelled",
                }
            }

            /// No transition leaves a terminal state.
            pub fn is_terminal(self) -> bool {
                matches!(self, Self::Succeeded | Self::Failed | Self::Cancelled)
            }

            pub const ALL: [Self; 6] = [
                Self::Pending,
                Self::Assigned,
                Self::Running,
                Self::Succeeded,
                Self::Failed,
                Self::Cancelled,
            ];
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl FromStr for $name {
            type Err = String;
            fn from_str(s: &str) -> Result<Self, String> {
                Self::ALL.into_iter().find(|v| v.as_str() == s).ok_or_else(|| {
                    format!(
                        "unknown {} state '{s}': use one of pending, assigned, running, succeeded, failed, cancelled",
                        $what
                    )
                })
            }
        }
    };
}

/// Where a job is in its life. A single-task job's state is its task's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum JobState {
    Pending,
    Assigned,
    Running,
    Succeeded,
    Failed,
    Cancelled,
}
state_enum!(JobState, "job");

/// Where one task (one process group on one worker) is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TaskState {
    Pending,
    Assigned,
    Running,
    Succeeded,
    Failed,
    Cancelled,
}
state_enum!(TaskState, "task");

impl TaskState {
    /// Whether a task may move from `self` to `next`.
    ///
    /// `Running -> Pending` is the retry path after a lost worker; `Assigned -> Pending`
    /// is a worker handing back work it could not start.
    pub fn can_become(self, next: TaskState) -> bool {
        use TaskState::*;
        matches!(
            (self, next),
            (Pending, Assigned | Cancelled | Failed)
                | (Assigned, Running | Pending | Succeeded | Failed | Cancelled)
                | (Running, Succeeded | Failed | Cancelled | Pending)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn terminal_states_have_no_way_out() {
        for from in TaskState::ALL.into_iter().filter(|s| s.is_terminal()) {
            for to in TaskState::ALL {
                assert!(!from.can_become(to), "{from} -> {to}");
            }
        }
    }

    #[test]
    fn the_happy_path_and_the_retry_path_are_legal() {
        use TaskState::*;
        for (from, to) in [
            (Pending, Assigned),
            (Assigned, Running),
            (Running, Succeeded),
            (Running, Pending),
        ] {
            assert!(from.can_become(to), "{from} -> {to}");
        }
        assert!(
            !Pending.can_become(Running),
            "a task must be assigned before it runs"
        );
    }

    #[test]
    fn states_round_trip_through_their_names() {
        for s in JobState::ALL {
            assert_eq!(s.as_str().parse::<JobState>().unwrap(), s);
        }
        assert!(
            "done"
                .parse::<JobState>()
                .unwrap_err()
                .contains("use one of")
        );
    }
}
