//! Evaluating a check of a token (or leaky) bucket: against the node's own sub-bucket.

use crate::decision::DecideCtx;
use crate::rights::{NANO, ceil_mul_div, tokens_of};
use crate::rule::Target;

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
            // The node holds too little to ever grant the cost by itself: the time the whole
            // bucket would need.
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
            ..Evaluation::decided(would_allow, available, reset, retry_after_ms, e)
        }
    }
}
