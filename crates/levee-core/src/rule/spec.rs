//! A rule as a configuration writes it: [`RuleSpec`] and its consumer classes, unchecked.
//! [`RuleSpec::validate`] turns it into a [`crate::rule::Rule`].

use serde::{Deserialize, Serialize};

use crate::calendar::CalendarPeriod;
use crate::time::{HumanDuration, Millis};

use super::algorithm::AlgorithmName;

/// Whether a rule's denials are enforced.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RuleMode {
    /// Denials are returned to the caller.
    #[default]
    Enforce,
    /// Every request is allowed; the decision that would have been made is reported beside it.
    Shadow,
}

impl RuleMode {
    /// The mode's name as in the API.
    pub fn as_str(self) -> &'static str {
        match self {
            RuleMode::Enforce => "enforce",
            RuleMode::Shadow => "shadow",
        }
    }
}

/// How consumer classes share a rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ClassMethod {
    /// One shared bucket; class *i* may take tokens only while the bucket holds at least its
    /// `min_fill` fraction of the capacity (lower thresholds for higher priority).
    #[default]
    Threshold,
    /// One bucket per class with its own size; the sizes sum to at most the rule's limit.
    Separate,
}

/// One consumer class as written in a configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClassSpec {
    /// The class name a request gives in its `class` field.
    pub name: String,
    /// Threshold method: the fraction of capacity (0 ≤ min_fill < 1) the shared bucket must
    /// hold for this class to take tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_fill: Option<f64>,
    /// Separate method: this class's limit (windows and quotas) or burst (token bucket).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u64>,
    /// Separate method, token bucket: this class's refill per the rule's `per`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate: Option<u64>,
}

/// A rule as written in a configuration (`[[rule]]`). Every field but `name` and
/// `algorithm` depends on the algorithm; [`RuleSpec::validate`] says which are required.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuleSpec {
    /// Unique rule name; requests name it.
    pub name: String,
    /// The algorithm.
    pub algorithm: AlgorithmName,
    /// Token bucket: tokens added per `per`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate: Option<u64>,
    /// Token bucket: the refill period.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per: Option<HumanDuration>,
    /// Token bucket: the bucket's capacity (defaults to `rate`). Leaky bucket: how many
    /// requests may wait beyond the rate (default 0, as nginx's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub burst: Option<u64>,
    /// Leaky bucket: how many of the `burst` waiting requests proceed at once (default 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delay: Option<u64>,
    /// Windows and quotas: tokens per window or period.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u64>,
    /// Fixed and sliding windows: the window length.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window: Option<HumanDuration>,
    /// Quota: `day` or `month`, calendar, UTC.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub period: Option<CalendarPeriod>,
    /// `enforce` (the default) or `shadow`.
    #[serde(default)]
    pub mode: RuleMode,
    /// Forward authentication: where the key comes from (`header:<name>` or `ip`), or a list
    /// of parts joined with `|` (`["header:x-api-key", "method", "path"]`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_from: Option<KeyFromSpec>,
    /// How classes share the rule, when `class` entries are given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub class_method: Option<ClassMethod>,
    /// Consumer classes.
    #[serde(default, rename = "class", skip_serializing_if = "Vec::is_empty")]
    pub classes: Vec<ClassSpec>,
    /// Per-key overrides (`[[rule.override]]`): exact keys or prefixes ending with `*`.
    #[serde(default, rename = "override", skip_serializing_if = "Vec::is_empty")]
    pub overrides: Vec<crate::overrides::OverrideSpec>,
}

/// `key_from` as a configuration writes it: one part, or a list of parts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum KeyFromSpec {
    /// One part: `"ip"`, `"header:<name>"`, `"method"`, `"path"` or `"query:<name>"`.
    One(String),
    /// Parts whose values are joined with `|`, in order.
    Parts(Vec<String>),
}

impl From<&str> for KeyFromSpec {
    fn from(s: &str) -> KeyFromSpec {
        KeyFromSpec::One(s.to_owned())
    }
}

impl From<Vec<&str>> for KeyFromSpec {
    fn from(parts: Vec<&str>) -> KeyFromSpec {
        KeyFromSpec::Parts(parts.into_iter().map(str::to_owned).collect())
    }
}

impl RuleSpec {
    /// A rule of `algorithm` named `name` with no figures yet (enforced, no classes).
    pub fn new(name: &str, algorithm: AlgorithmName) -> RuleSpec {
        RuleSpec {
            name: name.to_owned(),
            algorithm,
            rate: None,
            per: None,
            burst: None,
            delay: None,
            limit: None,
            window: None,
            period: None,
            mode: RuleMode::Enforce,
            key_from: None,
            class_method: None,
            classes: Vec::new(),
            overrides: Vec::new(),
        }
    }

    /// A token bucket: `rate` tokens per `per_ms`, capacity `burst`.
    pub fn token_bucket(name: &str, rate: u64, per_ms: Millis, burst: u64) -> RuleSpec {
        RuleSpec {
            rate: Some(rate),
            per: Some(HumanDuration::from_millis(per_ms)),
            burst: Some(burst),
            ..RuleSpec::new(name, AlgorithmName::TokenBucket)
        }
    }

    /// A leaky bucket: `rate` per `per_ms`, `burst` waiting, the first `delay` at once.
    pub fn leaky_bucket(name: &str, rate: u64, per_ms: Millis, burst: u64, delay: u64) -> RuleSpec {
        RuleSpec {
            rate: Some(rate),
            per: Some(HumanDuration::from_millis(per_ms)),
            burst: Some(burst),
            delay: Some(delay),
            ..RuleSpec::new(name, AlgorithmName::LeakyBucket)
        }
    }

    /// A fixed window: `limit` per `window_ms`.
    pub fn fixed_window(name: &str, limit: u64, window_ms: Millis) -> RuleSpec {
        RuleSpec {
            limit: Some(limit),
            window: Some(HumanDuration::from_millis(window_ms)),
            ..RuleSpec::new(name, AlgorithmName::FixedWindow)
        }
    }

    /// A sliding window: `limit` per `window_ms`.
    pub fn sliding_window(name: &str, limit: u64, window_ms: Millis) -> RuleSpec {
        RuleSpec {
            limit: Some(limit),
            window: Some(HumanDuration::from_millis(window_ms)),
            ..RuleSpec::new(name, AlgorithmName::SlidingWindow)
        }
    }

    /// A sliding log: `limit` per sliding `window_ms`, exactly.
    pub fn sliding_log(name: &str, limit: u64, window_ms: Millis) -> RuleSpec {
        RuleSpec {
            limit: Some(limit),
            window: Some(HumanDuration::from_millis(window_ms)),
            ..RuleSpec::new(name, AlgorithmName::SlidingLog)
        }
    }

    /// A quota: `limit` per calendar `period`.
    pub fn quota(name: &str, limit: u64, period: CalendarPeriod) -> RuleSpec {
        RuleSpec {
            limit: Some(limit),
            period: Some(period),
            ..RuleSpec::new(name, AlgorithmName::Quota)
        }
    }
}
