//! The background loops that keep the store healthy, each a plain struct with `run_once()`:
//! the lease [`sweeper`], the retention [`pruner`], managed [`replay`], the [`vacuum`] of
//! outboxd's own tables, and the [`gauges`] read from the store for `/metrics`.
pub mod gauges;
pub mod pruner;
pub mod replay;
#[cfg(test)]
mod store_tests;
pub mod sweeper;
pub mod vacuum;
