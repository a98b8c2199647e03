//! `leaky_bucket` on one node against nginx's `limit_req` as its source computes it
//! (`ngx_http_limit_req_lookup` and `ngx_http_limit_req_account`): per key an `excess` in
//! thousandths of a request and the time of the last accepted request; a request at `now`
//! makes `excess' = max(0, excess − rate × (now − last) + 1000)`, is refused when
//! `excess' > burst × 1000` (nothing is stored then), and otherwise waits
//! `(excess' − delay × 1000) / rate` ms when that is positive. A fresh key starts at
//! `excess' = 0`. nginx rounds that wait down to the millisecond; Levee rounds it up: the test
//! demands Levee's delay to be the exact quotient rounded up, and every decision to be nginx's.

use levee_core::{ClusterView, DecideCtx, KeyState, NodeIdx, ReplicaSet, RuleSpec};
use proptest::prelude::*;

const T0: u64 = 1_700_000_000_000;

/// nginx's state for one key, with `rate` in requests per second.
struct Nginx {
    rate: i64,
    burst: i64,
    delay: i64,
    state: Option<(i64, u64)>,
}

impl Nginx {
    /// `None` when refused; else the excess beyond `delay`, in thousandths of a request: the
    /// wait is that divided by the rate, in ms.
    fn request(&mut self, now: u64) -> Option<i64> {
        let excess = match self.state {
            None => 0,
            Some((excess, last)) => {
                let ms = now.saturating_sub(last) as i64;
                (excess - self.rate * 1000 * ms / 1000 + 1000).max(0)
            }
        };
        if excess > self.burst * 1000 {
            return None;
        }
        let last = match self.state {
            Some((_, last)) if now == last => last,
            _ => now,
        };
        self.state = Some((excess, last));
        Some((excess - self.delay * 1000).max(0))
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn a_leaky_bucket_on_one_node_decides_as_nginx_limit_req(
        rate in 1u64..30,
        burst in 0u64..8,
        delay_of_burst in 0u64..8,
        gaps in prop::collection::vec(prop_oneof![3 => 0u64..20, 2 => 0u64..400, 1 => 0u64..3_000], 1..80),
    ) {
        let delay = delay_of_burst.min(burst);
        let replicas = ReplicaSet::single("n1", "eu");
        let mut rule = RuleSpec::leaky_bucket("shape", rate, 1_000, burst, delay)
            .validate()
            .expect("valid");
        rule.bind(&replicas);
        let target = rule.target(None, 1).expect("cost 1 fits");
        let mut key = KeyState::new();
        let mut nginx = Nginx { rate: rate as i64, burst: burst as i64, delay: delay as i64, state: None };
        let mut now = T0;
        for (i, gap) in gaps.into_iter().enumerate() {
            now += gap;
            let ctx = DecideCtx { now, me: NodeIdx(0), replicas: &replicas, view: ClusterView::alone() };
            let d = key.decide(&target, rule.mode, 1, false, &ctx);
            let expected = nginx.request(now);
            prop_assert_eq!(d.allowed, expected.is_some(), "step {} at +{}", i, now - T0);
            // nginx waits floor(waiting / rate) ms; Levee the exact quotient rounded up.
            let waiting = expected.unwrap_or(0) as u64;
            prop_assert_eq!(d.delay_ms, waiting.div_ceil(rate), "delay_ms, step {}", i);
            prop_assert!(d.delay_ms - waiting / rate <= 1);
            if !d.allowed {
                prop_assert!(d.retry_after_ms > 0);
            }
        }
    }
}

#[test]
fn nginx_burst_5_delay_2_at_10r_s_three_at_once_then_one_every_100ms_then_refused() {
    let replicas = ReplicaSet::single("n1", "eu");
    let mut rule = RuleSpec::leaky_bucket("shape", 10, 1_000, 5, 2)
        .validate()
        .expect("valid");
    rule.bind(&replicas);
    let target = rule.target(None, 1).expect("cost 1 fits");
    let mut key = KeyState::new();
    let ctx = DecideCtx {
        now: T0,
        me: NodeIdx(0),
        replicas: &replicas,
        view: ClusterView::alone(),
    };
    let answers: Vec<(bool, u64)> = (0..8)
        .map(|_| {
            let d = key.decide(&target, rule.mode, 1, false, &ctx);
            (d.allowed, d.delay_ms)
        })
        .collect();
    assert_eq!(
        answers,
        [
            (true, 0),
            (true, 0),
            (true, 0),
            (true, 100),
            (true, 200),
            (true, 300),
            (false, 0),
            (false, 0)
        ]
    );
}
