//! The escrow's transfer matrix: rights given from one node to another, grow-only, each row
//! written only by its donor.

use serde::{Deserialize, Serialize};
use thin_vec::ThinVec;

use crate::replica::NodeIdx;

use super::lattice::Lattice;

/// One cell `T[from][to]` of a transfer matrix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Transfer {
    /// The donor; the only node that ever increments this cell.
    pub from: NodeIdx,
    /// The recipient.
    pub to: NodeIdx,
    /// Rights given so far (grow-only).
    pub units: u64,
}

/// The escrow's grow-only transfer matrix, sparse, sorted by `(from, to)`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TransferMatrix {
    cells: ThinVec<Transfer>,
}

impl TransferMatrix {
    /// Rights `from` has given `to`.
    pub fn get(&self, from: NodeIdx, to: NodeIdx) -> u64 {
        self.cells
            .iter()
            .find(|c| c.from == from && c.to == to)
            .map_or(0, |c| c.units)
    }

    /// Everything `node` has given away (saturating at `u64::MAX`: cells come from peers).
    #[inline]
    pub fn given_by(&self, node: NodeIdx) -> u64 {
        self.cells
            .iter()
            .filter(|c| c.from == node)
            .fold(0u64, |sum, c| sum.saturating_add(c.units))
    }

    /// Everything `node` has received (saturating at `u64::MAX`).
    #[inline]
    pub fn received_by(&self, node: NodeIdx) -> u64 {
        self.cells
            .iter()
            .filter(|c| c.to == node)
            .fold(0u64, |sum, c| sum.saturating_add(c.units))
    }

    /// Net rights moved to `node`: received minus given.
    #[inline]
    pub fn net(&self, node: NodeIdx) -> i128 {
        let mut net = 0i128;
        for c in &self.cells {
            if c.to == node {
                net += i128::from(c.units);
            }
            if c.from == node {
                net -= i128::from(c.units);
            }
        }
        net
    }

    /// Records that `from` gives `units` more to `to`. Only `from` may call this for its row.
    pub fn give(&mut self, from: NodeIdx, to: NodeIdx, units: u64) {
        if units == 0 || from == to {
            return;
        }
        self.raise(Transfer {
            from,
            to,
            units: self.get(from, to).saturating_add(units),
        });
    }

    fn raise(&mut self, cell: Transfer) -> bool {
        match self
            .cells
            .binary_search_by_key(&(cell.from, cell.to), |c| (c.from, c.to))
        {
            Ok(i) => self.cells[i].units.join(&cell.units),
            Err(i) => {
                self.cells.reserve_exact(1);
                self.cells.insert(i, cell);
                true
            }
        }
    }

    /// Whether joining `other` keeps every node's sums (what it gave, what it received)
    /// within `u64`, for nodes below `nodes`. Conservative: a cell `other` repeats counts
    /// twice. `self` is a local matrix (sorted); `other` may come from a peer in any order.
    pub fn join_sums_fit(&self, other: &TransferMatrix, nodes: usize) -> bool {
        // Every sum is at most the cells' count times the largest cell: when that fits, so
        // does each node's sum, and nothing needs adding up (the common case, on every
        // merge: a few cells, far below the bound).
        let cells = (self.cells.len() + other.cells.len()) as u128;
        let largest = self
            .cells
            .iter()
            .chain(&other.cells)
            .map(|c| c.units)
            .max()
            .unwrap_or(0);
        if cells * u128::from(largest) <= u128::from(u64::MAX) {
            return true;
        }
        let mut given = vec![0u128; nodes];
        let mut received = vec![0u128; nodes];
        let mut add = |c: &Transfer, units: u64| {
            if let Some(g) = given.get_mut(usize::from(c.from.0)) {
                *g += u128::from(units);
            }
            if let Some(r) = received.get_mut(usize::from(c.to.0)) {
                *r += u128::from(units);
            }
        };
        for c in &self.cells {
            add(c, c.units);
        }
        for c in &other.cells {
            let mine = self
                .cells
                .binary_search_by_key(&(c.from, c.to), |x| (x.from, x.to))
                .map_or(0, |i| self.cells[i].units);
            add(c, c.units.saturating_sub(mine));
        }
        let max = u128::from(u64::MAX);
        given.iter().chain(&received).all(|&s| s <= max)
    }

    /// Every cell.
    pub fn cells(&self) -> &[Transfer] {
        &self.cells
    }

    /// The cells of `from`'s row: what a donor gossips.
    pub fn row(&self, from: NodeIdx) -> impl Iterator<Item = &Transfer> {
        self.cells.iter().filter(move |c| c.from == from)
    }

    /// Whether the matrix has no cell.
    pub fn is_empty(&self) -> bool {
        self.cells.is_empty()
    }
}

impl Lattice for TransferMatrix {
    fn join(&mut self, other: &TransferMatrix) -> bool {
        let mut changed = false;
        for c in &other.cells {
            changed |= self.raise(*c);
        }
        changed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matrix(cells: &[(u16, u16, u64)]) -> TransferMatrix {
        let mut m = TransferMatrix::default();
        for &(from, to, units) in cells {
            m.give(NodeIdx(from), NodeIdx(to), units);
        }
        m
    }

    #[test]
    fn sums_fit_whether_or_not_the_bound_on_every_cell_decides() {
        let half = u64::MAX / 2;
        // Few small cells: the bound alone says they fit.
        assert!(matrix(&[(0, 1, 5)]).join_sums_fit(&matrix(&[(1, 0, 7), (2, 0, 9)]), 3));
        // Four cells of nearly half u64::MAX each, over four different rows and columns:
        // count × largest is past u64::MAX, but no node's sum is.
        let mine = matrix(&[(0, 1, half), (2, 3, half)]);
        let theirs = matrix(&[(1, 2, half), (3, 0, half)]);
        assert!(mine.join_sums_fit(&theirs, 4));
        // Node 0 receives half twice, and one more: past u64::MAX.
        let theirs = matrix(&[(1, 0, half), (2, 0, 2)]);
        assert!(!matrix(&[(3, 0, half)]).join_sums_fit(&theirs, 4));
        // A cell the peer repeats counts only beyond what this node already has.
        let mine = matrix(&[(1, 0, half), (2, 0, half)]);
        assert!(mine.join_sums_fit(&matrix(&[(1, 0, half)]), 3));
    }
}
