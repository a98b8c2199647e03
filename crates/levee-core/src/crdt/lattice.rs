//! The join-semilattice every part of a key's replicated state is.

/// A join-semilattice: `join` moves `self` to the least upper bound of both.
pub trait Lattice {
    /// Joins `other` into `self`; returns whether `self` changed.
    fn join(&mut self, other: &Self) -> bool;
}

impl Lattice for u64 {
    #[inline]
    fn join(&mut self, other: &u64) -> bool {
        if *other > *self {
            *self = *other;
            true
        } else {
            false
        }
    }
}
