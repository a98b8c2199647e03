//! Rules: what is limited, by which algorithm, with which figures.
//!
//! A [`RuleSpec`] is what a configuration file says; [`RuleSpec::validate`] turns it into a
//! [`Rule`] or a [`RuleError`] naming the rule and the field. A `Rule` is immutable and carries
//! every figure the decision path needs, already in milliseconds.

use std::borrow::Cow;

use serde::{Deserialize, Serialize};

use crate::calendar::CalendarPeriod;
use crate::replica::{NodeIdx, ReplicaSet};
use crate::time::{HumanDuration, Millis};

/// The largest limit, burst or rate a rule may have. It keeps every intermediate product of
/// the decision path inside 128-bit integers and every token count exact.
pub const MAX_AMOUNT: u64 = 1_000_000_000_000;
/// The largest `burst` of a token bucket (levels are kept in nanotokens in an `i64`).
pub const MAX_BURST: u64 = 1_000_000_000;
/// The longest window or refill period: about 10 years.
pub const MAX_PERIOD_MS: u64 = 10 * 366 * 86_400_000;
/// The longest rule name, in bytes.
pub const MAX_NAME_LEN: usize = 128;
/// The most consumer classes a rule may define.
pub const MAX_CLASSES: usize = 16;

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

/// The name of an algorithm, as written in a configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AlgorithmName {
    /// `rate` tokens per `per`, bucket of `burst`.
    TokenBucket,
    /// `limit` per `window`, windows aligned to the Unix epoch.
    FixedWindow,
    /// The weighted two-window counter: current + previous × overlap.
    SlidingWindow,
    /// `limit` per calendar day or month in UTC.
    Quota,
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
    /// Token bucket: the bucket's capacity (defaults to `rate`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub burst: Option<u64>,
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
    /// Forward authentication: where the key comes from (`header:<name>` or `ip`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_from: Option<String>,
    /// How classes share the rule, when `class` entries are given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub class_method: Option<ClassMethod>,
    /// Consumer classes.
    #[serde(default, rename = "class", skip_serializing_if = "Vec::is_empty")]
    pub classes: Vec<ClassSpec>,
}

/// A rule that failed validation: which rule, which field, what is wrong. Nothing was loaded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("rule {rule:?}: field `{field}`: {problem}")]
pub struct RuleError {
    /// The rule's name (empty if the name itself is wrong).
    pub rule: String,
    /// The field, as written in the configuration (`rate`, `class[1].min_fill` …).
    pub field: String,
    /// What is wrong with it.
    pub problem: String,
}

/// The figures of one algorithm, validated, in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(tag = "algorithm", rename_all = "snake_case")]
pub enum Algorithm {
    /// `rate` tokens per `per_ms`, capacity `burst`.
    TokenBucket {
        /// Tokens per `per_ms`.
        rate: u64,
        /// Refill period in ms.
        per_ms: Millis,
        /// Capacity.
        burst: u64,
    },
    /// `limit` per aligned window.
    FixedWindow {
        /// Tokens per window.
        limit: u64,
        /// Window length in ms.
        window_ms: Millis,
    },
    /// Weighted two-window counter.
    SlidingWindow {
        /// Tokens per window.
        limit: u64,
        /// Window length in ms.
        window_ms: Millis,
    },
    /// `limit` per calendar period.
    Quota {
        /// Tokens per period.
        limit: u64,
        /// Day or month, UTC.
        period: CalendarPeriod,
    },
}

impl Algorithm {
    /// The global limit: tokens per window, or the bucket's capacity.
    #[inline]
    pub fn capacity(&self) -> u64 {
        match *self {
            Algorithm::TokenBucket { burst, .. } => burst,
            Algorithm::FixedWindow { limit, .. }
            | Algorithm::SlidingWindow { limit, .. }
            | Algorithm::Quota { limit, .. } => limit,
        }
    }

