//! `ANY /v1/authz/{rule}`: forward authentication for gateways (Envoy `ext_authz`, Traefik
//! `ForwardAuth`, Caddy `forward_auth`, nginx `auth_request`). The key comes from the header
//! or client address the rule's `key_from` names, the cost from `X-RateLimit-Cost`, the class
//! from `X-RateLimit-Class`. Allowed: `200`, empty body; denied: `429` (or `deny_status`) with
//! `{"error": "rate_limited", "retry_after_ms": N}`; both with the rate-limit headers.
//!
//! Two ways in, answering alike: [`authz`] through the router, and the direct path of `Api`
//! (the connection's service, in `mod.rs`), which answers most requests of a single node
//! without the router, from the pieces here: [`direct_authz_rule`], [`authz_input`],
//! [`authz_response`], [`authz_done`]. That path is what gateways call on every request they
//! pass. Its pieces, the answer's header map included, stay in this one file: a module is
//! compiled in one codegen unit, where they can be inlined into each other (moving the header
//! map to `headers.rs` put a call back on the path).

use std::borrow::Cow;
use std::net::SocketAddr;
use std::sync::{Arc, LazyLock};
use std::time::Instant;

use axum::body::{Body, Bytes};
use axum::extract::{ConnectInfo, Path, Query, State};
use axum::http::{self, HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use http_body_util::Full;
use levee_core::rule::KeyFrom;
use serde::Deserialize;

use super::headers::{RATE_LIMIT_NAMES, rate_limit_values};
use crate::app::App;
use crate::limiter::{ApiError, CheckRef, Outcome};
use crate::metrics::Endpoint;

#[derive(Deserialize)]
pub(super) struct AuthzQuery {
    deny_status: Option<String>,
}

/// `/v1/authz/{rule}` through the router: requests with a query string (`deny_status`), a
/// rule name that needs percent-decoding, and every request of a node in a cluster (where the
/// decision may wait on the key's owner). The others take the direct path of `Api`
/// (`mod.rs`); both answer alike.
pub(super) async fn authz(
    State(app): State<Arc<App>>,
    Path(rule): Path<String>,
    Query(q): Query<AuthzQuery>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
) -> Response {
    let started = Instant::now();
    let resp = match deny_status(q.deny_status.as_deref()) {
        Ok(status) => match authz_input(&app, &rule, peer, &headers) {
            Ok(input) => match app.check(input.check(&rule)).await {
                Ok(out) => authz_response(&rule, &out, status).map(Body::new),
                Err(e) => e.into_response(),
            },
            Err(e) => e.into_response(),
        },
        Err(e) => e.into_response(),
    };
    authz_done(&app, started, resp.status());
    resp
}

/// Records the metrics of an `/v1/authz` answer.
pub(super) fn authz_done(app: &App, started: Instant, status: StatusCode) {
    app.limiter
        .metrics()
        .check_duration
        .record(started.elapsed().as_secs_f64());
    crate::metrics::http(Endpoint::Authz, status.as_u16());
}

/// The status of a denial: `deny_status` if given (a 4xx code), else 429.
fn deny_status(q: Option<&str>) -> Result<StatusCode, ApiError> {
    match q {
        None => Ok(StatusCode::TOO_MANY_REQUESTS),
        Some(s) => s
            .parse::<u16>()
            .ok()
            .filter(|c| (400..=499).contains(c))
            .and_then(|c| StatusCode::from_u16(c).ok())
            .ok_or_else(|| {
                ApiError::invalid(format!("deny_status: {s:?} is not a 4xx status code"))
            }),
    }
}

/// The rule of an `/v1/authz/{rule}` request the direct path can answer: no query string, and
/// a rule name that needs no percent-decoding.
pub(super) fn direct_authz_rule(uri: &axum::http::Uri) -> Option<&str> {
    if uri.query().is_some() {
        return None;
    }
    let rule = uri.path().strip_prefix("/v1/authz/")?;
    (!rule.is_empty() && !rule.bytes().any(|b| b == b'/' || b == b'%')).then_some(rule)
}

/// What `/v1/authz/{rule}` reads from the request: the key (borrowed from a header when it
/// can be), the cost and the class.
pub(super) struct AuthzInput<'a> {
    key: Cow<'a, str>,
    cost: u64,
    class: Option<&'a str>,
}

impl AuthzInput<'_> {
    /// The check of `rule` this input asks for.
    pub(super) fn check<'b>(&'b self, rule: &'b str) -> CheckRef<'b> {
        CheckRef {
            rule,
            key: &self.key,
            cost: self.cost,
            class: self.class,
            idempotency_key: None,
            dry_run: false,
        }
    }
}

