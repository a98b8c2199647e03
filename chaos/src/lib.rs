//! # levee-chaos
//!
//! Chaos testing of Levee with real processes and real QUIC: a cluster of three regions of two
//! `levee serve` processes each, a userspace UDP fault proxy on every link between two nodes
//! (the sandbox kernel has no `netem`), scripted scenarios (partitions, a one-way cut, `kill
//! -9`, a rolling restart, a skewed clock, loss, latency, duplication and reordering, an
//! impostor with a foreign certificate), load through the HTTP API from every region, and the
//! simulator's invariants checked on what the clients saw. Every scenario writes a JSON report
//! and an SVG plot.
//!
//! How a run goes ([`runner::run`]):
//!
//! 1. [`cluster::ChaosCluster::start`] starts the black-box harness's process cluster
//!    (`levee_blackbox::cluster`) with every peer address pointing at the link's relay of the
//!    [`proxy::FaultProxy`], and waits until every node has dialled every peer through the
//!    proxy.
//! 2. [`load`] streams send checks of an overloaded *main* key (1.67 times the limit) and of a
//!    lightly used *probe* key to every node from a window boundary on, while the script of
//!    the [`scenario::Scenario`] changes faults and processes at its times, and measures after
//!    every heal how long until every node's view of the probe key agrees.
//! 3. [`windows`] attributes every admission to the window of the clock that decided it;
//!    [`checks`] evaluates the invariants; [`report`] and [`plot`] write the report.
//!
//! The whole suite: `cargo run --release -p levee-chaos -- --all` (see `docs/chaos.md`).

pub mod checks;
pub mod cluster;
pub mod load;
pub mod plot;
pub mod proxy;
pub mod record;
pub mod report;
pub mod runner;
pub mod scenario;
pub mod windows;

pub use report::Report;
pub use runner::{RunOptions, run};
pub use scenario::Scenario;
