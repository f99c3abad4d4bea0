//! What happened to this worker's tasks and is not yet acknowledged: starts and ends, sent
//! with the next poll and repeated until a poll carrying them is answered (the server records
//! each once, however often it hears it).
//!
//! A start still unsent when its task ends travels inside the end, so a short task costs the
//! server one write instead of two.

use protocol::{TaskFinished, TaskLease, TaskReports, TaskStarted};
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;
use tokio::sync::Notify;

/// How a task ended, as the runner saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ending {
    pub exit_code: Option<i32>,
    pub error: Option<String>,
    /// When its process started, if it did.
    pub started: Option<Instant>,
    /// A remote function call's value or exception.
    pub call: Option<domain::CallOutcome>,
}

#[derive(Debug, Default)]
pub struct Reports {
    inner: Mutex<Pending>,
    /// Woken when news arrives.
    news: Notify,
}

#[derive(Debug, Default)]
struct Pending {
    started: HashMap<TaskLease, Instant>,
    finished: HashMap<TaskLease, (Ending, Instant)>,
    /// When the oldest news not yet put in any poll arrived.
    unsent_since: Option<Instant>,
}

/// Which reports a poll carried, to drop once it is answered.
#[derive(Debug, Default)]
pub struct Carried {
    started: Vec<TaskLease>,
    finished: Vec<TaskLease>,
}

impl Reports {
    pub fn started(&self, lease: TaskLease, at: Instant) {
        let mut p = self.inner.lock().expect("reports lock");
        p.started.insert(lease, at);
        p.unsent_since.get_or_insert(at);
        drop(p);
        self.news.notify_one();
    }

    pub fn finished(&self, lease: TaskLease, ending: Ending) {
        let now = Instant::now();
        let mut p = self.inner.lock().expect("reports lock");
        p.started.remove(&lease);
        p.finished.insert(lease, (ending, now));
        p.unsent_since.get_or_insert(now);
        drop(p);
        self.news.notify_one();
    }

    /// Everything unacknowledged, dated relative to `now` (the moment the poll is sent).
    pub fn for_poll(&self, now: Instant) -> (TaskReports, Carried) {
        let age_us = |at: Instant| now.saturating_duration_since(at).as_micros() as u64;
        let mut p = self.inner.lock().expect("reports lock");
        p.unsent_since = None;
        let mut reports = TaskReports::default();
        let mut carried = Carried::default();
        for (lease, at) in &p.started {
            reports.started.push(TaskStarted {
                lease: *lease,
                age_us: age_us(*at),
            });
            carried.started.push(*lease);
        }
        for (lease, (ending, at)) in &p.finished {
            reports.finished.push(TaskFinished {
                lease: *lease,
                exit_code: ending.exit_code,
                error: ending.error.clone(),
                started_age_us: ending.started.map(age_us),
                age_us: age_us(*at),
                call: ending.call.clone(),
            });
            carried.finished.push(*lease);
        }
        (reports, carried)
    }

    /// The poll that carried these was answered: the server has them.
    pub fn acknowledge(&self, carried: &Carried) {
        let mut p = self.inner.lock().expect("reports lock");
        for lease in &carried.started {
            p.started.remove(lease);
        }
        for lease in &carried.finished {
            p.finished.remove(lease);
        }
    }

    /// When the oldest news that no poll has carried yet arrived.
    pub fn unsent_since(&self) -> Option<Instant> {
        self.inner.lock().expect("reports lock").unsent_since
    }

    /// Resolves when news arrives (at once if some arrived since the last call).
    pub async fn news(&self) {
        self.news.notified().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use domain::{Attempt, TaskId};
    use std::time::Duration;

    fn lease(task: i64) -> TaskLease {
        TaskLease {
            task: TaskId(task),
            attempt: Attempt(1),
        }
    }

    fn ended(code: i32, started: Instant) -> Ending {
        Ending {
            exit_code: Some(code),
            error: None,
            started: Some(started),
            call: None,
        }
    }

    #[test]
    fn a_start_unsent_when_its_task_ends_travels_inside_the_end() {
        let reports = Reports::default();
        let t0 = Instant::now();
        reports.started(lease(1), t0);
        reports.finished(lease(1), ended(0, t0));
        let (sent, _) = reports.for_poll(t0 + Duration::from_millis(3));
        assert!(sent.started.is_empty());
        assert_eq!(sent.finished.len(), 1);
        assert_eq!(sent.finished[0].started_age_us, Some(3000));
    }

    #[test]
    fn reports_repeat_until_a_poll_carrying_them_is_answered() {
        let reports = Reports::default();
        let t0 = Instant::now();
        reports.started(lease(1), t0);
        let (first, carried) = reports.for_poll(t0);
        assert_eq!(first.started.len(), 1);
        // That poll was dropped; news arrived; the next poll carries everything.
        reports.started(lease(2), t0);
        let (second, carried_again) = reports.for_poll(t0);
        assert_eq!(second.started.len(), 2);
        reports.acknowledge(&carried);
        let (third, _) = reports.for_poll(t0);
        assert_eq!(
            third.started,
            vec![TaskStarted {
                lease: lease(2),
                age_us: 0
            }]
        );
        reports.acknowledge(&carried_again);
        assert!(reports.for_poll(t0).0.is_empty());
    }

    #[test]
    fn an_end_reported_after_its_poll_left_is_not_acknowledged_by_that_poll() {
        let reports = Reports::default();
        let t0 = Instant::now();
        reports.started(lease(1), t0);
        let (_, carried) = reports.for_poll(t0);
        reports.finished(lease(1), ended(3, t0));
        reports.acknowledge(&carried);
        let (next, _) = reports.for_poll(t0);
        assert_eq!(next.finished.len(), 1, "the end still has to go out");
        assert_eq!(next.finished[0].exit_code, Some(3));
    }

    #[test]
    fn only_news_no_poll_has_carried_counts_as_unsent() {
        let reports = Reports::default();
        let t0 = Instant::now();
        assert_eq!(reports.unsent_since(), None);
        reports.started(lease(1), t0);
        assert_eq!(reports.unsent_since(), Some(t0));
        let _ = reports.for_poll(t0);
        assert_eq!(reports.unsent_since(), None);
    }
}
