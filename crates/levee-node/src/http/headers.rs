//! The rate-limit headers of a decision (API.md "Rate-limit response headers"): the IETF
//! draft's `RateLimit-Policy` and `RateLimit`, the legacy `X-RateLimit-*` trio, and
//! `Retry-After` on a denial. Written into an answer's headers ([`rate_limit_headers`]), or
//! as the whole header map of an `/v1/authz` answer ([`authz_headers`]), in the same order.

use std::sync::LazyLock;

use axum::http::{HeaderMap, HeaderName, HeaderValue, header};
use bytes::BytesMut;

use crate::limiter::Outcome;

const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
const X_RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
const X_RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
const X_RATELIMIT_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");

/// The rate-limit headers, in the order [`rate_limit_values`] gives their values.
const RATE_LIMIT_NAMES: [HeaderName; 6] = [
    RATELIMIT_POLICY,
    RATELIMIT,
    X_RATELIMIT_LIMIT,
    X_RATELIMIT_REMAINING,
    X_RATELIMIT_RESET,
    header::RETRY_AFTER,
];

/// The values of the rate-limit headers of an outcome, named by [`RATE_LIMIT_NAMES`]
/// (`Retry-After` only on a denial). They are written into one buffer and handed out as slices
/// of it (two allocations for all of them); a value that is not a valid header value (it
/// cannot be, for a configured rule name) is `None`.
fn rate_limit_values(rule: &str, o: &Outcome) -> [Option<HeaderValue>; 6] {
    let d = &o.decision;
    let reset_secs = d.reset_after_ms.div_ceil(1000);
    let mut n = itoa::Buffer::new();
    let mut buf = BytesMut::with_capacity(2 * rule.len() + 128);
    let take = |buf: &mut BytesMut| HeaderValue::from_maybe_shared(buf.split().freeze()).ok();
    let mut structured = |letter: &[u8], value: u64, unit: &[u8], after: u64| {
        buf.extend_from_slice(b"\"");
        buf.extend_from_slice(rule.as_bytes());
        buf.extend_from_slice(b"\";");
        buf.extend_from_slice(letter);
        buf.extend_from_slice(b"=");
        buf.extend_from_slice(n.format(value).as_bytes());
        buf.extend_from_slice(b";");
        buf.extend_from_slice(unit);
        buf.extend_from_slice(b"=");
        buf.extend_from_slice(n.format(after).as_bytes());
        take(&mut buf)
    };
    let policy = structured(b"q", d.limit, b"w", o.window_secs);
    let current = structured(b"r", d.remaining, b"t", reset_secs);
    let mut number = |value: u64| {
        buf.extend_from_slice(n.format(value).as_bytes());
        take(&mut buf)
    };
    [
        policy,
        current,
        number(d.limit),
        number(d.remaining),
        number(reset_secs),
        if d.allowed {
            None
        } else {
            number(d.retry_after_ms.div_ceil(1000).max(1))
        },
    ]
}

/// Adds the rate-limit headers of an outcome.
pub(super) fn rate_limit_headers(headers: &mut HeaderMap, rule: &str, o: &Outcome) {
    for (name, value) in RATE_LIMIT_NAMES.into_iter().zip(rate_limit_values(rule, o)) {
        if let Some(v) = value {
            headers.insert(name, v);
        }
    }
}

/// The headers of an `/v1/authz` answer with empty values, to be cloned and filled in order:
/// a clone copies two small arrays, where inserting each header would hash its name and probe
/// the map. Denials start with `Content-Type` and end with `Retry-After`.
fn authz_template(denied: bool) -> HeaderMap {
    let mut h = HeaderMap::with_capacity(8);
    if denied {
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
    }
    let names = if denied {
        &RATE_LIMIT_NAMES[..]
    } else {
        &RATE_LIMIT_NAMES[..5]
    };
    for name in names {
        h.insert(name.clone(), HeaderValue::from_static(""));
    }
    h
}

/// The headers of an `/v1/authz` answer: `Content-Type` on a denial, then the rate-limit ones.
pub(super) fn authz_headers(rule: &str, o: &Outcome) -> HeaderMap {
    static ALLOWED: LazyLock<HeaderMap> = LazyLock::new(|| authz_template(false));
    static DENIED: LazyLock<HeaderMap> = LazyLock::new(|| authz_template(true));
    let denied = !o.decision.allowed;
    let values = rate_limit_values(rule, o);
    let wanted = if denied { 6 } else { 5 };
    if values.iter().filter(|v| v.is_some()).count() == wanted {
        let mut headers = if denied { &*DENIED } else { &*ALLOWED }.clone();
        for (slot, value) in headers
            .values_mut()
            .skip(usize::from(denied))
            .zip(values.into_iter().flatten())
        {
            *slot = value;
        }
        return headers;
    }
    // A value that cannot be sent is left out, as for the other answers.
    let mut headers = HeaderMap::with_capacity(8);
    if denied {
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
    }
    for (name, value) in RATE_LIMIT_NAMES.into_iter().zip(values) {
        if let Some(v) = value {
            headers.insert(name, v);
        }
    }
    headers
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcome(allowed: bool) -> Outcome {
        Outcome {
            decision: levee_core::Decision {
                allowed,
                would_allow: allowed,
                limit: 100,
                remaining: if allowed { 42 } else { 0 },
                reset_after_ms: 1_500,
                retry_after_ms: if allowed { 0 } else { 2_300 },
                mode: levee_core::RuleMode::Enforce,
                degraded: false,
            },
            window_secs: 60,
        }
    }

    fn listed(h: &HeaderMap) -> Vec<(String, String)> {
        h.iter()
            .map(|(n, v)| (n.to_string(), v.to_str().unwrap_or("?").to_string()))
            .collect()
    }

    #[test]
    fn the_authz_headers_are_the_rate_limit_headers_in_order() {
        let allowed = listed(&authz_headers("api", &outcome(true)));
        let expected: Vec<(String, String)> = [
            ("ratelimit-policy", "\"api\";q=100;w=60"),
            ("ratelimit", "\"api\";r=42;t=2"),
            ("x-ratelimit-limit", "100"),
            ("x-ratelimit-remaining", "42"),
            ("x-ratelimit-reset", "2"),
        ]
        .iter()
        .map(|(n, v)| (n.to_string(), v.to_string()))
        .collect();
        assert_eq!(allowed, expected);
        let mut general = HeaderMap::new();
        rate_limit_headers(&mut general, "api", &outcome(true));
        assert_eq!(listed(&general), expected);

        let denied = listed(&authz_headers("api", &outcome(false)));
        let mut general = HeaderMap::new();
        general.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        rate_limit_headers(&mut general, "api", &outcome(false));
        assert_eq!(denied, listed(&general));
        assert_eq!(denied.len(), 7);
        assert_eq!(
            denied[0],
            ("content-type".into(), "application/json".into())
        );
        assert_eq!(denied[2], ("ratelimit".into(), "\"api\";r=0;t=2".into()));
        assert_eq!(denied[6], ("retry-after".into(), "3".into()));
    }
}
