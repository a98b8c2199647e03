//! Validation: a [`RuleSpec`] checked field by field into a [`Rule`], or a [`RuleError`]
//! naming the rule and the first wrong field. The rule comes out unbound: [`Rule::bind`]
//! splits its capacities over the replica set.

use crate::time::{HumanDuration, Millis};

use super::algorithm::{Algorithm, AlgorithmName, Shaping};
use super::spec::{ClassMethod, KeyFromSpec, RuleMode, RuleSpec};

/// The largest limit, burst or rate a rule may have. It keeps every intermediate product of
/// the decision path inside 128-bit integers and every token count exact.
pub const MAX_AMOUNT: u64 = 1_000_000_000_000;
/// The largest `burst` of a token bucket (levels are kept in nanotokens in an `i64`).
pub const MAX_BURST: u64 = 1_000_000_000;
/// The longest window or refill period: about 10 years.
pub const MAX_PERIOD_MS: u64 = 10 * 366 * 86_400_000;
/// The longest rule name, in bytes.
pub const MAX_NAME_LEN: usize = 128;
/// The largest `limit` of a `sliding_log`: it keeps one log entry per millisecond that
/// admitted something in the window, so its memory per key grows with the limit.
pub const MAX_LOG_LIMIT: u64 = 10_000;
/// The most consumer classes a rule may define.
pub const MAX_CLASSES: usize = 16;

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
    /// When `split` applies from, if it grew after a change of the node list
    /// ([`Rule::bind_no_higher`], [`Rule::growing_from`]); 0 if it did not. Windows that
    /// began before it were spent under smaller shares, which the escrow must not count on
    /// for them.
    pub grown_from: Millis,
    /// Removed nodes' rights of long windows that a region-mate counts until the grown
    /// shares apply ([`Bequest`], [`Rule::bind_no_higher`]).
    pub bequests: Vec<super::Bequest>,
    /// `[[rule.override]]`: keys with their own figures, or on the allow or deny list.
    pub overrides: crate::overrides::ConfigOverrides,
}

/// The most parts a composite `key_from` may list.
pub const MAX_KEY_PARTS: usize = 8;

/// Where `/v1/authz/{rule}` finds the key of a request.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum KeyFrom {
    /// A request header, lower-cased.
    Header(String),
    /// The client IP: the peer address, or what `X-Forwarded-For` / `X-Real-IP` say when the
    /// peer is a trusted proxy (`api.trusted_proxies`, decided by the node).
    Ip,
    /// Several parts (or one part that is neither a header nor the IP), their values joined
    /// with `|` in order.
    Parts(Vec<KeyPart>),
}

/// One part of a composite key.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum KeyPart {
    /// A request header, lower-cased.
    Header(String),
    /// The client IP, as [`KeyFrom::Ip`].
    Ip,
    /// The original request's method.
    Method,
    /// The original request's path, without the query string.
    Path,
    /// A parameter of the original request's query string.
    Query(String),
}

impl KeyPart {
    /// Parses one part as written in a configuration, or says what is wrong with it.
    fn parse(s: &str) -> Result<KeyPart, String> {
        let bad = || {
            format!(
                "{s:?} must be \"ip\", \"method\", \"path\", \"header:<name>\" or \"query:<name>\""
            )
        };
        match s {
            "ip" => Ok(KeyPart::Ip),
            "method" => Ok(KeyPart::Method),
            "path" => Ok(KeyPart::Path),
            _ => {
                if let Some(h) = s.strip_prefix("header:") {
                    if !h.is_empty() && h.bytes().all(is_header_name_byte) {
                        return Ok(KeyPart::Header(h.to_ascii_lowercase()));
                    }
                } else if let Some(q) = s.strip_prefix("query:")
                    && !q.is_empty()
                    && q.len() <= MAX_NAME_LEN
                    && !q
                        .bytes()
                        .any(|b| b.is_ascii_control() || b"&=#".contains(&b))
                {
                    return Ok(KeyPart::Query(q.to_owned()));
                }
                Err(bad())
            }
        }
    }
}

