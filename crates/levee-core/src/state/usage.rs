//! A key's usage as this node sees it, summed per region: what `GET /v1/usage/{rule}/{key}`
//! reports.

use crate::decision::{DecideCtx, Usage};
use crate::replica::{NodeIdx, ReplicaSet};
use crate::rights::{NANO, ceil_div, holdings, sub_bucket_level};
use crate::rule::{Algorithm, Target};

use super::key_state::KeyState;

impl KeyState {
    /// This key's usage as this node sees it, summed per region.
    pub fn usage(&self, target: &Target<'_>, ctx: &DecideCtx<'_>) -> Usage {
        let algo = target.algorithm;
        let replicas = ctx.replicas;
        let now = ctx.now;
        let e = algo.epoch(now);
        let limit = algo.capacity();
        let mut regions = vec![0u64; replicas.region_count()];
        let reset_after_ms;
        match *algo {
            Algorithm::FixedWindow { .. } | Algorithm::Quota { .. } => {
                if let Some(slot) = self.crdt.slot(e) {
                    for (n, t) in slot.tallies.iter() {
                        if let Some(r) = regions.get_mut(region_index(replicas, n)) {
                            *r = r.saturating_add(t.net());
                        }
                    }
                }
                let used = regions.iter().fold(0u64, |s, r| s.saturating_add(*r));
                reset_after_ms = if used > 0 { algo.epoch_end(e) - now } else { 0 };
            }
            Algorithm::SlidingWindow { window_ms, .. } => {
                let el = now - algo.epoch_start(e);
                let (cur, prev) = (self.crdt.slot(e), self.crdt.slot(e.wrapping_sub(1)));
                let mut any_cur = false;
                let mut any_prev = false;
                let mut nums = vec![0u128; regions.len()];
                for (slot, weight) in [
                    (cur, u128::from(window_ms)),
                    (prev, u128::from(window_ms - el)),
                ] {
                    let Some(slot) = slot else { continue };
                    for (n, t) in slot.tallies.iter() {
                        if let Some(r) = nums.get_mut(region_index(replicas, n)) {
                            *r += u128::from(t.net()) * weight;
                        }
                        if t.net() > 0 {
                            if slot.epoch == e {
                                any_cur = true;
                            } else {
                                any_prev = true;
                            }
                        }
                    }
                }
                for (r, num) in regions.iter_mut().zip(nums) {
                    *r = num.div_ceil(u128::from(window_ms)) as u64;
                }
                reset_after_ms = if any_cur {
                    2 * window_ms - el
                } else if any_prev {
                    window_ms - el
                } else {
                    0
                };
            }
            Algorithm::SlidingLog { window_ms, .. } => {
                let mut newest = None;
                for slot in self.log_window(now, window_ms) {
                    for (n, t) in slot.tallies.iter() {
                        if let Some(r) = regions.get_mut(region_index(replicas, n)) {
                            *r = r.saturating_add(t.net());
                        }
                        if t.net() > 0 {
                            newest = Some(slot.epoch);
                        }
                    }
                }
                reset_after_ms = newest.map_or(0, |t| (t + window_ms).saturating_sub(now));
            }
            Algorithm::TokenBucket {
                rate,
                per_ms,
                burst,
                ..
            } => {
                let base = replicas.split(burst);
                let mut deficit_total: i128 = 0;
                for n in replicas.nodes() {
                    let units = holdings(base[n.0 as usize], &self.crdt.holdings, n);
                    let cap = i128::from(units) * NANO;
                    let level = sub_bucket_level(
                        self.crdt.buckets.get(n),
                        base[n.0 as usize],
                        units,
                        (rate, per_ms, burst),
                        now,
                    );
                    let deficit = (cap - level).max(0);
                    deficit_total += deficit;
                    if let Some(r) = regions.get_mut(region_index(replicas, n)) {
                        *r = r.saturating_add(ceil_div(deficit, NANO) as u64);
                    }
                }
                reset_after_ms =
                    ceil_div(deficit_total * i128::from(per_ms), i128::from(rate) * NANO) as u64;
            }
        }
        let used = regions
            .iter()
            .fold(0u64, |s, r| s.saturating_add(*r))
            .min(limit);
        Usage {
            limit,
            used,
            remaining: limit - used,
            reset_after_ms,
            regions,
        }
    }
}

#[inline]
fn region_index(replicas: &ReplicaSet, n: NodeIdx) -> usize {
    if usize::from(n.0) < replicas.len() {
        usize::from(replicas.region_of(n).0)
    } else {
        usize::MAX
    }
}