    /// The epoch (window, period or refill period number) that contains `now`. Demand and
    /// usage are counted per epoch; window algorithms also hold rights per epoch.
    #[inline]
    pub fn epoch(&self, now: Millis) -> u64 {
        match *self {
            Algorithm::TokenBucket { per_ms, .. } => now / per_ms,
            Algorithm::FixedWindow { window_ms, .. }
            | Algorithm::SlidingWindow { window_ms, .. } => now / window_ms,
            Algorithm::Quota { period, .. } => period.index(now),
        }
    }

    /// Start of an epoch in ms.
    #[inline]
    pub fn epoch_start(&self, epoch: u64) -> Millis {
        match *self {
            Algorithm::TokenBucket { per_ms: w, .. }
            | Algorithm::FixedWindow { window_ms: w, .. }
            | Algorithm::SlidingWindow { window_ms: w, .. } => epoch.saturating_mul(w),
            Algorithm::Quota { period, .. } => period.start(epoch),
        }
    }

    /// End (exclusive) of an epoch in ms.
    #[inline]
    pub fn epoch_end(&self, epoch: u64) -> Millis {
        match *self {
            Algorithm::Quota { period, .. } => period.end(epoch),
            _ => self.epoch_start(epoch.saturating_add(1)),
        }
    }

    /// The length of the epoch containing `now`.
    pub fn epoch_len(&self, now: Millis) -> Millis {
        let e = self.epoch(now);
        self.epoch_end(e) - self.epoch_start(e)
    }

    /// The window the `RateLimit-Policy` header announces, in seconds (rounded up): the
    /// window, the period, or for a token bucket the time to refill an empty bucket.
    pub fn policy_window_secs(&self, now: Millis) -> u64 {
        let ms = match *self {
            Algorithm::TokenBucket {
                rate,
                per_ms,
                burst,
            } => (u128::from(burst) * u128::from(per_ms)).div_ceil(u128::from(rate)) as u64,
            _ => self.epoch_len(now),
        };
        ms.div_ceil(1000).max(1)
    }

    /// How many epochs of counters a key keeps: the current one, the one before (sliding
    /// windows read it; late deltas still merge into it) and one more for clock skew.
    pub fn retained_epochs(&self) -> u64 {
        3
    }

    /// Whether rights are held per epoch (fixed windows and quotas) rather than continuously
    /// (token buckets and sliding windows, whose usage carries from one epoch to the next).
    #[inline]
    pub fn rights_per_epoch(&self) -> bool {
        matches!(
            self,
            Algorithm::FixedWindow { .. } | Algorithm::Quota { .. }
        )
    }

    fn name(&self) -> AlgorithmName {
        match self {
            Algorithm::TokenBucket { .. } => AlgorithmName::TokenBucket,
            Algorithm::FixedWindow { .. } => AlgorithmName::FixedWindow,
            Algorithm::SlidingWindow { .. } => AlgorithmName::SlidingWindow,
            Algorithm::Quota { .. } => AlgorithmName::Quota,
        }
    }

    /// The same algorithm with another capacity (and, for a token bucket, rate): a class's
    /// own bucket under the separate-buckets method.
    fn resized(&self, limit: u64, rate: Option<u64>) -> Algorithm {
        match *self {
            Algorithm::TokenBucket { per_ms, .. } => Algorithm::TokenBucket {
                rate: rate.unwrap_or(limit),
                per_ms,
                burst: limit,
            },
            Algorithm::FixedWindow { window_ms, .. } => Algorithm::FixedWindow { limit, window_ms },
            Algorithm::SlidingWindow { window_ms, .. } => {
                Algorithm::SlidingWindow { limit, window_ms }
            }
            Algorithm::Quota { period, .. } => Algorithm::Quota { limit, period },
        }
    }
}

/// One consumer class of a validated rule.
#[derive(Debug, Clone, PartialEq)]
pub struct Class {
    /// The class name.
    pub name: String,
    /// Threshold method: fill fraction the bucket must hold, in millionths (0 for none).
    pub min_fill_ppm: u32,
    /// Separate method: this class's own bucket.
    pub own: Option<Algorithm>,
    /// Separate method: the own bucket's capacity split among the nodes (see [`Rule::bind`]).
    pub split: Vec<u64>,
}

