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

    /// Everything `node` has given away.
    #[inline]
    pub fn given_by(&self, node: NodeIdx) -> u64 {
        self.cells
            .iter()
            .filter(|c| c.from == node)
            .map(|c| c.units)
            .sum()
    }

    /// Everything `node` has received.
    #[inline]
    pub fn received_by(&self, node: NodeIdx) -> u64 {
        self.cells
            .iter()
            .filter(|c| c.to == node)
            .map(|c| c.units)
            .sum()
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
            units: self.get(from, to) + units,
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
