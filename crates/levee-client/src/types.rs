//! What a call sends and answers: checks, decisions, usage.

use serde::{Deserialize, Serialize};

/// One check, as in `POST /v1/check`.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct Check {
    /// The rule's name.
    pub rule: String,
    /// The subject being limited.
    pub key: String,
    /// Tokens taken (default 1 when `None`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cost: Option<u64>,
    /// Consumer class, for rules with classes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub class: Option<String>,
    /// Decide without consuming.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub dry_run: bool,
    /// Set by the client on each call (one per logical call, the same on every retry); a
    /// value given here is kept.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
    /// How long the node may wait for rights, in ms, when it would deny only because it
    /// holds too little (API.md "Waiting for rights"; 0 to 10,000). The call's timeout grows
    /// by as much.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_wait_ms: Option<u64>,
}

impl Check {
    /// A check of `cost` 1.
    pub fn new(rule: impl Into<String>, key: impl Into<String>) -> Check {
        Check {
            rule: rule.into(),
            key: key.into(),
            ..Check::default()
        }
    }

    /// The same check with another cost.
    pub fn cost(mut self, cost: u64) -> Check {
        self.cost = Some(cost);
        self
    }

    /// The same check, willing to wait up to `ms` for rights (`max_wait_ms`).
    pub fn max_wait_ms(mut self, ms: u64) -> Check {
        self.max_wait_ms = Some(ms);
        self
    }
}

/// Who made a decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Source {
    /// A Levee node.
    #[default]
    Node,
    /// This client's fallback: no node answered in time.
    Fallback,
}

/// A decision (`/v1/check`, each entry of a batch, a refund's figures).
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct Decision {
    /// Allowed or not.
    pub allowed: bool,
    /// The rule (the binding rule for an `all` call).
    #[serde(default)]
    pub rule: String,
    /// The key.
    #[serde(default)]
    pub key: String,
    /// The rule's global limit.
    #[serde(default)]
    pub limit: u64,
    /// Tokens still available.
    #[serde(default)]
    pub remaining: u64,
    /// What the deciding node could grant without asking its peers (absent when forwarded).
    #[serde(default)]
    pub local_remaining: Option<u64>,
    /// ms until `remaining` is back to `limit`.
    #[serde(default)]
    pub reset_after_ms: u64,
    /// When denied: ms after which the same request can succeed.
    #[serde(default)]
    pub retry_after_ms: u64,
    /// `enforce` or `shadow`.
    #[serde(default)]
    pub mode: String,
    /// Decided under a conservative cap.
    #[serde(default)]
    pub degraded: bool,
    /// `allow` or `deny` when the key is on a list (an override with `action`).
    #[serde(default)]
    pub list: Option<String>,
    /// How long the node waited for rights, in ms, when the check gave `max_wait_ms`.
    #[serde(default)]
    pub waited_ms: Option<u64>,
    /// For an `all` call: one decision per entry, in order.
    #[serde(default)]
    pub results: Option<Vec<Decision>>,
    /// Who decided.
    #[serde(skip)]
    pub source: Source,
    /// The node's rate-limit headers (`RateLimit-Policy`, `RateLimit`, `X-RateLimit-*`,
    /// `Retry-After`), to pass on to the caller's own clients.
    #[serde(skip)]
    pub headers: Vec<(String, String)>,
}

impl Decision {
    pub(crate) fn fallback(
        rule: &str,
        key: &str,
        allowed: bool,
        remaining: u64,
        limit: u64,
    ) -> Decision {
        Decision {
            allowed,
            rule: rule.to_owned(),
            key: key.to_owned(),
            limit,
            remaining,
            local_remaining: None,
            reset_after_ms: 0,
            retry_after_ms: if allowed { 0 } else { 1000 },
            mode: "enforce".into(),
            degraded: true,
            list: None,
            waited_ms: None,
            results: None,
            source: Source::Fallback,
            headers: Vec::new(),
        }
    }
}

/// `GET /v1/usage/{rule}/{key}`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct Usage {
    /// The rule.
    pub rule: String,
    /// The key.
    pub key: String,
    /// The rule's limit.
    pub limit: u64,
    /// Used in the current window, all regions.
    pub used: u64,
    /// Still available.
    pub remaining: u64,
    /// ms until back to `limit`.
    pub reset_after_ms: u64,
    /// Used per region.
    #[serde(default)]
    pub regions: std::collections::BTreeMap<String, u64>,
    /// The key's owner in the answering node's region.
    #[serde(default)]
    pub owner: Option<String>,
}
