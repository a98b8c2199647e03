//! The local cap: a token bucket per (rule, key) in this process, used only when no node
//! answers, holding a fraction of the rule's figures; at most `max_keys` buckets.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

/// Local token buckets from the rules' figures (see [`crate::Fallback::LocalCap`]).
pub struct LocalCap {
    fraction: f64,
    max_keys: usize,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// Rule name → (capacity, tokens per ms), already scaled by the fraction.
    rules: HashMap<String, (f64, f64)>,
    buckets: HashMap<(String, String), Bucket>,
}

struct Bucket {
    tokens: f64,
    at: Instant,
}

/// ms in a duration string of the API (`"20ms"`, `"1s"`, `"1m"`, `"1h"`, `"1d"`).
fn duration_ms(s: &str) -> Option<f64> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit() && c != '.')?;
    let (n, unit) = s.split_at(split);
    let n: f64 = n.parse().ok()?;
    let per = match unit {
        "ms" => 1.0,
        "s" => 1_000.0,
        "m" => 60_000.0,
        "h" => 3_600_000.0,
        "d" => 86_400_000.0,
        _ => return None,
    };
    Some(n * per)
}

/// (capacity, tokens per ms) of one rule of `GET /v1/rules`.
fn figures(rule: &serde_json::Value) -> Option<(f64, f64)> {
    let num = |f: &str| rule.get(f).and_then(serde_json::Value::as_f64);
    let text = |f: &str| rule.get(f).and_then(serde_json::Value::as_str);
    match text("algorithm")? {
        "token_bucket" | "leaky_bucket" => {
            let rate = num("rate")?;
            let per = duration_ms(text("per")?)?;
            Some((num("burst").unwrap_or(rate), rate / per))
        }
        "quota" => {
            let limit = num("limit")?;
            let period = match text("period")? {
                "day" => 86_400_000.0,
                _ => 31.0 * 86_400_000.0,
            };
            Some((limit, limit / period))
        }
        _ => {
            let limit = num("limit")?;
            Some((limit, limit / duration_ms(text("window")?)?))
        }
    }
}

impl LocalCap {
    pub(crate) fn new(fraction: f64, max_keys: usize) -> LocalCap {
        LocalCap {
            fraction,
            max_keys,
            state: Mutex::new(State::default()),
        }
    }

    /// Takes the figures of every rule of a `GET /v1/rules` answer.
    pub(crate) fn set_rules(&self, answer: &serde_json::Value) {
        let Some(rules) = answer.get("rules").and_then(|r| r.as_array()) else {
            return;
        };
        let mut st = self.state.lock().expect("cap lock");
        for r in rules {
            if let (Some(name), Some((cap, rate))) =
                (r.get("name").and_then(|n| n.as_str()), figures(r))
            {
                st.rules
                    .insert(name.to_owned(), (cap * self.fraction, rate * self.fraction));
            }
        }
    }

    /// Decides locally: (allowed, remaining, capacity). A rule whose figures are unknown is
    /// denied.
    pub(crate) fn take(&self, rule: &str, key: &str, cost: u64, dry_run: bool) -> (bool, u64, u64) {
        let mut st = self.state.lock().expect("cap lock");
        let Some(&(cap, rate)) = st.rules.get(rule) else {
            return (false, 0, 0);
        };
        let now = Instant::now();
        let id = (rule.to_owned(), key.to_owned());
        if !st.buckets.contains_key(&id) && st.buckets.len() >= self.max_keys {
            // Bounded: forget the bucket least recently touched.
            if let Some(oldest) = st
                .buckets
                .iter()
                .min_by_key(|(_, b)| b.at)
                .map(|(k, _)| k.clone())
            {
                st.buckets.remove(&oldest);
            }
        }
        let b = st.buckets.entry(id).or_insert(Bucket {
            tokens: cap,
            at: now,
        });
        let elapsed = now.duration_since(b.at).as_secs_f64() * 1000.0;
        b.tokens = (b.tokens + elapsed * rate).min(cap);
        b.at = now;
        let cost = cost as f64;
        let allowed = b.tokens >= cost;
        if allowed && !dry_run {
            b.tokens -= cost;
        }
        (allowed, b.tokens.max(0.0) as u64, cap as u64)
    }

    /// Buckets held (for tests).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.state.lock().expect("cap lock").buckets.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cap(fraction: f64, max_keys: usize) -> LocalCap {
        let c = LocalCap::new(fraction, max_keys);
        c.set_rules(&serde_json::json!({"rules": [
            {"name": "search", "algorithm": "fixed_window", "limit": 1000, "window": "1m"},
            {"name": "api", "algorithm": "token_bucket", "rate": 100, "per": "1s", "burst": 200}
        ]}));
        c
    }

    #[test]
    fn the_local_cap_grants_the_fraction_of_the_rules_figures_then_denies() {
        let c = cap(0.1, 10);
        let granted = (0..200)
            .filter(|_| c.take("search", "acme", 1, false).0)
            .count();
        // 10% of 1,000 a minute, plus at most a token or two refilled while the loop runs.
        assert!((100..=102).contains(&granted), "granted {granted}");
        assert!(!c.take("unknown", "acme", 1, false).0);
        assert_eq!(c.take("api", "acme", 1, true), (true, 20, 20));
    }

    #[test]
    fn the_local_cap_holds_at_most_max_keys_buckets() {
        let c = cap(1.0, 3);
        for i in 0..10 {
            c.take("search", &format!("k{i}"), 1, false);
        }
        assert_eq!(c.len(), 3);
    }

    #[test]
    fn durations_parse_like_the_api() {
        assert_eq!(duration_ms("20ms"), Some(20.0));
        assert_eq!(duration_ms("1m"), Some(60_000.0));
        assert_eq!(duration_ms("2x"), None);
    }
}
