//! What a decision request says, as the JSON bodies of `/v1/check`, `/v1/check/batch` and
//! `/v1/refund` carry it, and the checks of its fields that come before the limiter's (a
//! missing rule or key, a negative cost, `all` inside a batch), with the messages both batch
//! paths must give alike.

use serde::Deserialize;

use crate::limiter::{AllEntry, ApiError, CheckRef, Field};

/// The body of `POST /v1/check`: a single check, or an atomic `all` call. Also one check of
/// a batch, as the batch's reference decoding reads it.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct CheckBody {
    pub(super) rule: Option<String>,
    pub(super) key: Option<String>,
    pub(super) cost: Option<i64>,
    pub(super) class: Option<String>,
    pub(super) idempotency_key: Option<String>,
    #[serde(default)]
    pub(super) dry_run: bool,
    pub(super) all: Option<Vec<AllEntry>>,
}

impl CheckBody {
    /// Check `i` of a batch, validated and borrowing from `self`.
    pub(super) fn check_ref(&self, i: usize) -> Result<CheckRef<'_>, ApiError> {
        batch_check(
            i,
            self.rule.as_deref(),
            self.key.as_deref(),
            self.cost,
            self.class.as_deref(),
            self.idempotency_key.as_deref(),
            self.dry_run,
            self.all.is_some(),
        )
    }
}

/// The cost of a request: 1 when absent, refused when negative.
pub(super) fn cost_of(cost: Option<i64>, field: Field) -> Result<u64, ApiError> {
    match cost {
        None => Ok(1),
        Some(c) if c < 0 => Err(ApiError::invalid(format!(
            "{field}cost: must not be negative"
        ))),
        Some(c) => Ok(c as u64),
    }
}

/// Validates the fields of check `i` of a batch (both paths): the same messages, in the same
/// order.
#[allow(clippy::too_many_arguments)]
pub(super) fn batch_check<'a>(
    i: usize,
    rule: Option<&'a str>,
    key: Option<&'a str>,
    cost: Option<i64>,
    class: Option<&'a str>,
    idempotency_key: Option<&'a str>,
    dry_run: bool,
    all: bool,
) -> Result<CheckRef<'a>, ApiError> {
    if all {
        return Err(ApiError::invalid(format!(
            "checks[{i}].all: atomic calls go to /v1/check"
        )));
    }
    let cost = cost_of(cost, Field::Check(i))?;
    let rule = rule.ok_or_else(|| ApiError::invalid(format!("checks[{i}].rule: missing field")))?;
    let key = key.ok_or_else(|| ApiError::invalid(format!("checks[{i}].key: missing field")))?;
    Ok(CheckRef {
        rule,
        key,
        cost,
        class,
        idempotency_key,
        dry_run,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::body::decode;

    #[test]
    fn decode_names_the_wrong_field() {
        let e = decode::<CheckBody>(br#"{"rule": "a", "key": "k", "cost": "x"}"#).unwrap_err();
        assert!(e.message.starts_with("cost:"), "{}", e.message);
        let e = decode::<CheckBody>(br#"{"rule": "a", "bogus": 1}"#).unwrap_err();
        assert!(e.message.contains("bogus"), "{}", e.message);
        let e = decode::<CheckBody>(b"{not json").unwrap_err();
        assert!(e.message.starts_with("body:"), "{}", e.message);
    }
}
