//! # levee-sim
//!
//! A deterministic, single-threaded discrete-event simulation of a Levee cluster: regions of
//! nodes, a latency matrix between regions, jitter, loss, duplication, reordering,
//! partitions (a region isolated, a full split, one-way cuts, flapping links), clock skew
//! and crashes that lose unsynchronised state. It drives the production code — the
//! [`levee_cluster::Cluster`] state machine, [`levee_cluster::memory::MemoryStates`] and
//! the `levee-core` decisions — through the real frame codec, with a simulated clock per
//! node and randomness drawn only from the run's seed, so any run replays from its seed.
//!
//! On every run it checks the design's accuracy properties (see [`checks`]); beside
//! Levee's two modes it runs the three anchor policies of the accuracy figure
//! ([`baselines`]) over the same plan.
//!
//! ```
//! use levee_sim::{Policy, Scenario, run_plan};
//!
//! let plan = Scenario::Steady.plan(7);
//! let outcome = run_plan(&plan, &[Policy::Strict]);
//! assert!(outcome.violations.is_empty(), "{:?}", outcome.violations);
//! ```
//!
//! Layout: [`plan`] (what a run is), [`lists`] (its node lists), [`scenario`] (how a seed
//! becomes a plan; [`algo_plans`] for the algorithms set), [`changes`] (membership changes),
//! [`workload`] (demand), [`net`] (the network), [`levee`] (the cluster under test),
//! [`baselines`], [`ledger`] (what was admitted), [`heal`] (agreement after a heal),
//! [`checks`] and [`algos`] (continuous algorithms' properties), [`outcome`] (one run),
//! [`summary`], [`settle`] (membership figures) and [`runner`] (many runs), [`table`] (the
//! accuracy figure), [`scale`] (the gossip protocol's cost as the cluster grows).

pub mod algo_plans;
pub mod algos;
pub mod baselines;
pub mod changes;
pub mod checks;
pub mod demand;
pub mod heal;
pub mod histogram;
pub mod ledger;
pub mod levee;
pub mod lists;
pub mod mixed;
pub mod net;
pub mod outcome;
pub mod plan;
pub mod report;
pub mod runner;
pub mod scale;
pub mod scenario;
pub mod settle;
pub mod summary;
pub mod table;
pub mod workload;

pub use checks::{Policy, Violation, ViolationKind};
pub use outcome::{RunOutcome, quiet_panics, run_plan};
pub use plan::RunPlan;
pub use runner::{Batch, run_batch};
pub use scenario::Scenario;
pub use summary::Summary;