/// A validated rule.
#[derive(Debug, Clone, PartialEq)]
pub struct Rule {
    /// The rule's name.
    pub name: String,
    /// The algorithm and its figures.
    pub algorithm: Algorithm,
    /// Enforce or shadow.
    pub mode: RuleMode,
    /// Where forward authentication takes the key from.
    pub key_from: Option<KeyFrom>,
    /// How classes share the rule.
    pub class_method: ClassMethod,
    /// The classes, in configuration order.
    pub classes: Vec<Class>,
    /// The specification it was built from (for `/v1/rules` and reload diffs).
    pub spec: RuleSpec,
    /// The capacity split among the nodes of the replica set (see [`Rule::bind`]).
    pub split: Vec<u64>,
}

/// Where `/v1/authz/{rule}` finds the key of a request.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum KeyFrom {
    /// A request header, lower-cased.
    Header(String),
    /// The client IP (`X-Forwarded-For`, `X-Real-IP`, then the peer address).
    Ip,
}

/// Why a request cannot be decided against a rule. Nothing was consumed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CheckError {
    /// The cost is more than the rule (or the class) could ever grant.
    #[error("{cost} is more than rule {rule:?} can ever grant (at most {max})")]
    CostTooHigh {
        /// The rule.
        rule: String,
        /// The requested cost.
        cost: u64,
        /// The most a single request may cost.
        max: u64,
    },
    /// The class is not defined by the rule.
    #[error("rule {rule:?} has no class {class:?}")]
    UnknownClass {
        /// The rule.
        rule: String,
        /// The class asked for.
        class: String,
    },
    /// The rule defines classes and the request named none.
    #[error("rule {rule:?} defines classes; the request must name one of them")]
    MissingClass {
        /// The rule.
        rule: String,
    },
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
            limit: None,
            window: None,
            period: None,
            mode: RuleMode::Enforce,
            key_from: None,
            class_method: None,
            classes: Vec::new(),
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

    /// A quota: `limit` per calendar `period`.
    pub fn quota(name: &str, limit: u64, period: CalendarPeriod) -> RuleSpec {
        RuleSpec {
            limit: Some(limit),
            period: Some(period),
            ..RuleSpec::new(name, AlgorithmName::Quota)
        }
    }
}

impl CheckError {
    /// The request field the error is about (`cost` or `class`).
    pub fn field(&self) -> &'static str {
        match self {
            CheckError::CostTooHigh { .. } => "cost",
            CheckError::UnknownClass { .. } | CheckError::MissingClass { .. } => "class",
        }
    }
}

