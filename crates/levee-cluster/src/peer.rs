//! What this node knows of its exchange with one peer, and the peer's queue of full key
//! states (pull answers, repairs, catch-ups), paced by a per-interval budget so that a large
//! pull cannot flood the link.

use std::collections::{BTreeSet, HashSet, VecDeque};

use levee_core::{Millis, NodeIdx};
use levee_proto::{DeltaBatch, KeyEntry, Message};

use crate::store::KeyStates;

/// How many of a peer's latest batches [`PeerLink::last_words`] keeps: the last one or two
/// are those a node killed while it sent may have delivered unevenly.
pub(crate) const LAST_WORDS_BATCHES: usize = 4;

/// Most keys in one message.
pub const MAX_KEYS_PER_MESSAGE: usize = 256;
/// Most keys of full states (pulls, anti-entropy, catch-ups) sent to one peer per gossip
/// interval; the rest waits its turn, so a large pull cannot flood the link (deltas of
/// changed keys are not held back).
pub const PUSH_KEYS_PER_TICK: usize = 4 * MAX_KEYS_PER_MESSAGE;

/// A message for the transport to send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outgoing {
    /// The destination.
    pub to: NodeIdx,
    /// The message.
    pub msg: Message,
}

/// A key waiting in a peer's queue.
#[derive(Debug, Clone)]
pub(crate) enum Queued {
    /// A key's state, sent as `Deltas` (a repair or a catch-up).
    State(Vec<u8>),
    /// A key's state, as part of the answer to the peer's pull.
    PullAnswer(Vec<u8>),
    /// The end of the answer to the peer's pull.
    PullAnswerEnd,
}

/// The keys a peer that does not hear us misses, re-sent every interval.
#[derive(Debug, Clone, Default)]
pub(crate) enum MissedKeys {
    /// The peer hears us (or we have not started tracking what it misses).
    #[default]
    NotTracked,
    /// These keys, few enough to re-send every interval.
    Keys(BTreeSet<Vec<u8>>),
    /// Too many to re-send: the catch-up waits until the peer is heard again.
    TooMany,
}

/// What this node knows of its exchange with one peer.
#[derive(Debug, Clone)]
pub(crate) struct PeerLink {
    /// When a message was last queued for it (this node's clock).
    pub(crate) last_sent: Millis,
    /// The highest `sent_at_ms` of its batches received (its clock): echoed as `ack_ms`.
    pub(crate) heard_ms: u64,
    /// The highest `sent_at_ms` of our batches it says it has received (our clock).
    pub(crate) acked_ms: u64,
    /// When we last pushed it what it missed.
    pub(crate) caught_up: Millis,
    /// The `sent_at_ms` of the last batch sent to it: the next one's `prev_ms`.
    pub(crate) last_batch_ms: Millis,
    /// When the last batch holding keys was sent to it.
    pub(crate) last_keys_ms: Millis,
    /// It said it missed our batches since this time ([`Message::Missed`]); answered at most
    /// once per gossip interval (`missed_answered`).
    pub(crate) missed_since: Option<Millis>,
    /// When its last [`Message::Missed`] was answered.
    pub(crate) missed_answered: Millis,
    /// We told it we missed its batches since `.0`: the ask is repeated once at `.1`, in
    /// case it was lost (nothing says whether its answer came: it is ordinary batches).
    pub(crate) missed_reask: Option<(Millis, Millis)>,
    /// Times its batches were found missing here and asked for again.
    pub(crate) missed_asks: u64,
    /// Keys queued for it by anti-entropy repairs (a digest that differs, a bucket request).
    pub(crate) repaired_keys: u64,
    /// It answered our pull saying it is recovering too.
    pub(crate) deferred: bool,
    /// Its answer to our pull arrived whole.
    pub(crate) pull_done: bool,
    /// It told us, answering our pull, the lists it ran before its own
    /// ([`Message::ListsBefore`]; a node of an earlier version never does).
    pub(crate) before_heard: bool,
    /// Its answer to our pull after a removal arrived whole (`machine/heirs.rs`).
    pub(crate) heir_pulled: bool,
    /// Full states waiting to be sent to it, paced by `budget`. Each key is in it at most
    /// once as a [`Queued::State`] (see `queued`) and at most once as a
    /// [`Queued::PullAnswer`] (one answer to a pull at a time): however often the peer asks
    /// for buckets or flaps, the queue holds at most twice the store's keys.
    queue: VecDeque<Queued>,
    /// The keys in `queue` as [`Queued::State`].
    queued: HashSet<Vec<u8>>,
    /// An answer to its pull is in `queue`.
    pull_queued: bool,
    /// Keys that may still be pushed to it this interval.
    pub(crate) budget: usize,
    /// While it does not hear us: the keys it misses.
    pub(crate) missed: MissedKeys,
    /// Removed from this node's list and still speaking: when it was last told the list.
    pub(crate) told_removed: Millis,
    /// Its clock against this node's, from the times its batches carry.
    pub(crate) clock: ClockEstimate,
    /// The ids of the keys of the last [`LAST_WORDS_BATCHES`] non-empty `Deltas` batches it
    /// sent this node: if it goes silent, its last batches may have reached some peers and
    /// not others (a node killed mid-send), and while those keys stay busy nothing else
    /// repairs that; this node passes them on when it finds the peer down.
    pub(crate) last_words: VecDeque<Vec<Vec<u8>>>,
    /// Its anti-entropy digests, to repair only buckets where something was lost.
    pub(crate) digests: crate::digest::PeerDigests,
}

