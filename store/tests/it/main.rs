//! Store tests against a real PostgreSQL: one fresh database per test.

mod calls;
mod gangs;
mod handoff;
mod queue;
