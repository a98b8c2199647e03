//! Per-key overrides: a key's own figures instead of its rule's, or an allow or deny list
//! entry (API.md "Per-key overrides, allow and deny lists").
//!
//! * [`OverrideValue`]: what an override says (`limit`, `rate`+`burst`, `allow`, `deny`).
//! * [`Rule::override_effect`]: checks a value against its rule and builds the [`Effect`] a
//!   decision applies — for figures, the rule's algorithm with the key's own capacity (the
//!   same [`Algorithm`] a class's own bucket is built with), so every path that reads a key's
//!   figures (deciding, merging, rebalancing, usage) reads them from one [`crate::Target`].
//! * [`OverrideReg`]: the last-writer-wins register a cluster keeps per (rule, key): the value
//!   or a tombstone, its expiry, and the write's (time, writer) that orders it.
//! * [`OverrideSpec`] / [`ConfigOverrides`]: `[[rule.override]]`, exact keys and prefixes.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use crate::rule::{Algorithm, MAX_AMOUNT, MAX_BURST, MAX_LOG_LIMIT, Rule, Shaping};
use crate::time::Millis;

/// The most `[[rule.override]]` entries one rule may have.
pub const MAX_CONFIG_OVERRIDES: usize = 10_000;

/// What an override says about its key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OverrideValue {
    /// Windows, quotas and sliding logs: tokens per window or period.
    Limit(u64),
    /// Token and leaky buckets: tokens per the rule's `per`, and the burst (a leaky bucket's
    /// queue, as its rule's `burst`).
    Rate {
        /// Tokens per `per`.
        rate: u64,
        /// Capacity (token bucket) or queue (leaky bucket).
        burst: u64,
    },
    /// Always admitted, never counted.
    Allow,
    /// Always refused.
    Deny,
}

/// What a decision does for an overridden key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Effect {
    /// The key is decided by its rule's algorithm with these figures.
    Figures(Algorithm),
    /// Admitted without being counted.
    Allow,
    /// Refused.
    Deny,
}

/// An override value that does not fit its rule: the field and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {problem}")]
pub struct OverrideError {
    /// `limit`, `rate`, `burst` or `action`.
    pub field: &'static str,
    /// What is wrong.
    pub problem: String,
}

fn bad(field: &'static str, problem: impl Into<String>) -> OverrideError {
    OverrideError {
        field,
        problem: problem.into(),
    }
}

fn amount(field: &'static str, v: u64, max: u64) -> Result<u64, OverrideError> {
    match v {
        0 => Err(bad(field, "must be at least 1")),
        v if v > max => Err(bad(field, format!("must be at most {max}"))),
        v => Ok(v),
    }
}

impl Rule {
    /// What `value` does to a key of this rule, or why it does not fit the rule (a `limit` for
    /// a bucket, a `rate` for a window, a figure out of bounds). The figures replace the rule's
    /// own bucket (and its threshold classes'); a separate class's own bucket keeps its size.
    pub fn override_effect(&self, value: &OverrideValue) -> Result<Effect, OverrideError> {
        let name = self.algorithm.name();
        let kind = serde_plain_name(name);
        match (*value, self.algorithm) {
            (OverrideValue::Allow, _) => Ok(Effect::Allow),
            (OverrideValue::Deny, _) => Ok(Effect::Deny),
            (OverrideValue::Limit(_), Algorithm::TokenBucket { .. }) => Err(bad(
                "limit",
                format!("rule {:?} is a {kind}: give rate (and burst)", self.name),
            )),
            (OverrideValue::Rate { .. }, Algorithm::TokenBucket { .. }) => {
                let OverrideValue::Rate { rate, burst } = *value else {
                    unreachable!("matched above")
                };
                let rate = amount("rate", rate, MAX_AMOUNT)?;
                let Algorithm::TokenBucket {
                    per_ms, shaping, ..
                } = self.algorithm
                else {
                    unreachable!("matched above")
                };
                Ok(Effect::Figures(match shaping {
                    None => Algorithm::TokenBucket {
                        rate,
                        per_ms,
                        burst: amount("burst", burst, MAX_BURST)?,
                        shaping: None,
                    },
                    Some(s) => {
                        let queue = amount("burst", burst, MAX_BURST - 1)?;
                        Algorithm::TokenBucket {
                            rate,
                            per_ms,
                            burst: queue + 1,
                            shaping: Some(Shaping {
                                queue,
                                delay: s.delay.min(queue),
                            }),
                        }
                    }
                }))
            }
            (OverrideValue::Rate { .. }, _) => Err(bad(
                "rate",
                format!("rule {:?} is a {kind}: give limit", self.name),
            )),
            (OverrideValue::Limit(limit), algo) => {
                let max = match algo {
                    Algorithm::SlidingLog { .. } => MAX_LOG_LIMIT,
                    _ => MAX_AMOUNT,
                };
                let limit = amount("limit", limit, max)?;
                Ok(Effect::Figures(algo.resized(limit, None)))
            }
        }
    }
}

