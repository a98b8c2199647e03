//! The JSON of one decision, as `/v1/check`, `/v1/refund` and each result of an `all` call
//! answer it (API.md "Decisions"); `/v1/check/batch` writes the same bytes by hand.

use serde::Serialize;

use crate::limiter::Outcome;

/// The JSON of one decision.
#[derive(Serialize)]
pub(super) struct DecisionJson<'a> {
    allowed: bool,
    rule: &'a str,
    key: &'a str,
    limit: u64,
    remaining: u64,
    reset_after_ms: u64,
    retry_after_ms: u64,
    mode: &'static str,
    degraded: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    would_allow: Option<bool>,
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
            reset_after_ms: d.reset_after_ms,
            retry_after_ms: d.retry_after_ms,
            mode: d.mode.as_str(),
            degraded: d.degraded,
            would_allow: (d.mode == levee_core::RuleMode::Shadow).then_some(d.would_allow),
        }
    }
}