/// Reads the key, cost and class of an `/v1/authz/{rule}` request: `404 unknown_rule`,
/// `400 missing_key` when the rule's key header is absent or empty, `400 invalid_request`
/// for a cost that is not a non-negative integer.
pub(super) fn authz_input<'a>(
    app: &App,
    rule: &str,
    peer: SocketAddr,
    headers: &'a HeaderMap,
) -> Result<AuthzInput<'a>, ApiError> {
    let rules = app.limiter.rules();
    let entry = rules.by_name.get(rule).ok_or_else(|| ApiError {
        status: 404,
        code: "unknown_rule",
        message: format!("rule: no rule named {rule:?} is configured"),
    })?;
    let key_header = match &entry.rule.key_from {
        Some(KeyFrom::Header(name)) => Some(name.as_str()),
        Some(KeyFrom::Ip) | None => None,
    };
    // One pass over the request's few headers instead of a hashed lookup per name; the first
    // value of each name counts, as `HeaderMap::get` would return it.
    let (mut key, mut cost, mut class) = (None, None, None);
    for (name, value) in headers {
        let name = name.as_str();
        if key.is_none() && key_header == Some(name) {
            key = Some(value);
        }
        if cost.is_none() && name == "x-ratelimit-cost" {
            cost = Some(value);
        }
        if class.is_none() && name == "x-ratelimit-class" {
            class = Some(value);
        }
    }
    let key = match key_header {
        Some(name) => key
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
            .filter(|v| !v.is_empty())
            .map(Cow::Borrowed)
            .ok_or_else(|| ApiError {
                status: 400,
                code: "missing_key",
                message: format!("header {name}: missing or empty"),
            })?,
        None => client_ip(headers, peer),
    };
    let cost = match cost {
        None => 1,
        Some(v) => v
            .to_str()
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
            .ok_or_else(|| {
                ApiError::invalid("header X-RateLimit-Cost: must be a non-negative integer")
            })?,
    };
    let class = class.and_then(|v| v.to_str().ok());
    Ok(AuthzInput { key, cost, class })
}

/// The answer to an `/v1/authz` decision: 200 and an empty body, or the denial status with
/// `{"error": "rate_limited", "retry_after_ms": N}`; the rate-limit headers on both.
pub(super) fn authz_response(
    rule: &str,
    out: &Outcome,
    deny_status: StatusCode,
) -> http::Response<Full<Bytes>> {
    let mut resp = if out.decision.allowed {
        http::Response::new(Full::new(Bytes::new()))
    } else {
        let mut n = itoa::Buffer::new();
        let retry = n.format(out.decision.retry_after_ms);
        let mut body = Vec::with_capacity(48);
        body.extend_from_slice(br#"{"error":"rate_limited","retry_after_ms":"#);
        body.extend_from_slice(retry.as_bytes());
        body.push(b'}');
        let mut resp = http::Response::new(Full::new(Bytes::from(body)));
        *resp.status_mut() = deny_status;
        resp
    };
    *resp.headers_mut() = authz_headers(rule, out);
    resp
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
fn authz_headers(rule: &str, o: &Outcome) -> HeaderMap {
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

/// The client's address: the first `X-Forwarded-For` entry, else `X-Real-IP`, else the peer.
fn client_ip(headers: &HeaderMap, peer: SocketAddr) -> Cow<'_, str> {
    let forwarded = headers
        .get("x-forwarded-for")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(',').next())
        .map(str::trim)
        .filter(|v| !v.is_empty());
    let real = headers
        .get("x-real-ip")
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|v| !v.is_empty());
    match forwarded.or(real) {
        Some(ip) => Cow::Borrowed(ip),
        None => Cow::Owned(peer.ip().to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::headers::rate_limit_headers;

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

    #[test]
    fn the_client_ip_prefers_forwarded_headers() {
        let peer: SocketAddr = "10.0.0.9:4000".parse().unwrap();
        let mut h = HeaderMap::new();
        assert_eq!(client_ip(&h, peer), "10.0.0.9");
        h.insert("x-real-ip", HeaderValue::from_static("198.51.100.2"));
        assert_eq!(client_ip(&h, peer), "198.51.100.2");
        h.insert(
            "x-forwarded-for",
            HeaderValue::from_static("203.0.113.7, 10.0.0.1"),
        );
        assert_eq!(client_ip(&h, peer), "203.0.113.7");
    }
}