/// The algorithm's name as a configuration writes it.
fn serde_plain_name(name: crate::rule::AlgorithmName) -> &'static str {
    use crate::rule::AlgorithmName::*;
    match name {
        TokenBucket => "token_bucket",
        FixedWindow => "fixed_window",
        SlidingWindow => "sliding_window",
        Quota => "quota",
        SlidingLog => "sliding_log",
        LeakyBucket => "leaky_bucket",
    }
}

/// The most bytes of a writer's node id a register carries.
pub const MAX_WRITER_LEN: usize = 128;

/// One (rule, key)'s override as a cluster replicates it: a last-writer-wins register. The
/// write with the greater (`written_at`, `writer`, `value`, `expires_at`) wins, so every node
/// that has seen the same writes holds the same value whatever order they came in.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OverrideReg {
    /// The override, or `None`: deleted (a tombstone, kept so an older write cannot return).
    pub value: Option<OverrideValue>,
    /// When the override disappears by itself (wall-clock ms), if it has a `ttl`.
    pub expires_at: Option<Millis>,
    /// When it was written (the writer's wall clock, ms).
    pub written_at: Millis,
    /// The writing node's id.
    pub writer: String,
}

impl OverrideReg {
    /// Whether this write wins over `other`.
    pub fn wins_over(&self, other: &OverrideReg) -> bool {
        (self.written_at, &self.writer, self.value, self.expires_at)
            > (
                other.written_at,
                &other.writer,
                other.value,
                other.expires_at,
            )
    }

    /// The value in force at `now`: `None` when deleted or expired.
    pub fn live(&self, now: Millis) -> Option<OverrideValue> {
        match self.expires_at {
            Some(at) if now >= at => None,
            _ => self.value,
        }
    }
}

/// `[[rule.override]]` as a configuration writes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OverrideSpec {
    /// The key, or a prefix ending with one `*` (`"internal-*"`).
    pub key: String,
    /// Windows, quotas, sliding logs: the key's limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u64>,
    /// Buckets: the key's rate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate: Option<u64>,
    /// Buckets: the key's burst (defaults to `rate`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub burst: Option<u64>,
    /// `allow` or `deny`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub action: Option<String>,
}

/// The figures or list of an override body (`limit`, `rate`+`burst` or `action`): exactly one
/// kind given. The error names the field. Shared by the configuration and the HTTP API.
pub fn override_value(
    limit: Option<u64>,
    rate: Option<u64>,
    burst: Option<u64>,
    action: Option<&str>,
) -> Result<OverrideValue, OverrideError> {
    match (limit, rate, burst, action) {
        (_, _, _, Some(a)) => {
            let field = if limit.is_some() {
                Some("limit")
            } else if rate.is_some() {
                Some("rate")
            } else if burst.is_some() {
                Some("burst")
            } else {
                None
            };
            if let Some(f) = field {
                return Err(bad(f, "cannot be given with action"));
            }
            match a {
                "allow" => Ok(OverrideValue::Allow),
                "deny" => Ok(OverrideValue::Deny),
                _ => Err(bad("action", "must be \"allow\" or \"deny\"")),
            }
        }
        (Some(_), Some(_), _, None) => Err(bad("rate", "cannot be given with limit")),
        (Some(_), None, Some(_), None) => Err(bad("burst", "cannot be given with limit")),
        (Some(l), None, None, None) => Ok(OverrideValue::Limit(l)),
        (None, Some(r), b, None) => Ok(OverrideValue::Rate {
            rate: r,
            burst: b.unwrap_or(r),
        }),
        (None, None, Some(_), None) => Err(bad("rate", "is required with burst")),
        (None, None, None, None) => Err(bad(
            "limit",
            "one of limit, rate (and burst) or action is required",
        )),
    }
}