impl RuleSpec {
    /// Checks every field and builds the rule. The error names the first wrong field.
    pub fn validate(&self) -> Result<Rule, RuleError> {
        let err = |field: &str, problem: String| RuleError {
            rule: self.name.clone(),
            field: field.to_owned(),
            problem,
        };
        if self.name.is_empty() || self.name.len() > MAX_NAME_LEN {
            return Err(err("name", format!("must be 1 to {MAX_NAME_LEN} bytes")));
        }
        if !self
            .name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.:".contains(&b))
        {
            return Err(err(
                "name",
                "may hold only ASCII letters, digits and - _ . :".into(),
            ));
        }
        let amount = |field: &str, v: Option<u64>, max: u64| -> Result<u64, RuleError> {
            match v {
                None => Err(err(
                    field,
                    format!("is required for algorithm {:?}", self.algorithm_str()),
                )),
                Some(0) => Err(err(field, "must be at least 1".into())),
                Some(v) if v > max => Err(err(field, format!("must be at most {max}"))),
                Some(v) => Ok(v),
            }
        };
        let period = |field: &str, v: Option<HumanDuration>| -> Result<Millis, RuleError> {
            match v {
                None => Err(err(
                    field,
                    format!("is required for algorithm {:?}", self.algorithm_str()),
                )),
                Some(d) if d.as_millis() == 0 => Err(err(field, "must be at least 1ms".into())),
                Some(d) if d.as_millis() > MAX_PERIOD_MS => {
                    Err(err(field, "must be at most 3660d".into()))
                }
                Some(d) => Ok(d.as_millis()),
            }
        };
        let forbid = |field: &str, present: bool| -> Result<(), RuleError> {
            if present {
                Err(err(
                    field,
                    format!("does not apply to algorithm {:?}", self.algorithm_str()),
                ))
            } else {
                Ok(())
            }
        };
        let algorithm = match self.algorithm {
            AlgorithmName::TokenBucket => {
                forbid("limit", self.limit.is_some())?;
                forbid("window", self.window.is_some())?;
                forbid("period", self.period.is_some())?;
                let rate = amount("rate", self.rate, MAX_AMOUNT)?;
                let per_ms = period("per", self.per)?;
                let burst = amount("burst", self.burst.or(self.rate), MAX_BURST)?;
                Algorithm::TokenBucket {
                    rate,
                    per_ms,
                    burst,
                }
            }
            AlgorithmName::FixedWindow | AlgorithmName::SlidingWindow => {
                forbid("rate", self.rate.is_some())?;
                forbid("per", self.per.is_some())?;
                forbid("burst", self.burst.is_some())?;
                forbid("period", self.period.is_some())?;
                let limit = amount("limit", self.limit, MAX_AMOUNT)?;
                let window_ms = period("window", self.window)?;
                if self.algorithm == AlgorithmName::FixedWindow {
                    Algorithm::FixedWindow { limit, window_ms }
                } else {
                    Algorithm::SlidingWindow { limit, window_ms }
                }
            }
            AlgorithmName::Quota => {
                forbid("rate", self.rate.is_some())?;
                forbid("per", self.per.is_some())?;
                forbid("burst", self.burst.is_some())?;
                forbid("window", self.window.is_some())?;
                let limit = amount("limit", self.limit, MAX_AMOUNT)?;
                let Some(period) = self.period else {
                    return Err(err(
                        "period",
                        "is required for algorithm \"quota\" (day or month)".into(),
                    ));
                };
                Algorithm::Quota { limit, period }
            }
        };
        let key_from = match self.key_from.as_deref() {
            None => None,
            Some("ip") => Some(KeyFrom::Ip),
            Some(s) => match s.strip_prefix("header:") {
                Some(h) if !h.is_empty() && h.bytes().all(is_header_name_byte) => {
                    Some(KeyFrom::Header(h.to_ascii_lowercase()))
                }
                _ => {
                    return Err(err(
                        "key_from",
                        format!("{s:?} must be \"ip\" or \"header:<name>\""),
                    ));
                }
            },
        };
        let class_method = self.class_method.unwrap_or_default();
        if self.classes.len() > MAX_CLASSES {
            return Err(err("class", format!("at most {MAX_CLASSES} classes")));
        }
        if self.class_method.is_some() && self.classes.is_empty() {
            return Err(err(
                "class_method",
                "needs at least one [[rule.class]]".into(),
            ));
        }
        let mut classes = Vec::with_capacity(self.classes.len());
        let (mut sum_limit, mut sum_rate) = (0u64, 0u64);
        for (i, c) in self.classes.iter().enumerate() {
            let f = |name: &str| format!("class[{i}].{name}");
            if c.name.is_empty() || c.name.len() > MAX_NAME_LEN {
                return Err(err(
                    &f("name"),
                    format!("must be 1 to {MAX_NAME_LEN} bytes"),
                ));
            }
            if self.classes[..i].iter().any(|o| o.name == c.name) {
                return Err(err(&f("name"), format!("class {:?} appears twice", c.name)));
            }
            match class_method {
                ClassMethod::Threshold => {
                    if c.limit.is_some() || c.rate.is_some() {
                        let which = if c.limit.is_some() { "limit" } else { "rate" };
                        return Err(err(
                            &f(which),
                            "belongs to class_method = \"separate\"".into(),
                        ));
                    }
                    let fill = c.min_fill.unwrap_or(0.0);
                    if !(0.0..1.0).contains(&fill) {
                        return Err(err(&f("min_fill"), "must be at least 0 and below 1".into()));
                    }
                    let min_fill_ppm = (fill * 1e6).round() as u32;
                    classes.push(Class {
                        name: c.name.clone(),
                        min_fill_ppm,
                        own: None,
                        split: vec![],
                    });
                }
                ClassMethod::Separate => {
                    if c.min_fill.is_some() {
                        return Err(err(
                            &f("min_fill"),
                            "belongs to class_method = \"threshold\"".into(),
                        ));
                    }
                    let limit = match c.limit {
                        None | Some(0) => {
                            return Err(err(&f("limit"), "is required and at least 1".into()));
                        }
                        Some(l) => l,
                    };
                    let rate = match (&algorithm, c.rate) {
                        (Algorithm::TokenBucket { .. }, None | Some(0)) => {
                            return Err(err(
                                &f("rate"),
                                "is required and at least 1 for a token bucket".into(),
                            ));
                        }
                        (Algorithm::TokenBucket { .. }, Some(r)) => Some(r),
                        (_, Some(_)) => {
                            return Err(err(&f("rate"), "applies only to a token bucket".into()));
                        }
                        (_, None) => None,
                    };
                    sum_limit = sum_limit.saturating_add(limit);
                    sum_rate = sum_rate.saturating_add(rate.unwrap_or(0));
                    classes.push(Class {
                        name: c.name.clone(),
                        min_fill_ppm: 0,
                        own: Some(algorithm.resized(limit, rate)),
                        split: vec![],
                    });
                }
            }
        }
        if class_method == ClassMethod::Separate {
            let cap = algorithm.capacity();
            if sum_limit > cap {
                return Err(err(
                    "class",
                    format!(
                        "the classes' limits sum to {sum_limit}, above the rule's common limit {cap}"
                    ),
                ));
            }
            if let Algorithm::TokenBucket { rate, .. } = algorithm
                && sum_rate > rate
            {
                return Err(err(
                    "class",
                    format!("the classes' rates sum to {sum_rate}, above the rule's rate {rate}"),
                ));
            }
        }
        Ok(Rule {
            name: self.name.clone(),
            algorithm,
            mode: self.mode,
            key_from,
            class_method,
            classes,
            spec: self.clone(),
            split: vec![],
        })
    }

