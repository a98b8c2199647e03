//! The algorithms set's plans (`--set algorithms`): a classic world with every algorithm,
//! costs, refunds and mixed rules (docs/accuracy.md, "Every algorithm").

use levee_testkit::rng::SeededRng;

use crate::plan::{Algo, FaultKind, RunPlan};
use crate::scenario::Scenario;

impl Scenario {
    /// The algorithm an algorithms-set scenario enforces.
    pub fn algo(self) -> Option<Algo> {
        Some(match self {
            Scenario::FixedCosts => Algo::FixedWindow,
            Scenario::TokenBucket => Algo::TokenBucket,
            Scenario::LeakyBucket => Algo::LeakyBucket,
            Scenario::SlidingWindow => Algo::SlidingWindow,
            Scenario::SlidingLog => Algo::SlidingLog,
            Scenario::QuotaDay => Algo::QuotaDay,
            Scenario::Mixed => Algo::FixedWindow,
            _ => return None,
        })
    }

    /// An algorithms-set scenario's plan: the classic scenario `seed / 7` cycles to (so that
    /// every 70 seeds run every algorithm over every classic world), drawn from the same
    /// seed, with the algorithm, and costs and refunds. The requests of the main keys are
    /// thinned to 2 in 11 and each given a cost from 1–10 (mean 5.5: the demand in tokens
    /// stays the classic one); a tenth of them are refunded 1–300 ms after they are admitted.
    /// The probe key keeps its checks of cost 1. A day's quota is half the tokens the classic
    /// limit allows over the run.
    pub fn plan_algorithm(self, algo: Algo, seed: u64) -> RunPlan {
        let mut plan = Scenario::for_seed(seed / Scenario::ALGORITHMS.len() as u64).plan(seed);
        let mut rng = SeededRng::stream(seed, "costs");
        let mixed = self == Scenario::Mixed;
        plan.requests.retain_mut(|r| {
            if mixed {
                r.class = 1;
            }
            if Some(r.key) == plan.probe {
                return true;
            }
            if rng.below(11) >= 2 {
                return false;
            }
            r.cost = rng.range(1, 10) as u16;
            if mixed {
                r.class = if rng.below(10) < 7 { 1 } else { 2 };
            } else if rng.below(10) == 0 {
                r.refund_ms = rng.range(1, 300) as u16;
            }
            true
        });
        plan.mixed = mixed;
        // A process that restarts keeps its machine's clock. (The classic set draws a new
        // offset, which a window's count does not see; a bucket or a log counts time across
        // the restart, and a clock stepped forward there lets a node re-admit early: see
        // docs/accuracy.md, "Every algorithm".)
        for f in &mut plan.faults {
            if let FaultKind::Restart { node, offset } = &mut f.kind {
                *offset = plan.offsets[*node];
            }
        }
        plan.scenario = self;
        plan.set_algo(algo);
        plan
    }
}
