//! A key's part in strict mode's escrow: sampling this node's demand, publishing it, and
//! giving spare rights toward the demand of others ([`crate::escrow`] decides where).

use crate::decision::Consistency;
use crate::escrow::{self, RebalanceCtx};
use crate::rule::Target;

use super::key_state::KeyState;

impl KeyState {
    /// Updates this node's demand forecast and, in strict mode, gives spare rights toward
    /// demand. Returns the rights given. Call it every gossip interval for keys with recent
    /// activity, and when a peer asks for rights; then send [`KeyState::take_delta`].
    pub fn rebalance(&mut self, target: &Target<'_>, ctx: &RebalanceCtx<'_>) -> u64 {
        let algo = target.algorithm;
        let now = ctx.now;
        let epoch_len = algo.epoch_len(now);
        self.sample_forecast(now, epoch_len);
        let forecast = match self.forecast() {
            Some(f) if ctx.owner == ctx.me => f.expected(epoch_len),
            _ => 0,
        };
        if escrow::publish_demand(&mut self.crdt, algo, ctx.me, now, forecast) {
            self.pending.demand = true;
        }
        if ctx.view.consistency != Consistency::Strict {
            return 0;
        }
        let gifts = escrow::give_spare(&mut self.crdt, target, ctx);
        self.pending.slot_transfers |= gifts.epoch_transfers;
        self.pending.holdings |= gifts.holdings;
        self.pending.bucket |= gifts.bucket;
        gifts.given
    }
}