    fn algorithm_str(&self) -> &'static str {
        match self.algorithm {
            AlgorithmName::TokenBucket => "token_bucket",
            AlgorithmName::FixedWindow => "fixed_window",
            AlgorithmName::SlidingWindow => "sliding_window",
            AlgorithmName::Quota => "quota",
        }
    }
}

fn is_header_name_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// Which bucket of a rule a request draws from, resolved from its class.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Target<'r> {
    /// The algorithm and figures of the bucket.
    pub algorithm: &'r Algorithm,
    /// Separate method: the class's index, which is part of the storage key.
    pub bucket: Option<u8>,
    /// Threshold method: the fill fraction (millionths) the bucket must hold.
    pub min_fill_ppm: u32,
    /// The capacity split among the nodes, when the rule was bound to the replica set.
    pub split: Option<&'r [u64]>,
}

impl<'r> Target<'r> {
    /// The target's capacity split among the nodes of `replicas`: the split bound by
    /// [`Rule::bind`] when it was bound to a set of this size, else computed.
    pub(crate) fn static_split(&self, replicas: &ReplicaSet) -> Cow<'r, [u64]> {
        match self.split {
            Some(s) if s.len() == replicas.len() => Cow::Borrowed(s),
            _ => Cow::Owned(replicas.split(self.algorithm.capacity())),
        }
    }

    /// `node`'s static share of the target's capacity (0 for a node the bound split does not
    /// name).
    #[inline]
    pub(crate) fn static_share(&self, node: NodeIdx, replicas: &ReplicaSet) -> u64 {
        match self.split {
            Some(split) => split.get(usize::from(node.0)).copied().unwrap_or(0),
            None => replicas.split(self.algorithm.capacity())[usize::from(node.0)],
        }
    }
}

