//! The limiter: rules, the key store and the idempotency cache, behind the operations the
//! HTTP API offers. Every bad input is refused here with an [`ApiError`] naming the field,
//! before any counter is touched.
//!
//! Where things are: [`Limiter`] and what it holds (rules, store, cluster view) in
//! `state.rs`; deciding one check, a batch, a refund in `decide.rs`; the atomic `all` call in
//! `atomic.rs`; a key's usage and its reset in `usage.rs`; runtime per-key overrides (writing,
//! reading, merging a peer's) in `overrides.rs`. Below them, used by them and using none of
//! them: `rule_set.rs` (the rules in force and looking a check up in them, with its key's
//! override), `override_table.rs` (the overrides' last-writer-wins registers),
//! `idempotency.rs` (remembered decisions), `request.rs` (what is asked), `outcome.rs` (what
//! is answered), `api_error.rs`, `clock.rs`.

mod api_error;
mod atomic;
mod clock;
mod decide;
mod idempotency;
mod outcome;
mod override_table;
mod overrides;
mod request;
mod rule_set;
mod state;
mod usage;

pub use api_error::ApiError;
pub use clock::Clock;
pub use outcome::{AllOutcome, List, Outcome, UsageOutcome};
pub use override_table::{OverrideEntry, OverrideTable, Refusal, TOMBSTONE_KEEP_MS};
pub use overrides::OverrideWrites;
pub use request::{
    AllEntry, CheckRef, CheckRequest, Field, MAX_IDEMPOTENCY_KEY_BYTES, MAX_KEY_BYTES,
    check_idempotency_key,
};
pub use rule_set::{RuleEntry, RuleSet};
pub use state::{Limiter, forget_weight};

/// What unit tests of the node's modules share.
#[cfg(test)]
pub(crate) mod test_support {
    use super::{CheckRef, Limiter};

    /// Charges `cost` to `key` of rule `q`, which must be allowed.
    pub(crate) fn charge(l: &Limiter, key: &str, cost: u64) {
        let o = l.check(CheckRef::of("q", key, cost)).expect("a check");
        assert!(o.decision.allowed, "{key}: {o:?}");
    }
}
