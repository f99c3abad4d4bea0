//! Store tests against a real PostgreSQL: one fresh database per test.

mod gangs;
mod queue;
