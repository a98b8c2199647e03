//! The keys this node sent recently: what a peer that missed our batches since some time
//! needs again (a catch-up after a silence or a heal).

use std::collections::{BTreeSet, HashMap};

use levee_core::Millis;

/// Most keys remembered as recently sent (beyond, a catch-up falls back to a full push).
pub const MAX_RECENT_KEYS: usize = 1 << 16;

/// Keys whose own entries this node sent, with when (this node's clock).
#[derive(Debug, Clone)]
pub(crate) struct RecentlySent {
    sent: HashMap<Vec<u8>, Millis>,
    /// `sent` holds every key sent at or after this time.
    floor: Millis,
    next_prune: Millis,
}

impl RecentlySent {
    /// Nothing sent yet; `since` is when remembering starts.
    pub(crate) fn new(since: Millis) -> RecentlySent {
        RecentlySent {
            sent: HashMap::new(),
            floor: since,
            next_prune: since,
        }
    }

    /// The keys sent since `from`, or `None` if the memory no longer reaches back that far.
    pub(crate) fn since(&self, from: Millis) -> Option<BTreeSet<Vec<u8>>> {
        if from < self.floor {
            return None;
        }
        Some(
            self.sent
                .iter()
                .filter(|(_, t)| **t >= from)
                .map(|(id, _)| id.clone())
                .collect(),
        )
    }

    /// Remembers the keys sent now. At most every `prune_every`, or at once when over
    /// [`MAX_RECENT_KEYS`], forgets those sent before `keep_from` (what the least up-to-date
    /// peer may still need), or the older half when over the cap.
    pub(crate) fn remember(
        &mut self,
        ids: &[Vec<u8>],
        now: Millis,
        prune_every: Millis,
        keep_from: impl FnOnce() -> Millis,
    ) {
        for id in ids {
            match self.sent.get_mut(id.as_slice()) {
                Some(t) => *t = now,
                None => {
                    self.sent.insert(id.clone(), now);
                }
            }
        }
        let over = self.sent.len() > MAX_RECENT_KEYS;
        if now < self.next_prune && !over {
            return;
        }
        self.next_prune = now + prune_every;
        let mut floor = keep_from();
        if over {
            let mut times: Vec<Millis> = self.sent.values().copied().collect();
            let keep = MAX_RECENT_KEYS / 2;
            let cut = times.len() - keep;
            let (_, t, _) = times.select_nth_unstable(cut);
            floor = floor.max(*t + 1);
        }
        if floor > self.floor {
            self.floor = floor;
            self.sent.retain(|_, t| *t >= floor);
            if self.sent.capacity() > 4 * self.sent.len().max(1024) {
                // A burst (a fill) is over: give its memory back.
                self.sent.shrink_to(2 * self.sent.len());
            }
        }
    }
}
