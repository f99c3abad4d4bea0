//! The dashboard's pictures as server-rendered SVG (no script): the queue over the last hour
//! and each worker's devices (or slots) held by jobs over the last hour.

use chrono::{DateTime, Utc};
use std::fmt::Write;

/// Plot width and the label column beside it, in SVG units (the page scales them).
const WIDTH: f64 = 720.0;
const LABEL: f64 = 80.0;

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// Where `at` falls between `from` and `to`, 0 to 1.
fn position(at: DateTime<Utc>, from: DateTime<Utc>, to: DateTime<Utc>) -> f64 {
    let span = (to - from).num_milliseconds().max(1) as f64;
    ((at - from).num_milliseconds() as f64 / span).clamp(0.0, 1.0)
}

/// A time axis under a plot of `height`: the window's start, middle and end.
fn time_axis(svg: &mut String, height: f64, minutes: i64) {
    let y = height + 12.0;
    let _ = write!(
        svg,
        r#"<g class="axis"><text x="{LABEL}" y="{y}">-{minutes} min</text><text x="{}" y="{y}" text-anchor="middle">-{} min</text><text x="{}" y="{y}" text-anchor="end">now</text></g>"#,
        LABEL + WIDTH / 2.0,
        minutes / 2,
        LABEL + WIDTH
    );
}

/// One task's hold on one lane of a worker, as a picture draws it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Hold {
    pub lane: usize,
    pub from: DateTime<Utc>,
    pub to: Option<DateTime<Utc>>,
    pub job: i64,
    pub state: String,
}

/// Lanes (a worker's devices or slots, by name) and what held them between `from` and
/// `to`, one bar per hold, each titled with its job.
pub(crate) fn occupancy(
    lanes: &[String],
    holds: &[Hold],
    from: DateTime<Utc>,
    to: DateTime<Utc>,
) -> String {
    const LANE: f64 = 16.0;
    let height = LANE * lanes.len().max(1) as f64;
    let mut svg = format!(
        r#"<svg class="chart occupancy" viewBox="0 0 {} {}" role="img" aria-label="devices held over the last hour">"#,
        LABEL + WIDTH + 4.0,
        height + 16.0
    );
    for (i, name) in lanes.iter().enumerate() {
        let y = i as f64 * LANE;
        let _ = write!(
            svg,
            r#"<text class="lane" x="0" y="{}">{}</text><rect class="free" x="{LABEL}" y="{}" width="{WIDTH}" height="{}"/>"#,
            y + 12.0,
            escape(name),
            y + 1.0,
            LANE - 2.0
        );
    }
    // Holds closer than a pixel merge into one bar (thousands of short tasks on a lane are
    // a solid run, not thousands of slivers), titled with how many jobs and the first few.
    let mut lanes_holds: Vec<Vec<&Hold>> = vec![Vec::new(); lanes.len()];
    for h in holds.iter().filter(|h| h.lane < lanes.len()) {
        lanes_holds[h.lane].push(h);
    }
    for (lane, mut list) in lanes_holds.into_iter().enumerate() {
        list.sort_by_key(|h| h.from);
        let mut runs: Vec<(f64, f64, Vec<&Hold>)> = Vec::new();
        for h in list {
            let start = position(h.from, from, to) * WIDTH;
            let end = (position(h.to.unwrap_or(to), from, to) * WIDTH).max(start + 1.0);
            match runs.last_mut() {
                Some(run) if start <= run.1 + 1.0 => {
                    run.1 = run.1.max(end);
                    run.2.push(h);
                }
                _ => runs.push((start, end, vec![h])),
            }
        }
        for (start, end, members) in runs {
            let (class, title) = match members.as_slice() {
                [one] => (
                    escape(&one.state),
                    format!("job {} ({})", one.job, escape(&one.state)),
                ),
                many => {
                    let first: Vec<String> = many
                        .iter()
                        .take(5)
                        .map(|h| format!("job {} ({})", h.job, escape(&h.state)))
                        .collect();
                    let more = if many.len() > 5 { ", …" } else { "" };
                    (
                        "many".to_string(),
                        format!("{} jobs: {}{more}", many.len(), first.join(", ")),
                    )
                }
            };
            let _ = write!(
                svg,
                r#"<rect class="held {class}" x="{:.1}" y="{}" width="{:.1}" height="{}"><title>{title}</title></rect>"#,
                LABEL + start,
                lane as f64 * LANE + 1.0,
                (end - start).max(1.0),
                LANE - 2.0,
            );
        }
    }
    time_axis(&mut svg, height, (to - from).num_minutes());
    svg.push_str("</svg>");
    svg
}

