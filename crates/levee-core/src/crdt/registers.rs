//! Single-writer registers: a node's token-bucket level and its demand forecast, each
//! ordered by a sequence number its writer increments.

use serde::{Deserialize, Serialize};

use super::lattice::Lattice;

/// A single-writer register: a node's token-bucket sub-bucket as it last wrote it.
///
/// Ordered by `(seq, at, level_nt)`, so two writes with the same sequence number (a node
/// that restarted before learning its old sequence) still join deterministically.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub struct BucketReg {
    /// The writer's sequence number.
    pub seq: u64,
    /// When the level was taken (the writer's clock, ms).
    pub at: u64,
    /// The level in nanotokens at `at`; never negative from an honest node, but a
    /// peer's value is taken as it comes.
    pub level_nt: i64,
}

/// A single-writer register: a node's forecast of its own demand for a key.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub struct DemandReg {
    /// The writer's sequence number.
    pub seq: u64,
    /// Forecast demand in tokens per epoch (window, period or refill period).
    pub forecast: u64,
    /// Rights the writer has seen transferred to it (continuous rights), so donors can bound
    /// what is still in flight towards it.
    pub received: u64,
}

macro_rules! register_lattice {
    ($t:ty) => {
        impl Lattice for $t {
            #[inline]
            fn join(&mut self, other: &$t) -> bool {
                if *other > *self {
                    *self = *other;
                    true
                } else {
                    false
                }
            }
        }
    };
}
register_lattice!(BucketReg);
register_lattice!(DemandReg);
