//! An algorithm's validated figures and the arithmetic of its epochs: which window, period or
//! refill period contains a time, where it starts and ends, and how many a key keeps.

use serde::{Deserialize, Serialize};

use crate::calendar::CalendarPeriod;
use crate::time::Millis;

/// The name of an algorithm, as written in a configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AlgorithmName {
    /// `rate` tokens per `per`, bucket of `burst`.
    TokenBucket,
    /// `limit` per `window`, windows aligned to the Unix epoch.
    FixedWindow,
    /// The weighted two-window counter: current + previous × overlap.
    SlidingWindow,
    /// `limit` per calendar day or month in UTC.
    Quota,
    /// `limit` admissions in any sliding `window`, counted exactly from a log of admissions.
    SlidingLog,
    /// nginx `limit_req … burst= delay=`: requests beyond `rate` per `per` queue up to
    /// `burst` and are released at the rate (`delay_ms` in the answer).
    LeakyBucket,
}

/// A leaky bucket's shaping, on top of the token bucket that decides it (nginx `limit_req`'s
/// `burst` and `delay`). The bucket's capacity is `queue + 1`: the request that proceeds now
/// and `queue` waiting behind it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub struct Shaping {
    /// Requests that may wait (nginx `burst`).
    pub queue: u64,
    /// Of those, how many proceed at once (nginx `delay`; 0 delays every excess request).
    pub delay: u64,
}

/// The figures of one algorithm, validated, in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(tag = "algorithm", rename_all = "snake_case")]
pub enum Algorithm {
    /// `rate` tokens per `per_ms`, capacity `burst`.
    TokenBucket {
        /// Tokens per `per_ms`.
        rate: u64,
        /// Refill period in ms.
        per_ms: Millis,
        /// Capacity.
        burst: u64,
        /// A leaky bucket's shaping (`burst` is then its queue plus one); `None` for a token
        /// bucket.
        shaping: Option<Shaping>,
    },
    /// `limit` per aligned window.
    FixedWindow {
        /// Tokens per window.
        limit: u64,
        /// Window length in ms.
        window_ms: Millis,
    },
    /// Weighted two-window counter.
    SlidingWindow {
        /// Tokens per window.
        limit: u64,
        /// Window length in ms.
        window_ms: Millis,
    },
    /// `limit` per calendar period.
    Quota {
        /// Tokens per period.
        limit: u64,
        /// Day or month, UTC.
        period: CalendarPeriod,
    },
    /// `limit` admissions (weighted by cost) in the last `window_ms`, exactly: a log of
    /// admission times. Its epochs (demand, forecasts) are aligned windows; its log entries
    /// are the key's slots, one per millisecond that admitted something (see
    /// [`crate::state`]).
    SlidingLog {
        /// Tokens per sliding window, at most [`crate::rule::MAX_LOG_LIMIT`].
        limit: u64,
        /// Window length in ms.
        window_ms: Millis,
    },
}

impl Algorithm {
    /// Whether a refund that gives back an admission nobody was told of (a forwarded check
    /// whose owner answered after the forwarder had decided it alone) takes back only what
    /// that admission took, if the owner applies it at most `after_ms` after the check was
    /// asked for; `reset_after_ms` is what the admission answered.
    ///
    /// A bucket's refund raises the level it lowered, capped at the bucket: never fuller than
    /// had the admission not happened, whenever it comes. A window's refund draws from the
    /// window it arrives in: an admission of an earlier window given back there frees a right
    /// the later window never granted, and that window admits more than its limit. So a
    /// fixed window or a quota is given back only while the admission's window surely still
    /// runs: it ends `reset_after_ms` after the decision, which came after the ask (a
    /// difference of one clock, the owner's: the nodes' skew plays no part). A sliding
    /// window's current epoch ends a window before the `reset_after_ms` of an admission in
    /// it. A sliding log's refund removes the newest of the node's entries, not the one
    /// admitted: never given back.
    pub fn late_refund_is_safe(&self, reset_after_ms: u64, after_ms: u64) -> bool {
        match *self {
            Algorithm::TokenBucket { .. } => true,
            Algorithm::FixedWindow { .. } | Algorithm::Quota { .. } => reset_after_ms > after_ms,
            Algorithm::SlidingWindow { window_ms, .. } => {
                reset_after_ms.saturating_sub(window_ms) > after_ms
            }
            Algorithm::SlidingLog { .. } => false,
        }
    }

    /// The global limit: tokens per window, or the bucket's capacity.
    #[inline]
    pub fn capacity(&self) -> u64 {
        match *self {
            Algorithm::TokenBucket { burst, .. } => burst,
            Algorithm::FixedWindow { limit, .. }
            | Algorithm::SlidingWindow { limit, .. }
            | Algorithm::SlidingLog { limit, .. }
            | Algorithm::Quota { limit, .. } => limit,
        }
    }

    /// The epoch (window, period or refill period number) that contains `now`. Demand and
    /// usage are counted per epoch; window algorithms also hold rights per epoch.
    #[inline]
    pub fn epoch(&self, now: Millis) -> u64 {
        match *self {
            Algorithm::TokenBucket { per_ms, .. } => now / per_ms,
            Algorithm::FixedWindow { window_ms, .. }
            | Algorithm::SlidingWindow { window_ms, .. }
            | Algorithm::SlidingLog { window_ms, .. } => now / window_ms,
            Algorithm::Quota { period, .. } => period.index(now),
        }
    }

    /// Start of an epoch in ms.
    #[inline]
    pub fn epoch_start(&self, epoch: u64) -> Millis {
        match *self {
            Algorithm::TokenBucket { per_ms: w, .. }
            | Algorithm::FixedWindow { window_ms: w, .. }
            | Algorithm::SlidingWindow { window_ms: w, .. }
            | Algorithm::SlidingLog { window_ms: w, .. } => epoch.saturating_mul(w),
            Algorithm::Quota { period, .. } => period.start(epoch),
        }
    }