/// Holds of tasks that name no device, spread over `slots` lanes: each goes to the first
/// lane free when it starts (sorted by start), so overlapping tasks sit on separate lanes.
pub(crate) fn slot_lanes(mut holds: Vec<Hold>, slots: usize) -> Vec<Hold> {
    holds.sort_by_key(|h| h.from);
    let mut free_at: Vec<Option<DateTime<Utc>>> = vec![None; slots.max(1)];
    for h in &mut holds {
        let lane = free_at
            .iter()
            .position(|f| f.is_none_or(|t| t <= h.from))
            .unwrap_or(0);
        free_at[lane] = Some(h.to.unwrap_or(DateTime::<Utc>::MAX_UTC));
        h.lane = lane;
    }
    holds
}

/// Values per minute bucket: a line for each `(name, css class, values)`, on one scale.
pub(crate) fn lines(series: &[(&str, &str, Vec<f64>)], minutes: i64) -> String {
    const HEIGHT: f64 = 90.0;
    let max = series
        .iter()
        .flat_map(|s| s.2.iter().copied())
        .fold(0.0_f64, f64::max)
        .max(1.0);
    let mut svg = format!(
        r#"<svg class="chart lines" viewBox="0 0 {} {}" role="img" aria-label="the queue over the last hour">"#,
        LABEL + WIDTH + 4.0,
        HEIGHT + 16.0
    );
    let _ = write!(
        svg,
        r#"<text class="lane" x="0" y="10">{}</text><text class="lane" x="0" y="{HEIGHT}">0</text><line class="base" x1="{LABEL}" y1="{HEIGHT}" x2="{}" y2="{HEIGHT}"/>"#,
        max as u64,
        LABEL + WIDTH
    );
    for (i, (name, class, values)) in series.iter().enumerate() {
        let n = values.len().max(2) - 1;
        let points: Vec<String> = values
            .iter()
            .enumerate()
            .map(|(k, v)| {
                format!(
                    "{:.1},{:.1}",
                    LABEL + k as f64 / n as f64 * WIDTH,
                    HEIGHT - v / max * (HEIGHT - 4.0)
                )
            })
            .collect();
        let _ = write!(
            svg,
            r#"<polyline class="{}" points="{}"/><text class="legend {}" x="{}" y="10">{}</text>"#,
            escape(class),
            points.join(" "),
            escape(class),
            LABEL + 8.0 + i as f64 * 110.0,
            escape(name)
        );
    }
    time_axis(&mut svg, HEIGHT, minutes);
    svg.push_str("</svg>");
    svg
}