/// How long a clock estimate from one batch is kept against later ones with a longer round
/// trip: a peer that restarts may come back with another clock.
const CLOCK_SAMPLE_TTL_MS: Millis = 2_000;

/// A peer's clock against this node's, estimated from the batches it sends: one sent at
/// `sent_at_ms` (its clock) that arrived at `now` (ours) says its clock is at least
/// `sent_at_ms - now` ahead (it travelled some time); answering our batch sent at `ack_ms`
/// (ours), it says its clock is at most `sent_at_ms - ack_ms` ahead (ours reached it, and it
/// may have held it, before it sent). The tightest bounds of the last
/// [`CLOCK_SAMPLE_TTL_MS`] are kept, each from whichever batch gave it (the one that travelled
/// fastest, the one sent soonest after ours arrived), and the offset is their midpoint: within
/// half the round trip, and much closer when the peer answered some batch at once. The one-way
/// delay is taken as half the shortest round trip.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct ClockEstimate {
    /// The highest lower bound of the offset, and when it was seen.
    lower: Option<(i64, Millis)>,
    /// The lowest upper bound of the offset, and when it was seen.
    upper: Option<(i64, Millis)>,
    /// The shortest round trip, and when it was seen.
    round_trip: Option<(Millis, Millis)>,
}

impl ClockEstimate {
    /// Notes a batch it sent at `sent_at_ms` acknowledging ours of `ack_ms`, arrived `now`.
    pub(crate) fn sample(&mut self, sent_at_ms: u64, ack_ms: u64, now: Millis) {
        if sent_at_ms == 0 || ack_ms == 0 || ack_ms > now {
            return;
        }
        let bound = i128::from(levee_core::escrow::MAX_CLOCK_SKEW_MS) * 4;
        let ahead =
            |from: u64| (i128::from(sent_at_ms) - i128::from(from)).clamp(-bound, bound) as i64;
        let stale = |at: Millis| now.saturating_sub(at) > CLOCK_SAMPLE_TTL_MS;
        let lower = ahead(now);
        if self.lower.is_none_or(|(l, at)| lower >= l || stale(at)) {
            self.lower = Some((lower, now));
        }
        let upper = ahead(ack_ms);
        if self.upper.is_none_or(|(u, at)| upper <= u || stale(at)) {
            self.upper = Some((upper, now));
        }
        let round_trip = now - ack_ms;
        if self
            .round_trip
            .is_none_or(|(r, at)| round_trip <= r || stale(at))
        {
            self.round_trip = Some((round_trip, now));
        }
    }

    /// The estimate, if any exchange gave one: the offset bounded to ±`max_clock_skew`.
    pub(crate) fn get(&self) -> Option<levee_core::PeerClock> {
        let ((lower, _), (upper, _), (round_trip, _)) =
            (self.lower?, self.upper?, self.round_trip?);
        let skew = levee_core::escrow::MAX_CLOCK_SKEW_MS as i64;
        Some(levee_core::PeerClock {
            offset_ms: ((lower + upper) / 2).clamp(-skew, skew),
            one_way_ms: round_trip / 2,
        })
    }
}

impl Default for PeerLink {
    fn default() -> PeerLink {
        PeerLink {
            last_sent: 0,
            heard_ms: 0,
            acked_ms: 0,
            caught_up: 0,
            last_batch_ms: 0,
            last_keys_ms: 0,
            missed_since: None,
            missed_answered: 0,
            missed_reask: None,
            missed_asks: 0,
            repaired_keys: 0,
            told_removed: 0,
            clock: ClockEstimate::default(),
            deferred: false,
            pull_done: false,
            before_heard: false,
            heir_pulled: false,
            queue: VecDeque::new(),
            queued: HashSet::new(),
            pull_queued: false,
            budget: PUSH_KEYS_PER_TICK,
            missed: MissedKeys::NotTracked,
            last_words: VecDeque::new(),
            digests: Default::default(),
        }
    }
}

