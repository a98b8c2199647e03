//! What a node holds: its rights (static share plus transfers) and, for a token bucket, the
//! level of its sub-bucket in fixed-point nanotokens.
//!
//! Both the decision path ([`crate::state`]) and the escrow's rebalancing ([`crate::escrow`])
//! read rights and levels the same way; this module is the one place that says how. It knows
//! the CRDT's types but nothing of a key's private bookkeeping.

use crate::crdt::{BucketReg, EpochSlot, KeyCrdt, TransferMatrix};
use crate::replica::{NodeIdx, ReplicaSet};
use crate::rule::{Algorithm, Target};
use crate::time::Millis;

/// Nanotokens per token: token-bucket levels are fixed-point integers.
pub const NANO: i128 = 1_000_000_000;

/// Rights a node holds: its static share plus what it received minus what it gave.
#[inline]
pub(crate) fn holdings(base: u64, transfers: &TransferMatrix, node: NodeIdx) -> u64 {
    if transfers.is_empty() {
        return base;
    }
    (i128::from(base) + transfers.net(node)).clamp(0, i128::from(u64::MAX)) as u64
}

/// Rights `node` takes over in an epoch (starting at `start`, its `slot` if the key has
/// one) as the heir of removed nodes ([`crate::rule::Bequest`]); 0 for most nodes and rules.
#[inline]
pub(crate) fn inherited(
    target: &Target<'_>,
    slot: Option<&EpochSlot>,
    node: NodeIdx,
    start: Millis,
) -> u64 {
    if target.bequests.is_empty() {
        return 0;
    }
    let empty = TransferMatrix::default();
    let transfers = slot.map_or(&empty, |s| &s.transfers);
    target
        .bequests
        .iter()
        .filter(|b| b.heir == node)
        .map(|b| {
            let used = slot
                .and_then(|s| s.tallies.get(b.from))
                .map_or(0, |t| t.net());
            b.left(start, transfers, used)
        })
        .fold(0u64, u64::saturating_add)
}

/// A sub-bucket's level at `now`: the register's level plus refill at the node's rate,
/// capped at its capacity. Refill floors, so rounding never creates tokens.
#[inline]
pub(crate) fn project(
    reg: &BucketReg,
    units: u64,
    rate: u64,
    per_ms: u64,
    burst: u64,
    now: Millis,
) -> i128 {
    let cap = i128::from(units) * NANO;
    let level = i128::from(reg.level_nt);
    if level >= cap {
        return cap;
    }
    let dt = u128::from(now.saturating_sub(reg.at));
    // Saturating: `units` and `reg.at` may come from a peer with any value, and a product
    // past u128 only means "refilled to the cap".
    let refill = mul_div(
        dt.saturating_mul(u128::from(units))
            .saturating_mul(u128::from(rate))
            .saturating_mul(NANO as u128),
        u128::from(burst) * u128::from(per_ms),
    );
    (level + refill.min(cap as u128) as i128).min(cap)
}

/// A node's sub-bucket level at `now`. A node that never wrote its register starts full at
/// its static share; units it received come with their tokens, which `KeyState::merge`
/// writes into its register when they arrive (units whose tokens were not added, after a
/// restart, stay empty until they refill: receiving never creates tokens).
#[inline]
pub(crate) fn sub_bucket_level(
    reg: Option<&BucketReg>,
    base: u64,
    units: u64,
    (rate, per_ms, burst): (u64, u64, u64),
    now: Millis,
) -> i128 {
    match reg {
        Some(reg) => project(reg, units, rate, per_ms, burst, now),
        None => i128::from(base.min(units)) * NANO,
    }
}

/// A token bucket: `me`'s sub-bucket at `now` — its level after refill (nanotokens) and its
/// capacity (units: its static share, plus what it received, less what it gave). `None` for
/// other algorithms.
pub(crate) fn own_sub_bucket(
    crdt: &KeyCrdt,
    target: &Target<'_>,
    me: NodeIdx,
    replicas: &ReplicaSet,
    now: Millis,
) -> Option<(i128, u64)> {
    let Algorithm::TokenBucket {
        rate,
        per_ms,
        burst,
        ..
    } = *target.algorithm
    else {
        return None;
    };
    let base = target.static_share(me, replicas);
    let units = holdings(base, &crdt.holdings, me);
    let level = sub_bucket_level(
        crdt.buckets.get(me),
        base,
        units,
        (rate, per_ms, burst),
        now,
    );
    Some((level, units))
}

/// Writes a node's sub-bucket register: a new sequence number, the level clamped into the
/// register's `i64`. A clock that went backwards does not refill twice: the register keeps
/// the later time.
#[inline]
pub(crate) fn write_level(reg: &mut BucketReg, level_nt: i128, now: Millis) {
    let clamped = level_nt.clamp(i128::from(i64::MIN), i128::from(i64::MAX)) as i64;
    *reg = BucketReg {
        seq: reg.seq.saturating_add(1),
        at: reg.at.max(now),
        level_nt: clamped,
    };
}

/// Whole tokens in a level of nanotokens (0 for a negative level).
#[inline]
pub(crate) fn tokens_of(level_nt: i128) -> u64 {
    // Levels are bounded by MAX_BURST × NANO, inside an i64: divide in 64 bits.
    (level_nt.clamp(0, i128::from(i64::MAX)) as u64) / NANO as u64
}

/// `n / d`, in 64-bit arithmetic when both fit (the common case), else in 128 bits.
#[inline]
pub(crate) fn mul_div(n: u128, d: u128) -> u128 {
    match (u64::try_from(n), u64::try_from(d)) {
        (Ok(n), Ok(d)) => u128::from(n / d),
        _ => n / d,
    }
}

/// `ceil(a × mul / div)`, saturating at `u64::MAX` (and `u64::MAX` when `div` is 0).
#[inline]
pub(crate) fn ceil_mul_div(a: u128, mul: u128, div: u128) -> u64 {
    if div == 0 {
        return u64::MAX;
    }
    let n = a.saturating_mul(mul);
    let q = mul_div(n, div);
    let q = if q * div < n { q + 1 } else { q };
    u64::try_from(q).unwrap_or(u64::MAX)
}

/// `ceil(a / b)` for a positive `b`, and 0 for `a ≤ 0`.
#[inline]
pub(crate) fn ceil_div(a: i128, b: i128) -> i128 {
    if a <= 0 { 0 } else { (a + b - 1) / b }
}