/// Bars per minute bucket (jobs finished each minute).
pub(crate) fn bars(name: &str, values: &[f64], minutes: i64) -> String {
    const HEIGHT: f64 = 60.0;
    let max = values.iter().copied().fold(0.0_f64, f64::max).max(1.0);
    let step = WIDTH / values.len().max(1) as f64;
    let mut svg = format!(
        r#"<svg class="chart bars" viewBox="0 0 {} {}" role="img" aria-label="{} over the last hour">"#,
        LABEL + WIDTH + 4.0,
        HEIGHT + 16.0,
        escape(name)
    );
    let _ = write!(
        svg,
        r#"<text class="lane" x="0" y="10">{}/min</text><text class="lane" x="0" y="{HEIGHT}">0</text>"#,
        max as u64
    );
    for (k, v) in values.iter().enumerate() {
        let h = v / max * (HEIGHT - 4.0);
        let _ = write!(
            svg,
            r#"<rect class="bar" x="{:.1}" y="{:.1}" width="{:.1}" height="{h:.1}"><title>{} {}</title></rect>"#,
            LABEL + k as f64 * step,
            HEIGHT - h,
            (step - 1.0).max(1.0),
            *v as u64,
            escape(name)
        );
    }
    time_axis(&mut svg, HEIGHT, minutes);
    svg.push_str("</svg>");
    svg
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::Duration;

    #[test]
    fn overlapping_tasks_without_devices_take_separate_slot_lanes() {
        let t0 = Utc::now() - Duration::minutes(30);
        let at = |m: i64| t0 + Duration::minutes(m);
        let hold = |from, to, job| Hold {
            lane: 0,
            from,
            to,
            job,
            state: "succeeded".into(),
        };
        let spans = vec![
            hold(at(0), Some(at(10)), 1),
            hold(at(5), Some(at(15)), 2),
            hold(at(12), None, 3),
        ];
        let lanes: Vec<usize> = slot_lanes(spans, 2).iter().map(|h| h.lane).collect();
        // Job 3 starts after job 1 ended: lane 0 is free again.
        assert_eq!(lanes, vec![0, 1, 0]);
    }

    #[test]
    fn a_hold_is_drawn_where_it_falls_in_the_hour_and_names_its_job() {
        let to = Utc::now();
        let from = to - Duration::minutes(60);
        let hold = Hold {
            lane: 1,
            from: from + Duration::minutes(30),
            to: None,
            job: 42,
            state: "running".into(),
        };
        let svg = occupancy(&["cuda:0".into(), "cuda:<1>".into()], &[hold], from, to);
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>"));
        // Half way along the plot, to its end (still running), on the second lane.
        assert!(svg.contains(r#"x="440.0" y="17" width="360.0""#), "{svg}");
        assert!(svg.contains("<title>job 42 (running)</title>"));
        assert!(svg.contains("cuda:&lt;1&gt;"), "names are escaped");
    }

    #[test]
    fn short_tasks_closer_than_a_pixel_merge_into_one_bar_naming_them() {
        let to = Utc::now();
        let from = to - Duration::minutes(60);
        let holds: Vec<Hold> = (0..1000)
            .map(|i| Hold {
                lane: 0,
                from: from + Duration::milliseconds(600_000 + i * 10),
                to: Some(from + Duration::milliseconds(600_000 + i * 10 + 5)),
                job: i,
                state: "succeeded".into(),
            })
            .chain(std::iter::once(Hold {
                lane: 0,
                from: from + Duration::minutes(40),
                to: None,
                job: 5000,
                state: "running".into(),
            }))
            .collect();
        let svg = occupancy(&["slot 0".into()], &holds, from, to);
        assert_eq!(svg.matches("<rect class=\"held").count(), 2, "{svg}");
        assert!(svg.contains("<title>1000 jobs: job 0 (succeeded), job 1 (succeeded)"));
        assert!(svg.contains("<title>job 5000 (running)</title>"));
    }

    #[test]
    fn lines_and_bars_share_the_largest_value_as_their_top() {
        let svg = lines(
            &[
                ("waiting", "pending", vec![0.0, 5.0, 10.0]),
                ("running", "running", vec![2.0, 2.0, 2.0]),
            ],
            60,
        );
        assert!(
            svg.contains(">10</text>"),
            "the scale's top is the largest value"
        );
        assert_eq!(svg.matches("<polyline").count(), 2);
        let svg = bars("finished", &[0.0, 3.0, 6.0], 60);
        assert_eq!(svg.matches("class=\"bar\"").count(), 3);
        assert!(svg.contains(">6/min</text>"));
    }
}

/// The queue per minute from `from` for `minutes`: waiting and running as last counted in
/// each minute (carried over minutes without a count), finished summed.
pub(crate) fn per_minute(
    samples: &[store::QueueSample],
    from: DateTime<Utc>,
    minutes: usize,
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let (mut waiting, mut running, mut finished) =
        (vec![0.0; minutes], vec![0.0; minutes], vec![0.0; minutes]);
    let mut last: Option<(f64, f64)> = None;
    let mut by_minute: Vec<Option<(f64, f64)>> = vec![None; minutes];
    for s in samples {
        let k = (s.at - from).num_seconds().div_euclid(60);
        if k < 0 {
            last = Some((s.pending as f64, s.running as f64));
            continue;
        }
        let Some(k) = usize::try_from(k).ok().filter(|k| *k < minutes) else {
            continue;
        };
        by_minute[k] = Some((s.pending as f64, s.running as f64));
        finished[k] += s.finished as f64;
    }
    for k in 0..minutes {
        if let Some(v) = by_minute[k] {
            last = Some(v);
        }
        let (w, r) = last.unwrap_or((0.0, 0.0));
        waiting[k] = w;
        running[k] = r;
    }
    (waiting, running, finished)
}

#[cfg(test)]
mod bucket_tests {
    use super::*;
    use chrono::Duration;

    #[test]
    fn minutes_without_a_count_carry_the_last_one_and_finished_tasks_add_up() {
        let from = Utc::now() - Duration::minutes(3);
        let sample = |s: i64, pending, running, finished| store::QueueSample {
            at: from + Duration::seconds(s),
            pending,
            running,
            finished,
        };
        let samples = [
            sample(-30, 7, 1, 9),
            sample(10, 5, 2, 3),
            sample(40, 4, 2, 1),
            sample(150, 0, 1, 6),
        ];
        let (w, r, f) = per_minute(&samples, from, 3);
        assert_eq!(w, vec![4.0, 4.0, 0.0]);
        assert_eq!(r, vec![2.0, 2.0, 1.0]);
        assert_eq!(
            f,
            vec![4.0, 0.0, 6.0],
            "the sample before the window is not counted"
        );
    }
}
