//! # levee-node
//!
//! A running Levee node: the HTTP API of `API.md` over the pure core, a bounded key store in
//! a `DashMap`, configuration with validation and live reload, Prometheus metrics, snapshots
//! of counters, and graceful shutdown.
//!
//! The binary (`levee serve`) calls [`server::run`]; tests can do the same in-process.

pub mod activity;
pub mod app;
pub mod config;
pub mod http;
pub mod limiter;
pub mod local_cluster;
pub mod metrics;
pub mod notify;
pub mod replication;
mod routed;
pub mod server;
pub mod snapshot;
pub mod states;
pub mod store;
pub mod wait;

pub use app::App;
pub use config::{Config, ConfigError};
pub use limiter::{ApiError, Limiter};
pub use server::{ServeOptions, run};