impl KeyFrom {
    /// Checks `key_from` as a configuration writes it; the error is `(field, problem)`.
    fn parse(spec: &KeyFromSpec) -> Result<KeyFrom, (String, String)> {
        match spec {
            KeyFromSpec::One(s) => match KeyPart::parse(s) {
                Ok(KeyPart::Header(h)) => Ok(KeyFrom::Header(h)),
                Ok(KeyPart::Ip) => Ok(KeyFrom::Ip),
                Ok(part) => Ok(KeyFrom::Parts(vec![part])),
                Err(problem) => Err(("key_from".into(), problem)),
            },
            KeyFromSpec::Parts(parts) => {
                if parts.is_empty() || parts.len() > MAX_KEY_PARTS {
                    return Err((
                        "key_from".into(),
                        format!("a list of 1 to {MAX_KEY_PARTS} parts"),
                    ));
                }
                let mut out = Vec::with_capacity(parts.len());
                for (i, s) in parts.iter().enumerate() {
                    let part =
                        KeyPart::parse(s).map_err(|problem| (format!("key_from[{i}]"), problem))?;
                    if out.contains(&part) {
                        return Err((format!("key_from[{i}]"), format!("{s:?} appears twice")));
                    }
                    out.push(part);
                }
                Ok(KeyFrom::Parts(out))
            }
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
                forbid("delay", self.delay.is_some())?;
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
                    shaping: None,
                }
            }
            AlgorithmName::LeakyBucket => {
                forbid("limit", self.limit.is_some())?;
                forbid("window", self.window.is_some())?;
                forbid("period", self.period.is_some())?;
                let rate = amount("rate", self.rate, MAX_AMOUNT)?;
                let per_ms = period("per", self.per)?;
                let queue = self.burst.unwrap_or(0);
                if queue >= MAX_BURST {
                    return Err(err("burst", format!("must be at most {}", MAX_BURST - 1)));
                }
                let delay = self.delay.unwrap_or(0);
                if delay > queue {
                    return Err(err(
                        "delay",
                        format!(
                            "must be at most burst ({queue}): {delay} requests cannot pass at once from a queue of {queue}"
                        ),
                    ));
                }
                Algorithm::TokenBucket {
                    rate,
                    per_ms,
                    burst: queue + 1,
                    shaping: Some(Shaping { queue, delay }),
                }
            }
            AlgorithmName::SlidingLog => {
                forbid("delay", self.delay.is_some())?;
                forbid("rate", self.rate.is_some())?;
                forbid("per", self.per.is_some())?;
                forbid("burst", self.burst.is_some())?;
                forbid("period", self.period.is_some())?;
                let limit = amount("limit", self.limit, MAX_LOG_LIMIT)?;
                let window_ms = period("window", self.window)?;
                Algorithm::SlidingLog { limit, window_ms }
            }
            AlgorithmName::FixedWindow | AlgorithmName::SlidingWindow => {
                forbid("delay", self.delay.is_some())?;
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
                forbid("delay", self.delay.is_some())?;
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
        let key_from = match &self.key_from {
            None => None,
            Some(spec) => {
                Some(KeyFrom::parse(spec).map_err(|(field, problem)| err(&field, problem))?)
            }
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
        let mut rule = Rule {
            name: self.name.clone(),
            algorithm,
            mode: self.mode,
            key_from,
            class_method,
            classes,
            spec: self.clone(),
            split: vec![],
            grown_from: 0,
            bequests: Vec::new(),
            overrides: Default::default(),
        };
        rule.overrides = crate::overrides::ConfigOverrides::build(&rule, &self.overrides)
            .map_err(|(field, problem)| err(&field, problem))?;
        Ok(rule)
    }

    fn algorithm_str(&self) -> &'static str {
        match self.algorithm {
            AlgorithmName::TokenBucket => "token_bucket",
            AlgorithmName::FixedWindow => "fixed_window",
            AlgorithmName::SlidingWindow => "sliding_window",
            AlgorithmName::Quota => "quota",
            AlgorithmName::SlidingLog => "sliding_log",
            AlgorithmName::LeakyBucket => "leaky_bucket",
        }
    }
}

fn is_header_name_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

impl Rule {
    /// The algorithm's name.
    pub fn algorithm_name(&self) -> AlgorithmName {
        self.algorithm.name()
    }
}