/// A rule's `[[rule.override]]` entries, validated: exact keys, and prefixes longest first.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ConfigOverrides {
    exact: HashMap<String, Effect>,
    prefixes: Vec<(String, Effect)>,
}

impl ConfigOverrides {
    /// Validates `specs` against `rule`; the error names the entry and its field
    /// (`override[2].limit`).
    pub(crate) fn build(
        rule: &Rule,
        specs: &[OverrideSpec],
    ) -> Result<ConfigOverrides, (String, String)> {
        if specs.len() > MAX_CONFIG_OVERRIDES {
            return Err((
                "override".into(),
                format!("at most {MAX_CONFIG_OVERRIDES} entries"),
            ));
        }
        let mut out = ConfigOverrides::default();
        for (i, s) in specs.iter().enumerate() {
            let f = |field: &str| format!("override[{i}].{field}");
            let effect = override_value(s.limit, s.rate, s.burst, s.action.as_deref())
                .and_then(|v| rule.override_effect(&v))
                .map_err(|e| (f(e.field), e.problem))?;
            let (key, prefix) = match s.key.strip_suffix('*') {
                Some(p) => (p, true),
                None => (s.key.as_str(), false),
            };
            if key.contains('*') {
                return Err((f("key"), "may hold `*` only once, at its end".into()));
            }
            if (key.is_empty() && !prefix) || s.key.len() > 1024 {
                return Err((f("key"), "must be 1 to 1024 bytes".into()));
            }
            let dup = if prefix {
                out.prefixes.iter().any(|(p, _)| p == key)
            } else {
                out.exact.contains_key(key)
            };
            if dup {
                return Err((f("key"), format!("{:?} appears twice", s.key)));
            }
            if prefix {
                out.prefixes.push((key.to_owned(), effect));
            } else {
                out.exact.insert(key.to_owned(), effect);
            }
        }
        out.prefixes
            .sort_by(|a, b| b.0.len().cmp(&a.0.len()).then_with(|| a.0.cmp(&b.0)));
        Ok(out)
    }

    /// The override of `key`: its exact entry, else its longest matching prefix.
    pub fn get(&self, key: &str) -> Option<&Effect> {
        self.exact.get(key).or_else(|| {
            self.prefixes
                .iter()
                .find(|(p, _)| key.starts_with(p.as_str()))
                .map(|(_, e)| e)
        })
    }

