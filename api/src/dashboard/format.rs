//! How the dashboard writes times, sizes and commands for people.

use chrono::{DateTime, Utc};

/// `3s ago`, `5m ago`, `2h ago`, `4d ago`.
pub(crate) fn ago(at: DateTime<Utc>, now: DateTime<Utc>) -> String {
    let secs = (now - at).num_seconds().max(0);
    match secs {
        0..=59 => format!("{secs}s ago"),
        60..=3599 => format!("{}m ago", secs / 60),
        3600..=86_399 => format!("{}h ago", secs / 3600),
        _ => format!("{}d ago", secs / 86_400),
    }
}

/// `0.4s`, `12s`, `3m 05s`, `2h 10m`.
pub(crate) fn duration(secs: f64) -> String {
    let secs = secs.max(0.0);
    if secs < 10.0 {
        return format!("{secs:.1}s");
    }
    let s = secs as u64;
    match s {
        0..=59 => format!("{s}s"),
        60..=3599 => format!("{}m {:02}s", s / 60, s % 60),
        _ => format!("{}h {:02}m", s / 3600, (s % 3600) / 60),
    }
}

/// How long a job ran (so far, when it still runs): from its start to its end or `now`.
pub(crate) fn runtime(
    started: Option<DateTime<Utc>>,
    finished: Option<DateTime<Utc>>,
    now: DateTime<Utc>,
) -> String {
    match started {
        Some(s) => duration((finished.unwrap_or(now) - s).num_milliseconds() as f64 / 1000.0),
        None => "-".into(),
    }
}

/// `2026-12-01 21:45:55 UTC`.
pub(crate) fn timestamp(at: Option<DateTime<Utc>>) -> String {
    at.map(|t| t.format("%Y-%m-%d %H:%M:%S UTC").to_string())
        .unwrap_or_else(|| "-".into())
}

/// `512 B`, `3.2 MiB`, `80 GiB`.
pub(crate) fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = n as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 || value >= 10.0 {
        format!("{value:.0} {}", UNITS[unit])
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

/// An argv as a shell line: arguments with spaces or quotes are quoted.
pub(crate) fn command(argv: &[String]) -> String {
    argv.iter()
        .map(|a| {
            if !a.is_empty()
                && a.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_./=:,@%+".contains(c))
            {
                a.clone()
            } else {
                format!("'{}'", a.replace('\'', r"'\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_sizes_and_commands_read_as_people_write_them() {
        let now = Utc::now();
        let table = [
            (5, "5s ago"),
            (125, "2m ago"),
            (7300, "2h ago"),
            (200_000, "2d ago"),
        ];
        for (secs, want) in table {
            assert_eq!(ago(now - chrono::Duration::seconds(secs), now), want);
        }
        assert_eq!(duration(0.42), "0.4s");
        assert_eq!(duration(185.0), "3m 05s");
        assert_eq!(duration(7860.0), "2h 11m");
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(3 * 1024 * 1024 + 300_000), "3.3 MiB");
        assert_eq!(bytes(80 << 30), "80 GiB");
        let argv = [
            "python".to_string(),
            "-c".into(),
            "print('hi there')".into(),
        ];
        assert_eq!(command(&argv), r"python -c 'print('\''hi there'\'')'");
        assert_eq!(runtime(None, None, now), "-");
    }
}