/// A batch of keys sent now (its `ack_ms` is set per destination by [`PeerLink::stamp`]).
pub(crate) fn batch(now: Millis, keys: Vec<KeyEntry>) -> DeltaBatch {
    DeltaBatch {
        sent_at_ms: now,
        ack_ms: 0,
        prev_ms: 0,
        keys: keys.into(),
    }
}

impl PeerLink {
    /// Readies a message for this peer: notes the send, acknowledges its latest batch and
    /// chains a batch to the one sent before it. A batch of keys is followed by empty
    /// batches for two intervals (`Cluster::heartbeat_due`) if `trailing`.
    pub(crate) fn stamp(&mut self, msg: &mut Message, now: Millis, trailing: bool) {
        self.last_sent = now;
        if let Message::Deltas(b) | Message::PullChunk { batch: b, .. } = msg {
            b.ack_ms = self.heard_ms;
            b.prev_ms = self.last_batch_ms;
            self.last_batch_ms = b.sent_at_ms;
            if trailing && !b.keys.is_empty() {
                self.last_keys_ms = now;
            }
        }
    }

    /// Whether an idle link's heartbeat is due: no batch sent to it for `every`.
    pub(crate) fn idle_beat_due(&self, now: Millis, every: Millis) -> bool {
        now.saturating_sub(self.last_batch_ms) >= every
    }

    /// Notes a batch received from this peer (`heard_ms`); returns the `sent_at_ms` of the
    /// latest one received before it if a batch named as sent in between (`prev_ms`) never
    /// arrived (lost, or still on its way: the transport keeps order, so only a lossy path
    /// reorders).
    pub(crate) fn chain(&mut self, b: &DeltaBatch) -> Option<u64> {
        let gap = (self.heard_ms > 0 && b.prev_ms > self.heard_ms).then_some(self.heard_ms);
        self.heard_ms = self.heard_ms.max(b.sent_at_ms);
        gap
    }

    /// Remembers the ids of a batch it sent this node ([`PeerLink::last_words`]).
    pub(crate) fn heard_words(&mut self, ids: Vec<Vec<u8>>) {
        if ids.is_empty() {
            return;
        }
        if self.last_words.len() == LAST_WORDS_BATCHES {
            self.last_words.pop_front();
        }
        self.last_words.push_back(ids);
    }

    /// Queues these keys' states, each unless it is already queued.
    pub(crate) fn queue_states(&mut self, ids: impl IntoIterator<Item = Vec<u8>>) {
        for id in ids {
            if self.queued.insert(id.clone()) {
                self.queue.push_back(Queued::State(id));
            }
        }
    }

    /// Drops the key states queued for it (not an answer to its pull).
    pub(crate) fn drop_queued_states(&mut self) {
        self.queue.retain(|q| !matches!(q, Queued::State(_)));
        self.queued.clear();
    }

    /// Whether nothing is queued for it.
    pub(crate) fn queue_is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// Full states queued for it (for status and metrics).
    pub(crate) fn backlog_keys(&self) -> usize {
        self.queue
            .iter()
            .filter(|q| !matches!(q, Queued::PullAnswerEnd))
            .count()
    }

    /// Queues every key of `store` for which `want` holds; `pull` makes it the answer to the
    /// peer's pull, whose last chunk says `done`. One answer to a pull at a time: a repeated
    /// request while one is queued is already being answered. Returns how many keys it
    /// queued.
    pub(crate) fn queue_all(
        &mut self,
        store: &dyn KeyStates,
        now: Millis,
        want: impl Fn(&[u8]) -> bool,
        pull: bool,
    ) -> u64 {
        if pull && self.pull_queued {
            return 0;
        }
        let (queue, queued) = (&mut self.queue, &mut self.queued);
        let mut added = 0u64;
        store.for_each_id(now, &mut |id| {
            if !want(id) {
                return;
            }
            if pull {
                queue.push_back(Queued::PullAnswer(id.to_vec()));
                added += 1;
            } else if queued.insert(id.to_vec()) {
                queue.push_back(Queued::State(id.to_vec()));
                added += 1;
            }
        });
        if pull {
            self.queue.push_back(Queued::PullAnswerEnd);
            self.pull_queued = true;
        }
        added
    }

