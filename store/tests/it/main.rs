//! Store tests against a real PostgreSQL: one fresh database per test.

mod calls;
mod dashboard;
mod gangs;
mod handoff;
mod queue;

use std::collections::BTreeMap;
use store::{NewWorker, Store};

/// A store on a fresh database.
pub(crate) async fn store() -> Store {
    let db = testkit::fresh_database().await;
    Store::open(db.options).await.expect("open store")
}

/// Registers a CPU worker `name` with one slot; its id.
pub(crate) async fn one_slot_worker(store: &Store, name: &str) -> i64 {
    store
        .register_worker(NewWorker {
            name,
            labels: &BTreeMap::new(),
            slots: 1,
            inventory: &domain::fixtures::inventory(name, &[]),
            version: "test",
        })
        .await
        .unwrap()
}
