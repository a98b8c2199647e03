//! The JSON of one decision, as `/v1/check`, `/v1/refund` and each result of an `all` call
//! answer it (docs/api.md "Decisions"); `/v1/check/batch` writes the same bytes by hand.
//! `remaining` is the key's global estimate, `local_remaining` what the deciding node can
//! grant at once (absent when the key's owner decided for this node); see [`Outcome`].
//! A leaky bucket's answer carries `delay_ms`: how long the caller waits before it proceeds.

use serde::Serialize;
use utoipa::ToSchema;

use crate::limiter::Outcome;

/// The JSON of one decision (docs/api.md "Decisions").
#[derive(Serialize, ToSchema)]
#[schema(as = Decision)]
pub(super) struct DecisionJson<'a> {
    /// The decision (always `true` for a shadow rule).
    allowed: bool,
    /// The rule, as asked.
    rule: &'a str,
    /// The key, as asked.
    key: &'a str,
    /// The rule's global limit: tokens per window, or the bucket's capacity.
    limit: u64,
    /// The key's global estimate after this decision.
    remaining: u64,
    /// What the deciding node can still grant at once; absent when the key's owner decided.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(required = false, value_type = u64)]
    local_remaining: Option<u64>,
    /// Milliseconds until `remaining` is back to `limit` if nothing more is taken.
    reset_after_ms: u64,
    /// When denied: milliseconds after which the same request can succeed; 0 when allowed.
    retry_after_ms: u64,
    /// `enforce` or `shadow`.
    #[schema(schema_with = super::openapi::rule_mode)]
    mode: &'static str,
    /// Decided under a conservative cap because peers or regions were unreachable.
    degraded: bool,
    /// Shadow rules only: what the rule would have decided.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(required = false, value_type = bool)]
    would_allow: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    delay_ms: Option<u64>,
    /// `allow` or `deny` when the key is on a list (an override with `action`): decided
    /// without counting.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(required = false, value_type = String)]
    list: Option<&'static str>,
    /// How long the node waited for rights, in ms; present when the check gave
    /// `max_wait_ms`.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(required = false, value_type = u64)]
    waited_ms: Option<u64>,
}

/// The answer of `POST /v1/check`: one decision, or an `all` call's.
#[derive(Serialize, ToSchema)]
#[serde(untagged)]
#[schema(as = CheckAnswer)]
pub(super) enum CheckJson<'a> {
    /// A single check.
    One(DecisionJson<'a>),
    /// An atomic `all` call.
    All(AllJson<'a>),
}

/// The answer of `POST /v1/check/batch`: one decision per check, in order (`batch.rs` writes
/// the same bytes by hand).
#[derive(Serialize, ToSchema)]
#[schema(as = BatchResults)]
pub(super) struct BatchJson<'a> {
    /// The decisions.
    pub(super) results: Vec<DecisionJson<'a>>,
}

/// The answer of an atomic `all` call: the decision and the binding rule's figures at the
/// top, one result per entry in `results`.
#[derive(Serialize, ToSchema)]
#[schema(as = AllDecision)]
pub(super) struct AllJson<'a> {
    /// The decision, with the binding rule's figures.
    #[serde(flatten)]
    pub(super) top: DecisionJson<'a>,
    /// One decision per entry, in order.
    pub(super) results: Vec<DecisionJson<'a>>,
}

impl<'a> DecisionJson<'a> {
    /// The decision of `o` for `rule` and `key` (`would_allow` only for a shadow rule).
    pub(super) fn new(rule: &'a str, key: &'a str, o: &Outcome) -> DecisionJson<'a> {
        let d = &o.decision;
        DecisionJson {
            allowed: d.allowed,
            rule,
            key,
            limit: d.limit,
            remaining: d.remaining,
            local_remaining: o.local_remaining,
            reset_after_ms: d.reset_after_ms,
            retry_after_ms: d.retry_after_ms,
            mode: d.mode.as_str(),
            degraded: d.degraded,
            would_allow: (d.mode == levee_core::RuleMode::Shadow).then_some(d.would_allow),
            delay_ms: o.delay_ms(),
            list: o.list.map(crate::limiter::List::as_str),
            waited_ms: None,
        }
    }

    /// The same, saying how long the check waited for rights (`None`: it gave no
    /// `max_wait_ms`).
    pub(super) fn waited(self, waited_ms: Option<u64>) -> DecisionJson<'a> {
        DecisionJson { waited_ms, ..self }
    }
}
