//! The limiter: rules, the key store and the idempotency cache, behind the operations the
//! HTTP API offers. Every bad input is refused here with an [`ApiError`] naming the field,
//! before any counter is touched.
//!
//! Where things are: [`Limiter`] and what it holds (rules, store, cluster view) in
//! `state.rs`; deciding one check, a batch, a refund in `decide.rs`; the atomic `all` call in
//! `atomic.rs`; a key's usage and its reset in `usage.rs`. Below them, used by them and using
//! none of them: `rule_set.rs` (the rules in force and looking a check up in them),
//! `idempotency.rs` (remembered decisions), `request.rs` (what is asked), `outcome.rs` (what
//! is answered), `api_error.rs`, `clock.rs`.

mod api_error;
mod atomic;
mod clock;
mod decide;
mod idempotency;
mod outcome;
mod request;
mod rule_set;
mod state;
mod usage;

pub use api_error::ApiError;
pub use clock::Clock;
pub use outcome::{AllOutcome, Outcome, UsageOutcome};
pub use request::{AllEntry, CheckRef, CheckRequest, Field, MAX_KEY_BYTES};
pub use rule_set::{RuleEntry, RuleSet};
pub use state::Limiter;
