//! What the limiter answers: a decision with the window its headers announce, an atomic
//! call's decisions, a key's usage.

use levee_core::{Decision, Usage};

/// A decision with what the answer needs to say about it (the rule and key are the
/// request's).
///
/// `decision.remaining` is the key's **global** estimate after the decision: the rule's
/// limit less what every node of every region used, as the deciding node knows it: what
/// `GET /v1/usage` answers as `remaining`, and what `remaining` and the `X-RateLimit-Remaining`
/// and `RateLimit` headers say. In a cluster one node may hold only a share of that (strict
/// mode splits the limit across nodes); what it can grant at once, without asking its peers for
/// rights, is `local_remaining` (docs/algorithms.md, "What `remaining` says").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outcome {
    /// The decision; its `remaining` is the global estimate.
    pub decision: Decision,
    /// The window the `RateLimit-Policy` header announces, in seconds.
    pub window_secs: u64,
    /// What the node that decided can still grant at once without asking its peers (its share
    /// in strict mode); `None` when the key's owner decided for this node (forwarded).
    pub local_remaining: Option<u64>,
    /// Whether the rule is a leaky bucket, whose answers carry `delay_ms` (the decision's,
    /// 0 when the request may proceed now).
    pub shaped: bool,
    /// The list the key is on (an override with `action`), which decided without its state.
    pub list: Option<List>,
}

/// An allow or deny list (an override with `"action"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum List {
    /// Always admitted, never counted.
    Allow,
    /// Always refused.
    Deny,
}

impl List {
    /// `allow` or `deny`, as answers say it.
    pub fn as_str(self) -> &'static str {
        match self {
            List::Allow => "allow",
            List::Deny => "deny",
        }
    }
}

impl Outcome {
    /// The `delay_ms` the answer carries: a leaky bucket's, `None` for other algorithms.
    #[inline]
    pub fn delay_ms(&self) -> Option<u64> {
        self.shaped.then_some(self.decision.delay_ms)
    }
}

/// The answer to an atomic call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllOutcome {
    /// Whether every rule allowed.
    pub allowed: bool,
    /// Index of the binding rule.
    pub binding: usize,
    /// One outcome per entry.
    pub results: Vec<Outcome>,
}

/// A key's usage with its names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageOutcome {
    /// The rule's name.
    pub rule: String,
    /// The key.
    pub key: String,
    /// The figures.
    pub usage: Usage,
    /// Region names, in the order of `usage.regions`.
    pub region_names: Vec<String>,
}
