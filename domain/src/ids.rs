//! Typed ids, so a job id can never be passed where a worker id is expected.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

macro_rules! int_id {
    ($name:ident, $inner:ty, $what:literal) => {
        #[doc = concat!("The id of a ", $what, ".")]
        #[derive(
            Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
        )]
        #[serde(transparent)]
        pub struct $name(pub $inner);

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.0.fmt(f)
            }
        }

        impl FromStr for $name {
            type Err = crate::SpecError;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                s.trim()
                    .parse::<$inner>()
                    .ok()
                    .filter(|n| *n >= 0)
                    .map($name)
                    .ok_or_else(|| crate::SpecError::BadId {
                        what: $what,
                        given: s.to_string(),
                    })
            }
        }
    };
}

int_id!(JobId, i64, "job");
int_id!(TaskId, i64, "task");
int_id!(WorkerId, i64, "worker");
int_id!(Attempt, i32, "attempt");

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn job_ids_parse_from_plain_numbers_only() {
        assert_eq!("42".parse::<JobId>().unwrap(), JobId(42));
        assert_eq!(" 7 ".parse::<JobId>().unwrap(), JobId(7));
        let err = "j-42".parse::<JobId>().unwrap_err();
        assert_eq!(
            err.to_string(),
            "'j-42' is not a job id (job ids are numbers, as `gpulayer jobs` shows them)"
        );
        assert!("-1".parse::<JobId>().is_err());
    }
}
