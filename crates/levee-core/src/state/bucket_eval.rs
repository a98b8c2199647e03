//! Evaluating a check of a token (or leaky) bucket: the node's own sub-bucket in strict
//! mode, the global level of every node's sub-bucket in optimistic mode.

use crate::decision::{Consistency, DecideCtx};
use crate::rights::{NANO, ceil_mul_div, sub_bucket_level, tokens_of};
use crate::rule::Target;

use super::allowance::{Allowance, allowance_room};
use super::evaluate::{Evaluation, Reset, threshold};
use super::key_state::KeyState;

impl KeyState {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn eval_bucket(
        &self,
        target: &Target<'_>,
        rate: u64,
        per_ms: u64,
        burst: u64,
        e: u64,
        cost: u64,
        ctx: &DecideCtx<'_>,
    ) -> Evaluation {
        let (level, units) = self.own_level(target, ctx);
        let cap = i128::from(units) * NANO;
        let cost_nt = i128::from(cost) * NANO;
        match ctx.view.consistency {
            Consistency::Strict => {
                let need_nt = cost_nt.max(i128::from(threshold(target.min_fill_ppm, units)) * NANO);
                let would_allow = level >= need_nt;
                let available = tokens_of(level);
                // This node's refill covers a deficit in `deficit × burst × per / (units × rate)`.
                let mul = u128::from(burst) * u128::from(per_ms);
                let div = u128::from(units) * u128::from(rate) * NANO as u128;
                let retry_after_ms = if would_allow {
                    0
                } else if need_nt <= cap {
                    ceil_mul_div((need_nt - level) as u128, mul, div).max(1)
                } else {
                    // The node holds too little to ever grant the cost by itself: the time the
                    // whole bucket would need.
                    ceil_mul_div(
                        need_nt as u128,
                        u128::from(per_ms),
                        u128::from(rate) * NANO as u128,
                    )
                    .max(1)
                };
                let reset = if units == 0 {
                    Reset::Known { taken: 0, kept: 0 }
                } else {
                    Reset::Refill {
                        deficit_nt: (cap - level).max(0),
                        cost_nt,
                        mul,
                        div,
                    }
                };
                Evaluation {
                    level_nt: level,
                    bucket_units: units,
                    bucket_level_nt: level,
                    ..Evaluation::decided(
                        would_allow,
                        available,
                        reset,
                        retry_after_ms,
                        e,
                        Allowance::default(),
                    )
                }
            }
            Consistency::Optimistic => {
                let global = self.global_level(target, rate, per_ms, burst, ctx);
                let allowance = self.allowance(global, e, ctx);
                let room = global.min(allowance_room(&allowance, i128::from(burst) * NANO, ctx));
                let need_nt = cost_nt.max(i128::from(threshold(target.min_fill_ppm, burst)) * NANO);
                let would_allow = room >= need_nt;
                let available = tokens_of(room);
                let mul = u128::from(per_ms);
                let div = u128::from(rate) * NANO as u128;
                let retry_after_ms = if would_allow {
                    0
                } else {
                    ceil_mul_div((need_nt - global).max(0) as u128, mul, div).max(1)
                };
                let deficit_nt = (i128::from(burst) * NANO - global).max(0);
                Evaluation {
                    level_nt: level,
                    bucket_units: burst,
                    bucket_level_nt: global,
                    ..Evaluation::decided(
                        would_allow,
                        available,
                        Reset::Refill {
                            deficit_nt,
                            cost_nt,
                            mul,
                            div,
                        },
                        retry_after_ms,
                        e,
                        allowance,
                    )
                }
            }
        }
    }

    /// Optimistic mode: the global bucket level, summing every node's projected sub-bucket;
    /// a node of an unreachable region counts as having spent its whole share.
    fn global_level(
        &self,
        target: &Target<'_>,
        rate: u64,
        per_ms: u64,
        burst: u64,
        ctx: &DecideCtx<'_>,
    ) -> i128 {
        let replicas = ctx.replicas;
        if replicas.len() == 1 {
            return self.own_level(target, ctx).0;
        }
        let base = target.static_split(replicas);
        let mut total = 0i128;
        for n in replicas.nodes() {
            let units = base[n.0 as usize];
            let level = sub_bucket_level(
                self.crdt.buckets.get(n),
                units,
                units,
                (rate, per_ms, burst),
                ctx.now,
            );
            let reachable = n == ctx.me || !ctx.view.unreachable.contains(replicas.region_of(n));
            total += if reachable { level } else { level.min(0) };
        }
        total
    }
}
