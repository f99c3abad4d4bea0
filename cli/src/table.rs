//! Human output: aligned tables, durations, sizes.

use chrono::{DateTime, Utc};

/// Prints rows under a header with columns padded to their widest cell; the last column is
/// left unpadded so long commands do not push lines wide.
pub(crate) fn print(header: &[&str], rows: &[Vec<String>]) {
    let cols = header.len();
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate().take(cols) {
            widths[i] = widths[i].max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let mut out = String::new();
        for (i, cell) in cells.iter().enumerate() {
            if i + 1 == cols {
                out.push_str(cell);
            } else {
                out.push_str(&format!("{cell:<w$}  ", w = widths[i]));
            }
        }
        println!("{}", out.trim_end());
    };
    line(header.to_vec());
    for row in rows {
        line(row.iter().map(String::as_str).collect());
    }
}

/// "3s", "4m12s", "2h05m", "3d4h".
pub(crate) fn duration(secs: i64) -> String {
    let s = secs.max(0);
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        3600..86400 => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
        _ => format!("{}d{}h", s / 86400, (s % 86400) / 3600),
    }
}

pub(crate) fn ago(t: DateTime<Utc>) -> String {
    format!("{} ago", duration((Utc::now() - t).num_seconds()))
}

pub(crate) fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = n as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_naturally() {
        for (secs, expect) in [
            (0, "0s"),
            (59, "59s"),
            (61, "1m01s"),
            (3725, "1h02m"),
            (90000, "1d1h"),
        ] {
            assert_eq!(duration(secs), expect);
        }
    }

    #[test]
    fn sizes_use_binary_units() {
        for (n, expect) in [
            (12, "12 B"),
            (2048, "2.0 KiB"),
            (5 * 1024 * 1024 + 1, "5.0 MiB"),
        ] {
            assert_eq!(bytes(n), expect);
        }
    }
}
