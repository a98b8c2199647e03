//! Messages in flight with no clock: the test picks which one arrives next, whether it
//! arrives again later (duplication), or whether it is lost. This is the adversarial
//! scheduler of a property test, where the generated steps, not latency, decide the
//! interleaving (a [`crate::Net`] decides it by arrival time instead).
//!
//! Messages are kept in sending order; a pick is taken modulo the number in flight, so any
//! generated index names a message, and the same steps always name the same messages.

/// A message in a [`MessagePool`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pending<M> {
    /// The sending endpoint.
    pub from: usize,
    /// The receiving endpoint.
    pub to: usize,
    /// The message.
    pub msg: M,
}

/// Messages sent and not yet delivered or lost, in sending order.
#[derive(Debug, Clone)]
pub struct MessagePool<M> {
    pending: Vec<Pending<M>>,
}

impl<M> Default for MessagePool<M> {
    fn default() -> Self {
        MessagePool {
            pending: Vec::new(),
        }
    }
}

impl<M> MessagePool<M> {
    /// An empty pool.
    pub fn new() -> MessagePool<M> {
        MessagePool::default()
    }

    /// Adds a message from `from` to `to`.
    pub fn send(&mut self, from: usize, to: usize, msg: M) {
        self.pending.push(Pending { from, to, msg });
    }

    /// The number of messages in flight.
    pub fn len(&self) -> usize {
        self.pending.len()
    }

    /// Whether no message is in flight.
    pub fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }

    /// The messages in flight, in sending order.
    pub fn pending(&self) -> &[Pending<M>] {
        &self.pending
    }

    /// Delivers the message at `pick` (modulo the number in flight); with `keep`, a copy
    /// stays in flight to be delivered again. `None` if the pool is empty.
    pub fn deliver(&mut self, pick: usize, keep: bool) -> Option<Pending<M>>
    where
        M: Clone,
    {
        let i = self.index(pick)?;
        Some(if keep {
            self.pending[i].clone()
        } else {
            self.pending.remove(i)
        })
    }

    /// Loses the message at `pick` (modulo the number in flight); `None` if the pool is
    /// empty.
    pub fn lose(&mut self, pick: usize) -> Option<Pending<M>> {
        let i = self.index(pick)?;
        Some(self.pending.remove(i))
    }

    fn index(&self, pick: usize) -> Option<usize> {
        (!self.pending.is_empty()).then(|| pick % self.pending.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn picks_wrap_keep_duplicates_and_lose_removes() {
        let mut pool = MessagePool::new();
        assert!(pool.deliver(3, false).is_none());
        assert!(pool.lose(0).is_none());
        for (to, msg) in [(1, "a"), (2, "b"), (1, "c")] {
            pool.send(0, to, msg);
        }
        let kept = pool.deliver(4, true).unwrap();
        assert_eq!((kept.to, kept.msg), (2, "b"));
        assert_eq!(pool.len(), 3);
        assert_eq!(pool.deliver(4, false).unwrap().msg, "b");
        assert_eq!(pool.lose(2).unwrap().msg, "a");
        let left: Vec<&str> = pool.pending().iter().map(|p| p.msg).collect();
        assert_eq!(left, ["c"]);
        assert_eq!(pool.deliver(0, false).unwrap().msg, "c");
        assert!(pool.is_empty());
    }
}
