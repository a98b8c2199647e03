//! `ANY /v1/authz/{rule}`: forward authentication for gateways (Envoy `ext_authz`, Traefik
//! `ForwardAuth`, Caddy `forward_auth`, nginx `auth_request`). The key comes from the header
//! or client address the rule's `key_from` names, the cost from `X-RateLimit-Cost`, the class
//! from `X-RateLimit-Class`. Allowed: `200`, empty body; denied: `429` (or `deny_status`) with
//! `{"error": "rate_limited", "retry_after_ms": N}`; both with the rate-limit headers.
//!
//! Two ways in, answering alike: [`authz`] through the router, and the direct path of
//! [`Api`](super::Api), which answers most requests of a single node without the router from
//! the pieces here ([`direct_authz_rule`], [`authz_input`], [`authz_response`],
//! [`authz_done`]).

use std::borrow::Cow;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use axum::body::{Body, Bytes};
use axum::extract::{ConnectInfo, Path, Query, State};
use axum::http::{self, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use http_body_util::Full;
use levee_core::rule::KeyFrom;
use serde::Deserialize;

use super::headers::authz_headers;
use crate::app::App;
use crate::limiter::{ApiError, CheckRef, Outcome};
use crate::metrics::Endpoint;

#[derive(Deserialize)]
pub(super) struct AuthzQuery {
    deny_status: Option<String>,
}

/// `/v1/authz/{rule}` through the router: requests with a query string (`deny_status`), a
/// rule name that needs percent-decoding, and every request of a node in a cluster (where the
/// decision may wait on the key's owner). The others take [`Api`](super::Api)'s direct path;
/// both answer alike.
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
    use axum::http::HeaderValue;

    use super::*;

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