    /// Whether there is none.
    pub fn is_empty(&self) -> bool {
        self.exact.is_empty() && self.prefixes.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rule::RuleSpec;

    fn window() -> Rule {
        RuleSpec::fixed_window("w", 10, 1_000).validate().unwrap()
    }

    fn bucket() -> Rule {
        RuleSpec::token_bucket("b", 5, 1_000, 10)
            .validate()
            .unwrap()
    }

    #[test]
    fn a_limit_fits_a_window_and_not_a_bucket() {
        assert_eq!(
            window().override_effect(&OverrideValue::Limit(50)),
            Ok(Effect::Figures(Algorithm::FixedWindow {
                limit: 50,
                window_ms: 1_000
            }))
        );
        assert_eq!(
            bucket()
                .override_effect(&OverrideValue::Limit(50))
                .unwrap_err()
                .field,
            "limit"
        );
        let rate = OverrideValue::Rate { rate: 1, burst: 1 };
        assert_eq!(window().override_effect(&rate).unwrap_err().field, "rate");
        assert_eq!(
            bucket().override_effect(&rate),
            Ok(Effect::Figures(Algorithm::TokenBucket {
                rate: 1,
                per_ms: 1_000,
                burst: 1,
                shaping: None
            }))
        );
    }

    #[test]
    fn figures_out_of_bounds_name_their_field() {
        let e = |r: &Rule, v| r.override_effect(&v).unwrap_err().field;
        assert_eq!(e(&window(), OverrideValue::Limit(0)), "limit");
        assert_eq!(e(&window(), OverrideValue::Limit(MAX_AMOUNT + 1)), "limit");
        let b = bucket();
        assert_eq!(e(&b, OverrideValue::Rate { rate: 0, burst: 1 }), "rate");
        assert_eq!(e(&b, OverrideValue::Rate { rate: 1, burst: 0 }), "burst");
        let big = MAX_BURST + 1;
        assert_eq!(
            e(
                &b,
                OverrideValue::Rate {
                    rate: 1,
                    burst: big
                }
            ),
            "burst"
        );
        let log = RuleSpec {
            limit: Some(10),
            window: Some(crate::HumanDuration::from_millis(1_000)),
            ..RuleSpec::new("l", crate::rule::AlgorithmName::SlidingLog)
        }
        .validate()
        .unwrap();
        assert_eq!(e(&log, OverrideValue::Limit(MAX_LOG_LIMIT + 1)), "limit");
    }

    #[test]
    fn a_body_gives_exactly_one_kind() {
        assert_eq!(
            override_value(None, Some(3), None, None),
            Ok(OverrideValue::Rate { rate: 3, burst: 3 })
        );
        assert_eq!(
            override_value(Some(1), None, None, Some("allow"))
                .unwrap_err()
                .field,
            "limit"
        );
        assert_eq!(
            override_value(None, None, None, Some("maybe"))
                .unwrap_err()
                .field,
            "action"
        );
        assert_eq!(
            override_value(Some(1), Some(1), None, None)
                .unwrap_err()
                .field,
            "rate"
        );
        assert_eq!(
            override_value(None, None, Some(1), None).unwrap_err().field,
            "rate"
        );
        assert_eq!(
            override_value(None, None, None, None).unwrap_err().field,
            "limit"
        );
    }

    #[test]
    fn the_later_write_wins_whatever_the_order() {
        let reg = |at, writer: &str, v| OverrideReg {
            value: v,
            expires_at: None,
            written_at: at,
            writer: writer.into(),
        };
        let a = reg(5, "a", Some(OverrideValue::Allow));
        let b = reg(5, "b", None);
        let c = reg(4, "z", Some(OverrideValue::Deny));
        assert!(b.wins_over(&a) && !a.wins_over(&b));
        assert!(a.wins_over(&c) && b.wins_over(&c));
        assert!(!a.wins_over(&a));
        let ttl = OverrideReg {
            expires_at: Some(10),
            ..a.clone()
        };
        assert_eq!(ttl.live(9), Some(OverrideValue::Allow));
        assert_eq!(ttl.live(10), None);
        assert_eq!(b.live(0), None);
    }

    #[test]
    fn an_exact_key_wins_over_a_prefix_and_the_longest_prefix_wins() {
        let spec = |key: &str, limit| OverrideSpec {
            key: key.into(),
            limit: Some(limit),
            rate: None,
            burst: None,
            action: None,
        };
        let w = window();
        let o = ConfigOverrides::build(
            &w,
            &[spec("int-*", 1), spec("int-a", 2), spec("int-ab*", 3)],
        )
        .unwrap();
        let limit = |k| {
            o.get(k).map(|e| match e {
                Effect::Figures(a) => a.capacity(),
                _ => 0,
            })
        };
        assert_eq!(limit("int-a"), Some(2));
        assert_eq!(limit("int-abc"), Some(3));
        assert_eq!(limit("int-x"), Some(1));
        assert_eq!(limit("ext"), None);
        let e = ConfigOverrides::build(&w, &[spec("a*b*", 1)]).unwrap_err();
        assert_eq!(e.0, "override[0].key");
        let e = ConfigOverrides::build(&w, &[spec("a", 0)]).unwrap_err();
        assert_eq!(e.0, "override[0].limit");
    }
}
