//! The idempotency cache: the first decision of a request with an `idempotency_key`, kept
//! for the rule's window so that a retry gets it back without being charged again.

use std::time::Duration;

use levee_core::{AllDecision, Decision};
use moka::sync::Cache;

use crate::store::KeyId;

/// A remembered decision: of a single check, of an atomic `all` call (a key used for one
/// kind is refused for the other), or of a refund (kept under an identity of its own); each
/// with its `local_remaining` (per entry for `all`).
#[derive(Clone)]
pub(super) enum Cached {
    One(Decision, u64),
    All(AllDecision, Vec<u64>),
    Refund(Decision, u64),
}

/// Remembered decisions by the key's identity (for an `all` call, every entry's identity) and
/// the idempotency key, each with how long it lives, in milliseconds.
pub(super) type IdempotencyCache = Cache<(KeyId, String), (Cached, u64)>;

/// An empty cache of at most `capacity` decisions.
pub(super) fn idempotency_cache(capacity: u64) -> IdempotencyCache {
    Cache::builder()
        .max_capacity(capacity)
        .expire_after(IdempotencyExpiry)
        .build()
}

/// Idempotency entries live for the rule's window.
struct IdempotencyExpiry;

impl moka::Expiry<(KeyId, String), (Cached, u64)> for IdempotencyExpiry {
    fn expire_after_create(
        &self,
        _: &(KeyId, String),
        value: &(Cached, u64),
        _: std::time::Instant,
    ) -> Option<Duration> {
        Some(Duration::from_millis(value.1))
    }
}
