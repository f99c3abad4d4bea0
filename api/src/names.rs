//! Names people give things (workers, tokens): short plain words that read the same in a
//! table, a log line and a shell.

/// The longest a name may be.
const MAX_NAME: usize = 64;

/// Checks `name`, the name of a `what` ("worker", "token"): 1-64 of `A-Z a-z 0-9 . _ -`.
pub fn check_plain_name(what: &str, name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > MAX_NAME {
        return Err(format!(
            "a {what} name is 1 to {MAX_NAME} characters, not {}",
            name.len()
        ));
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        return Err(format!(
            "a {what} name may hold letters, digits, '.', '_' and '-', not {c:?}"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_short_plain_words() {
        for ok in [
            "ci",
            "claude-code",
            "alice.laptop",
            "a_b-1",
            &"x".repeat(64),
        ] {
            assert_eq!(check_plain_name("token", ok), Ok(()), "{ok}");
        }
        for (bad, why) in [
            ("", "a worker name is 1 to 64 characters, not 0"),
            (&"x".repeat(65), "1 to 64 characters, not 65"),
            ("two words", "not ' '"),
            ("semi;colon", "not ';'"),
            ("naïve", "not 'ï'"),
        ] {
            let err = check_plain_name("worker", bad).unwrap_err();
            assert!(err.contains(why), "{bad}: {err}");
        }
    }
}