    /// When a node's share of this limit may grow after a change of the node list made at
    /// `now` (docs/membership.md): once nothing admitted or handed over under the shares
    /// before the change counts against the same limit as what the grown share admits. For a
    /// window or period, the one after the next: rights for the next one may already have
    /// been handed over, under the old shares, during this one (the escrow gives ahead by
    /// one epoch). The next one on the clock of a peer up to `max_clock_skew` ahead: such a
    /// peer may already be in this node's next epoch and have handed over rights of the one
    /// after (`levee-sim --seed 269 --scenario leave`: a node 288 ms ahead gave 62 rights of
    /// window 9 under its old share of 62, which then shrank to 61, while a region-mate's
    /// share grew from window 9 on: 370 of 369). For a sliding log, a whole window later;
    /// for a token bucket, once an emptied bucket would have refilled. (A share that shrinks
    /// applies at once.)
    pub fn shares_may_grow_at(&self, now: Millis) -> Millis {
        match *self {
            Algorithm::TokenBucket {
                rate,
                per_ms,
                burst,
                ..
            } => now.saturating_add(per_ms.saturating_mul(burst.div_ceil(rate.max(1)))),
            Algorithm::SlidingLog { window_ms, .. } => now.saturating_add(window_ms),
            Algorithm::FixedWindow { .. }
            | Algorithm::SlidingWindow { .. }
            | Algorithm::Quota { .. } => {
                let ahead = now.saturating_add(crate::escrow::MAX_CLOCK_SKEW_MS);
                self.epoch_end(self.epoch(ahead).saturating_add(1))
            }
        }
    }

    /// End (exclusive) of an epoch in ms.
    #[inline]
    pub fn epoch_end(&self, epoch: u64) -> Millis {
        match *self {
            Algorithm::Quota { period, .. } => period.end(epoch),
            _ => self.epoch_start(epoch.saturating_add(1)),
        }
    }

    /// The length of the epoch containing `now`.
    pub fn epoch_len(&self, now: Millis) -> Millis {
        let e = self.epoch(now);
        self.epoch_end(e) - self.epoch_start(e)
    }

    /// The window the `RateLimit-Policy` header announces, in seconds (rounded up): the
    /// window, the period, or for a token bucket the time to refill an empty bucket.
    pub fn policy_window_secs(&self, now: Millis) -> u64 {
        let ms = match *self {
            Algorithm::TokenBucket {
                rate,
                per_ms,
                burst,
                ..
            } => (u128::from(burst) * u128::from(per_ms)).div_ceil(u128::from(rate)) as u64,
            _ => self.epoch_len(now),
        };
        ms.div_ceil(1000).max(1)
    }

    /// How many epochs of counters a key keeps: the current one, the one before (sliding
    /// windows read it; late deltas still merge into it) and one more for clock skew.
    pub fn retained_epochs(&self) -> u64 {
        3
    }

    /// Whether a node that is not a key's owner may decide a check of it from the rights it
    /// holds (`cluster.local_first`): every algorithm whose decision needs nothing but this
    /// node's rights. A sliding log (its entries' times) and a leaky bucket (the queue's
    /// delay) are decided by the key's owner only.
    pub fn decided_where_held(&self) -> bool {
        matches!(
            self,
            Algorithm::TokenBucket { .. }
                | Algorithm::FixedWindow { .. }
                | Algorithm::SlidingWindow { .. }
                | Algorithm::Quota { .. }
        )
    }

    /// Whether rights are held per epoch (fixed windows and quotas) rather than continuously
    /// (token buckets and sliding windows, whose usage carries from one epoch to the next).
    #[inline]
    pub fn rights_per_epoch(&self) -> bool {
        matches!(
            self,
            Algorithm::FixedWindow { .. } | Algorithm::Quota { .. }
        )
    }

    /// The name a configuration gives it.
    pub(crate) fn name(&self) -> AlgorithmName {
        match self {
            Algorithm::TokenBucket {
                shaping: Some(_), ..
            } => AlgorithmName::LeakyBucket,
            Algorithm::TokenBucket { .. } => AlgorithmName::TokenBucket,
            Algorithm::FixedWindow { .. } => AlgorithmName::FixedWindow,
            Algorithm::SlidingWindow { .. } => AlgorithmName::SlidingWindow,
            Algorithm::Quota { .. } => AlgorithmName::Quota,
            Algorithm::SlidingLog { .. } => AlgorithmName::SlidingLog,
        }
    }

    /// The same algorithm with another capacity (and, for a token bucket, rate): a class's
    /// own bucket under the separate-buckets method.
    pub(crate) fn resized(&self, limit: u64, rate: Option<u64>) -> Algorithm {
        match *self {
            Algorithm::TokenBucket {
                per_ms, shaping, ..
            } => Algorithm::TokenBucket {
                rate: rate.unwrap_or(limit),
                per_ms,
                burst: limit,
                shaping: shaping.map(|s| Shaping {
                    queue: limit - 1,
                    delay: s.delay.min(limit - 1),
                }),
            },
            Algorithm::FixedWindow { window_ms, .. } => Algorithm::FixedWindow { limit, window_ms },
            Algorithm::SlidingWindow { window_ms, .. } => {
                Algorithm::SlidingWindow { limit, window_ms }
            }
            Algorithm::Quota { period, .. } => Algorithm::Quota { limit, period },
            Algorithm::SlidingLog { window_ms, .. } => Algorithm::SlidingLog { limit, window_ms },
        }
    }
}
