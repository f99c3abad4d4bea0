//! LISTEN/NOTIFY wakeups. A notification is a hint that something changed; listeners always
//! fetch the truth from the tables, and fetch again after every reconnect, because
//! notifications sent while a listener was reconnecting are gone.

use crate::{Result, Store};
use sqlx::postgres::PgListener;
use sqlx::{Postgres, Transaction};

/// The channels GPUlayer notifies on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Channel {
    /// New runnable work exists.
    Work,
    /// A task should stop (cancelled); workers re-check their running tasks.
    Stop,
    /// New log lines for the job in the payload.
    Logs,
    /// The job in the payload changed state.
    Job,
    /// Gang nodes were assigned to the workers in the payload (ids, comma-separated).
    Push,
}

impl Channel {
    pub const ALL: [Channel; 5] = [
        Channel::Work,
        Channel::Stop,
        Channel::Logs,
        Channel::Job,
        Channel::Push,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Channel::Work => "gpulayer_work",
            Channel::Stop => "gpulayer_stop",
            Channel::Logs => "gpulayer_logs",
            Channel::Job => "gpulayer_job",
            Channel::Push => "gpulayer_push",
        }
    }

    fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|c| c.name() == name)
    }
}

/// One received hint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Wakeup {
    Notified {
        channel: Channel,
        job_id: Option<i64>,
    },
    /// Gang nodes were assigned to these workers.
    Pushed(Vec<i64>),
    /// The listener lost its connection and reconnected: anything may have changed.
    Reconnected,
}

/// Queues a notification in the caller's transaction; PostgreSQL delivers it at commit, and
/// folds identical ones in one transaction into one.
pub(crate) async fn notify(
    tx: &mut Transaction<'_, Postgres>,
    channel: Channel,
    job_id: Option<i64>,
) -> Result<()> {
    sqlx::query("SELECT pg_notify($1, $2)")
        .bind(channel.name())
        .bind(job_id.map(|j| j.to_string()).unwrap_or_default())
        .execute(&mut **tx)
        .await?;
    Ok(())
}

/// A LISTEN connection on every channel.
#[derive(Debug)]
pub struct Listener {
    inner: PgListener,
}

impl Store {
    pub async fn listen(&self) -> Result<Listener> {
        let mut inner = PgListener::connect_with(self.pool()).await?;
        inner
            .listen_all(Channel::ALL.iter().map(|c| c.name()))
            .await?;
        Ok(Listener { inner })
    }
}

impl Listener {
    /// The next hint. A lost connection yields [`Wakeup::Reconnected`] once the listener is
    /// connected again (sqlx re-issues the LISTENs).
    pub async fn recv(&mut self) -> Result<Wakeup> {
        match self.inner.try_recv().await? {
            Some(n) => Ok(match Channel::from_name(n.channel()) {
                Some(Channel::Push) => Wakeup::Pushed(
                    n.payload()
                        .split(',')
                        .filter_map(|w| w.parse().ok())
                        .collect(),
                ),
                Some(channel) => Wakeup::Notified {
                    channel,
                    job_id: n.payload().parse().ok(),
                },
                None => Wakeup::Reconnected,
            }),
            None => Ok(Wakeup::Reconnected),
        }
    }
}