impl Rule {
    /// Resolves the bucket a request of `class` draws from and checks that `cost` can ever be
    /// granted by it. A cost above the capacity is the caller's error, not a silent deny.
    pub fn target(&self, class: Option<&str>, cost: u64) -> Result<Target<'_>, CheckError> {
        let target = match (class, self.classes.is_empty()) {
            (None, true) => Target {
                algorithm: &self.algorithm,
                bucket: None,
                min_fill_ppm: 0,
                split: self.bound(),
            },
            (None, false) => {
                return Err(CheckError::MissingClass {
                    rule: self.name.clone(),
                });
            }
            (Some(name), _) => {
                let Some((i, c)) = self
                    .classes
                    .iter()
                    .enumerate()
                    .find(|(_, c)| c.name == name)
                else {
                    return Err(CheckError::UnknownClass {
                        rule: self.name.clone(),
                        class: name.to_owned(),
                    });
                };
                match &c.own {
                    Some(own) => Target {
                        algorithm: own,
                        bucket: Some(i as u8),
                        min_fill_ppm: 0,
                        split: (!c.split.is_empty()).then_some(c.split.as_slice()),
                    },
                    None => Target {
                        algorithm: &self.algorithm,
                        bucket: None,
                        min_fill_ppm: c.min_fill_ppm,
                        split: self.bound(),
                    },
                }
            }
        };
        let max = target.algorithm.capacity();
        if cost > max {
            return Err(CheckError::CostTooHigh {
                rule: self.name.clone(),
                cost,
                max,
            });
        }
        Ok(target)
    }

    /// Precomputes the split of every capacity among the nodes of `replicas`, so the
    /// decision path does not recompute it. Call again whenever the replica set changes.
    pub fn bind(&mut self, replicas: &ReplicaSet) {
        self.split = replicas.split(self.algorithm.capacity());
        for c in &mut self.classes {
            c.split = c
                .own
                .map(|own| replicas.split(own.capacity()))
                .unwrap_or_default();
        }
    }

    fn bound(&self) -> Option<&[u64]> {
        (!self.split.is_empty()).then_some(self.split.as_slice())
    }

    /// The algorithm's name.
    pub fn algorithm_name(&self) -> AlgorithmName {
        self.algorithm.name()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tb() -> RuleSpec {
        RuleSpec {
            name: "api".into(),
            algorithm: AlgorithmName::TokenBucket,
            rate: Some(100),
            per: Some(HumanDuration::from_millis(1000)),
            burst: Some(200),
            limit: None,
            window: None,
            period: None,
            mode: RuleMode::Enforce,
            key_from: None,
            class_method: None,
            classes: vec![],
        }
    }

    fn window(limit: Option<u64>) -> RuleSpec {
        RuleSpec {
            algorithm: AlgorithmName::FixedWindow,
            rate: None,
            per: None,
            burst: None,
            limit,
            window: Some(HumanDuration::from_millis(60_000)),
            ..tb()
        }
    }

    fn field_of(spec: &RuleSpec) -> String {
        spec.validate().unwrap_err().field
    }

    #[test]
    fn a_valid_token_bucket_keeps_its_figures() {
        let rule = tb().validate().unwrap();
        assert_eq!(
            rule.algorithm,
            Algorithm::TokenBucket {
                rate: 100,
                per_ms: 1000,
                burst: 200
            }
        );
        assert_eq!(rule.algorithm.capacity(), 200);
        assert_eq!(rule.algorithm.policy_window_secs(0), 2);
    }

    #[test]
    fn burst_defaults_to_rate() {
        let rule = RuleSpec {
            burst: None,
            ..tb()
        }
        .validate()
        .unwrap();
        assert_eq!(rule.algorithm.capacity(), 100);
    }

    #[test]
    fn each_wrong_field_is_named() {
        assert_eq!(field_of(&RuleSpec { rate: None, ..tb() }), "rate");
        assert_eq!(
            field_of(&RuleSpec {
                rate: Some(0),
                ..tb()
            }),
            "rate"
        );
        assert_eq!(field_of(&RuleSpec { per: None, ..tb() }), "per");
        assert_eq!(
            field_of(&RuleSpec {
                per: Some(HumanDuration::from_millis(0)),
                ..tb()
            }),
            "per"
        );
        assert_eq!(
            field_of(&RuleSpec {
                burst: Some(MAX_BURST + 1),
                ..tb()
            }),
            "burst"
        );
        assert_eq!(
            field_of(&RuleSpec {
                limit: Some(5),
                ..tb()
            }),
            "limit"
        );
        assert_eq!(field_of(&window(None)), "limit");
        assert_eq!(
            field_of(&RuleSpec {
                window: None,
                ..window(Some(5))
            }),
            "window"
        );
        assert_eq!(
            field_of(&RuleSpec {
                name: String::new(),
                ..tb()
            }),
            "name"
        );
        assert_eq!(
            field_of(&RuleSpec {
                name: "a b".into(),
                ..tb()
            }),
            "name"
        );
        assert_eq!(
            field_of(&RuleSpec {
                key_from: Some("cookie:x".into()),
                ..tb()
            }),
            "key_from"
        );
        let quota = RuleSpec {
            algorithm: AlgorithmName::Quota,
            window: None,
            ..window(Some(5))
        };
        assert_eq!(field_of(&quota), "period");
    }

    #[test]
    fn key_from_header_is_lower_cased() {
        let rule = RuleSpec {
            key_from: Some("header:X-Api-Key".into()),
            ..tb()
        }
        .validate()
        .unwrap();
        assert_eq!(rule.key_from, Some(KeyFrom::Header("x-api-key".into())));
    }

    fn class(
        name: &str,
        min_fill: Option<f64>,
        limit: Option<u64>,
        rate: Option<u64>,
    ) -> ClassSpec {
        ClassSpec {
            name: name.into(),
            min_fill,
            limit,
            rate,
        }
    }

    #[test]
    fn threshold_classes_validate_their_fill() {
        let ok = RuleSpec {
            classes: vec![
                class("paid", None, None, None),
                class("free", Some(0.6), None, None),
            ],
            ..tb()
        };
        let rule = ok.validate().unwrap();
        assert_eq!(rule.classes[1].min_fill_ppm, 600_000);
        let bad = RuleSpec {
            classes: vec![class("free", Some(1.0), None, None)],
            ..tb()
        };
        assert_eq!(field_of(&bad), "class[0].min_fill");
        let dup = RuleSpec {
            classes: vec![class("a", None, None, None), class("a", None, None, None)],
            ..tb()
        };
        assert_eq!(field_of(&dup), "class[1].name");
    }

    #[test]
    fn separate_classes_must_fit_under_the_common_limit() {
        let fits = RuleSpec {
            class_method: Some(ClassMethod::Separate),
            classes: vec![
                class("a", None, Some(30), None),
                class("b", None, Some(70), None),
            ],
            ..window(Some(100))
        };
        let rule = fits.validate().unwrap();
        assert_eq!(rule.classes[1].own.unwrap().capacity(), 70);
        let exceeds = RuleSpec {
            classes: vec![
                class("a", None, Some(31), None),
                class("b", None, Some(70), None),
            ],
            ..fits.clone()
        };
        assert_eq!(field_of(&exceeds), "class");
        let tb_rates = RuleSpec {
            class_method: Some(ClassMethod::Separate),
            classes: vec![
                class("a", None, Some(100), Some(60)),
                class("b", None, Some(100), Some(60)),
            ],
            ..tb()
        };
        let e = tb_rates.validate().unwrap_err();
        assert!(e.problem.contains("rates sum to 120"), "{e}");
    }

    #[test]
    fn cost_above_capacity_is_the_callers_error() {
        let rule = tb().validate().unwrap();
        assert!(rule.target(None, 200).is_ok());
        assert_eq!(
            rule.target(None, 201),
            Err(CheckError::CostTooHigh {
                rule: "api".into(),
                cost: 201,
                max: 200
            })
        );
        let classes = RuleSpec {
            class_method: Some(ClassMethod::Separate),
            classes: vec![class("a", None, Some(50), Some(10))],
            ..tb()
        }
        .validate()
        .unwrap();
        assert!(matches!(
            classes.target(Some("a"), 51),
            Err(CheckError::CostTooHigh { max: 50, .. })
        ));
        assert!(matches!(
            classes.target(Some("z"), 1),
            Err(CheckError::UnknownClass { .. })
        ));
        assert!(matches!(
            classes.target(None, 1),
            Err(CheckError::MissingClass { .. })
        ));
    }
}