    /// The next message of its queue, within this interval's budget, of at most
    /// [`MAX_KEYS_PER_MESSAGE`] keys, each key's state as it is now; `None` when the queue
    /// is empty or the budget spent. Not yet stamped.
    pub(crate) fn next_queued(&mut self, store: &dyn KeyStates, now: Millis) -> Option<Message> {
        loop {
            if self.queue.is_empty() || self.budget == 0 {
                return None;
            }
            let pull = matches!(
                self.queue.front(),
                Some(Queued::PullAnswer(_) | Queued::PullAnswerEnd)
            );
            let mut keys = Vec::new();
            let mut done = false;
            while keys.len() < MAX_KEYS_PER_MESSAGE && self.budget > 0 {
                let id = match self.queue.front() {
                    Some(Queued::State(id)) if !pull => id,
                    Some(Queued::PullAnswer(id)) if pull => id,
                    Some(Queued::PullAnswerEnd) if pull => {
                        self.queue.pop_front();
                        self.pull_queued = false;
                        done = true;
                        break;
                    }
                    _ => break,
                };
                if !pull {
                    self.queued.remove(id);
                }
                if let Some(state) = store.get(id) {
                    keys.push(KeyEntry {
                        id: id.clone(),
                        state,
                    });
                    self.budget -= 1;
                }
                self.queue.pop_front();
            }
            if keys.is_empty() && !done {
                continue;
            }
            let batch = batch(now, keys);
            return Some(if pull {
                Message::PullChunk { batch, done }
            } else {
                Message::Deltas(batch)
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::ClockEstimate;
    use levee_core::PeerClock;

    /// Our batch leaves at `sent` (our clock); the peer, `offset` ms ahead, holds it `hold` ms
    /// and answers; each way takes `one_way` ms. Returns its answer's (sent_at, ack, arrival).
    fn exchange(sent: u64, offset: i64, one_way: u64, hold: u64) -> (u64, u64, u64) {
        let answered = sent + one_way + hold;
        let sent_at = (answered as i64 + offset) as u64;
        (sent_at, sent, answered + one_way)
    }

    #[test]
    fn the_tightest_bounds_of_several_exchanges_give_the_offset() {
        // A batch the peer held 90 ms before its own went (a heartbeat of each end, as
        // before answers): one exchange alone is off by half of that; the one it answered at
        // once pins it.
        let mut c = ClockEstimate::default();
        let (s, a, n) = exchange(10_000, 0, 0, 90);
        c.sample(s, a, n);
        assert_eq!(c.get().unwrap().offset_ms, 45);
        let (s, a, n) = exchange(10_100, 0, 0, 2);
        c.sample(s, a, n);
        assert_eq!(c.get().unwrap().offset_ms, 1);
    }

    #[test]
    fn an_exchange_gives_the_offset_within_half_the_time_held() {
        let mut c = ClockEstimate::default();
        let (sent_at, ack, now) = exchange(10_000, 300, 50, 10);
        c.sample(sent_at, ack, now);
        let PeerClock {
            offset_ms,
            one_way_ms,
        } = c.get().unwrap();
        assert!((300..=305).contains(&offset_ms), "offset {offset_ms}");
        assert_eq!(one_way_ms, 55);
    }

    #[test]
    fn the_shortest_round_trip_is_kept_and_a_stale_one_is_replaced() {
        let mut c = ClockEstimate::default();
        let (s, a, n) = exchange(10_000, -200, 40, 0);
        c.sample(s, a, n);
        // Held 100 ms (an idle heartbeat): a worse estimate, not taken.
        let (s, a, n) = exchange(10_100, -200, 40, 100);
        c.sample(s, a, n);
        assert_eq!(c.get().unwrap().offset_ms, -200);
        // The peer restarted with another clock: its estimate replaces the old one once that
        // is older than the time an estimate is kept.
        let (s, a, n) = exchange(13_000, 150, 40, 20);
        c.sample(s, a, n);
        assert!((150..=160).contains(&c.get().unwrap().offset_ms));
    }

    #[test]
    fn a_hostile_or_unacknowledged_batch_is_bounded_or_ignored() {
        let mut c = ClockEstimate::default();
        c.sample(12_000, 0, 10_000);
        assert_eq!(c.get(), None, "no acknowledgement yet: no round trip");
        c.sample(12_000, 10_500, 10_000);
        assert_eq!(c.get(), None, "an acknowledgement from our future");
        c.sample(u64::MAX, 9_990, 10_000);
        assert_eq!(
            c.get().unwrap().offset_ms,
            levee_core::escrow::MAX_CLOCK_SKEW_MS as i64
        );
    }
}
