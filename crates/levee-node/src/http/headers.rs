//! The rate-limit headers of a decision (API.md "Rate-limit response headers"): the IETF
//! draft's `RateLimit-Policy` and `RateLimit`, the legacy `X-RateLimit-*` trio, and
//! `Retry-After` on a denial: their names and values, and [`rate_limit_headers`], which adds
//! them to an answer. `/v1/authz` builds its whole header map from the same names and values
//! (`authz.rs`), in the same order.

use axum::http::{HeaderMap, HeaderName, HeaderValue, header};
use bytes::BytesMut;

use crate::limiter::Outcome;

const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
const X_RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
const X_RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
const X_RATELIMIT_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");

/// The rate-limit headers, in the order [`rate_limit_values`] gives their values.
pub(super) const RATE_LIMIT_NAMES: [HeaderName; 6] = [
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
pub(super) fn rate_limit_values(rule: &str, o: &Outcome) -> [Option<HeaderValue>; 6] {
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
