//! What a notice says, the window it belongs to, and its `Idempotency-Key`.

use levee_core::Algorithm;
use serde::Serialize;

/// One threshold crossing, as POSTed (the JSON body of API.md, "Threshold notices").
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Notice {
    /// The rule's name.
    pub rule: String,
    /// The key.
    pub key: String,
    /// The fraction of the limit crossed, as configured.
    pub threshold: f64,
    /// What the key had used when it crossed (the limit less the global `remaining` the
    /// deciding node knew).
    pub used: u64,
    /// The key's limit (a token bucket's capacity).
    pub limit: u64,
    /// Where the window of the crossing starts, in ms since the Unix epoch
    /// ([`window_start_ms`]).
    pub window_start_ms: u64,
    /// The region of the node that decided.
    pub region: String,
    /// The node that decided.
    pub node: String,
    /// When it crossed (the decision's time), in ms since the Unix epoch.
    pub at_ms: u64,
}

impl Notice {
    /// `<rule>/<key>/<threshold>/<window_start_ms>`: see [`idempotency_key`].
    pub fn idempotency_key(&self) -> String {
        idempotency_key(&self.rule, &self.key, self.threshold, self.window_start_ms)
    }
}

/// The `Idempotency-Key` of a crossing: `<rule>/<key>/<threshold>/<window_start_ms>`, the
/// threshold written as in the JSON body (`0.8`, `1.0`). Every node of every region computes
/// the same value for the same crossing. The key's control characters (never valid in a
/// header) are percent-encoded (`%0A`); nothing else is.
pub fn idempotency_key(rule: &str, key: &str, threshold: f64, window_start_ms: u64) -> String {
    let mut out = String::with_capacity(rule.len() + key.len() + 24);
    out.push_str(rule);
    out.push('/');
    for c in key.chars() {
        if c.is_ascii_control() {
            out.push_str(&format!("%{:02X}", c as u32));
        } else {
            out.push(c);
        }
    }
    out.push('/');
    out.push_str(&serde_json::to_string(&threshold).unwrap_or_else(|_| threshold.to_string()));
    out.push('/');
    out.push_str(&window_start_ms.to_string());
    out
}

/// Where the window containing `now` starts, on a grid every node computes alike from the rule
/// alone: a fixed or sliding window's own window, a quota's calendar day or month (UTC). A
/// token bucket has no windows; its grid is the time an empty bucket takes to refill
/// (`burst × per / rate`, rounded up to whole seconds, as `RateLimit-Policy` announces it),
/// aligned to the Unix epoch.
pub fn window_start_ms(algorithm: &Algorithm, now: u64) -> u64 {
    match algorithm {
        Algorithm::TokenBucket { .. } => {
            let len = algorithm.policy_window_secs(now) * 1000;
            now - now % len
        }
        _ => algorithm.epoch_start(algorithm.epoch(now)),
    }
}

/// Where the window containing `now` ends (exclusive).
pub(super) fn window_end_ms(algorithm: &Algorithm, now: u64) -> u64 {
    match algorithm {
        Algorithm::TokenBucket { .. } => {
            window_start_ms(algorithm, now) + algorithm.policy_window_secs(now) * 1000
        }
        _ => algorithm.epoch_end(algorithm.epoch(now)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_idempotency_key_writes_the_threshold_as_json_does() {
        assert_eq!(
            idempotency_key("api", "acme", 0.8, 60_000),
            "api/acme/0.8/60000"
        );
        assert_eq!(idempotency_key("api", "acme", 1.0, 0), "api/acme/1.0/0");
        assert_eq!(idempotency_key("r", "a/b\nc", 0.9, 5), "r/a/b%0Ac/0.9/5");
    }

    #[test]
    fn windows_follow_the_rules_grid() {
        let fixed = Algorithm::FixedWindow {
            limit: 10,
            window_ms: 60_000,
        };
        assert_eq!(window_start_ms(&fixed, 125_000), 120_000);
        assert_eq!(window_end_ms(&fixed, 125_000), 180_000);
        // 200 tokens at 100 per second: an empty bucket refills in 2 s.
        let bucket = Algorithm::TokenBucket {
            rate: 100,
            per_ms: 1000,
            burst: 200,
            shaping: None,
        };
        assert_eq!(window_start_ms(&bucket, 5_500), 4_000);
        assert_eq!(window_end_ms(&bucket, 5_500), 6_000);
    }
}
