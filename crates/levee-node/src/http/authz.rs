//! `ANY /v1/authz/{rule}`: forward authentication for gateways (Envoy `ext_authz`, Traefik
//! `ForwardAuth`, Caddy `forward_auth`, nginx `auth_request`). The key comes from the header
//! or client address the rule's `key_from` names, the cost from `X-RateLimit-Cost`, the class
//! from `X-RateLimit-Class`, how long the caller can wait for rights from
//! `X-RateLimit-Max-Wait` (ms, `crate::wait`; a single node never waits). Allowed: `200`, empty body; denied: `429` (or `deny_status`) with
//! `{"error": "rate_limited", "retry_after_ms": N}`; both with the rate-limit headers.
//!
//! Two ways in, answering alike: [`authz`] through the router, and the direct path of `Api`
//! (the connection's service, in `mod.rs`), which answers most requests of a single node
//! without the router, from the pieces here: [`direct_authz_rule`], [`authz_input`],
//! [`authz_response`], [`authz_done`]. That path is what gateways call on every request they
//! pass. Its pieces, the answer's header map included, stay in this one file: a module is
//! compiled in one codegen unit, where they can be inlined into each other (moving the header
//! map to `headers.rs` put a call back on the path). Keys taken from the client's address or
//! from several parts of the request (`key_from = "ip"` or a list) are found in `key_from.rs`.

use std::borrow::Cow;
use std::net::SocketAddr;
use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::{ConnectInfo, Path, Query, State};
use axum::http::{self, HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use http_body_util::Full;
use levee_core::rule::KeyFrom;
use serde::Deserialize;

use super::headers::{RATE_LIMIT_NAMES, rate_limit_values};
use super::key_from::{client_ip, composite_key};
use crate::app::App;
use crate::limiter::{ApiError, CheckRef, Outcome};
use crate::metrics::Endpoint;

/// The query of `/v1/authz/{rule}`.
#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub(super) struct AuthzQuery {
    /// The status of a denial instead of 429: a 4xx code.
    #[param(value_type = Option<u16>, minimum = 400, maximum = 499, nullable = false)]
    deny_status: Option<String>,
}

/// The body of an `/v1/authz` denial, as [`authz_response`] writes it.
#[derive(serde::Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = AuthzDenial)]
#[cfg_attr(not(test), allow(dead_code))] // Written by hand; read back by the tests.
pub(super) struct AuthzDenial {
    /// `rate_limited`.
    pub(super) error: String,
    /// Milliseconds after which the same request can succeed.
    pub(super) retry_after_ms: u64,
}

/// The body of an `/v1/authz` refusal of a key on the rule's deny list (always `403`).
#[derive(serde::Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = AuthzListedDenial)]
#[cfg_attr(not(test), allow(dead_code))] // Written by hand; read back by the tests.
pub(super) struct AuthzListedDenial {
    /// `denied`.
    pub(super) error: String,
}

/// What a `403` of `/v1/authz` may be: a key on the deny list, or a denial with
/// `deny_status=403` (a schema only: both are written by [`authz_response`]).
#[derive(serde::Serialize, utoipa::ToSchema)]
#[serde(untagged)]
#[schema(as = AuthzForbidden)]
#[allow(dead_code)]
pub(super) enum AuthzForbidden {
    /// The key is on the rule's deny list.
    Listed(AuthzListedDenial),
    /// Denied, with `deny_status=403`.
    Denied(AuthzDenial),
}

/// What a 4xx answer of `/v1/authz` may be when `deny_status` names its status: an error, or
/// a denial with that status (a schema only: the two are written by `error_response` and
/// [`authz_response`]).
#[derive(serde::Serialize, utoipa::ToSchema)]
#[serde(untagged)]
#[schema(as = AuthzRefusal)]
#[allow(dead_code)]
pub(super) enum AuthzRefusal<'a> {
    /// An error.
    Error(super::response::ErrorJson<'a>),
    /// A denial.
    Denied(AuthzDenial),
}

/// `/v1/authz/{rule}` through the router: requests with a query string (`deny_status`), a
/// rule name that needs percent-decoding, and every request of a node in a cluster (where the
/// decision may wait on the key's owner). The others take the direct path of `Api`
/// (`mod.rs`); both answer alike.
#[utoipa::path(
    method(get, head, post, put, delete, patch, options, trace),
    path = "/v1/authz/{rule}",
    tag = "gateways",
    summary = "Forward authentication for gateways",
    params(
        ("rule" = String, Path, description = "a rule of the node's configuration"),
        AuthzQuery,
        ("X-RateLimit-Cost" = Option<u64>, Header, nullable = false, description = "tokens the request takes (default 1)"),
        ("X-RateLimit-Class" = Option<String>, Header, nullable = false, description = "the consumer class"),
        ("X-RateLimit-Max-Wait" = Option<u64>, Header, nullable = false, description = "ms the caller can wait for rights when the deny is only this node holding too little (0 to 10000, default 0)"),
    ),
    responses(
        (status = 200, description = "allowed (empty body)", headers(
            ("RateLimit-Policy" = String, description = "`\"rule\";q=limit;w=window_secs`"),
            ("RateLimit" = String, description = "`\"rule\";r=remaining;t=reset_secs`"),
            ("X-RateLimit-Limit" = u64, description = "the limit"),
            ("X-RateLimit-Remaining" = u64, description = "the remaining tokens"),
            ("X-RateLimit-Reset" = u64, description = "seconds until the reset"),
            ("Retry-After" = u64, description = "on a denial: seconds to wait"),
        )),
        (status = 429, description = "denied (or the `deny_status` asked for)", body = AuthzDenial, headers(
            ("RateLimit-Policy" = String, description = "`\"rule\";q=limit;w=window_secs`"),
            ("RateLimit" = String, description = "`\"rule\";r=remaining;t=reset_secs`"),
            ("X-RateLimit-Limit" = u64, description = "the limit"),
            ("X-RateLimit-Remaining" = u64, description = "the remaining tokens"),
            ("X-RateLimit-Reset" = u64, description = "seconds until the reset"),
            ("Retry-After" = u64, description = "on a denial: seconds to wait"),
        )),
        (status = 400, description = "the rule's key header is missing (`missing_key`), a wrong cost, or a wrong `deny_status`; or denied with `deny_status=400`", body = AuthzRefusal<'_>),
        (status = 403, description = "the key is on the rule's deny list (`{\"error\": \"denied\"}`); or denied with `deny_status=403`", body = AuthzForbidden),
        (status = 404, description = "no such rule; or denied with `deny_status=404`", body = AuthzRefusal<'_>),
        (status = "4XX", description = "denied with the `deny_status` asked for", body = AuthzDenial),
    ),
)]
pub(super) async fn authz(
    State(app): State<Arc<App>>,
    Path(rule): Path<String>,
    Query(q): Query<AuthzQuery>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    method: http::Method,
    uri: http::Uri,
    headers: HeaderMap,
) -> Response {
    let started = Instant::now();
    let resp = match deny_status(q.deny_status.as_deref()) {
        Ok(status) => match authz_input(&app, &rule, peer, (&method, &uri, &headers)) {
            Ok(input) => match app
                .check_waiting(input.check(&rule), input.max_wait_ms)
                .await
            {
                Ok((out, _waited)) => {
                    if let Some(hold) = authz_hold(&app, started, &out) {
                        tokio::time::sleep(hold).await;
                    }
                    authz_response(&rule, &out, status).map(Body::new)
                }
                Err(e) => e.into_response(),
            },
            Err(e) => e.into_response(),
        },
        Err(e) => e.into_response(),
    };
    authz_done(&app, started, resp.status());
    resp
}

/// How long an allowed `/v1/authz` answer is held: a leaky bucket's `delay_ms`, so that the
/// gateway passes the request on when the bucket releases it — but never past
/// `api.request_timeout` (less a margin of a tenth of it, at most 50 ms, for the answer to
/// go out): a longer delay is cut short there. `None` when there is nothing to wait for.
pub(super) fn authz_hold(app: &App, started: Instant, out: &Outcome) -> Option<Duration> {
    let delay = out.delay_ms().filter(|&d| d > 0 && out.decision.allowed)?;
    let timeout = app.request_timeout();
    let margin = (timeout / 10).min(Duration::from_millis(50));
    let budget = timeout
        .saturating_sub(margin)
        .saturating_sub(started.elapsed());
    Some(Duration::from_millis(delay).min(budget)).filter(|d| !d.is_zero())
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
    /// `X-RateLimit-Max-Wait`: how long the caller can wait for rights (`crate::wait`).
    pub(super) max_wait_ms: u64,
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

    /// The check of `rule` as one that outlives the request (decided by the key's owner).
    pub(super) fn to_owned_check(&self, rule: &str) -> OwnedAuthz {
        OwnedAuthz {
            rule: rule.to_owned(),
            key: self.key.clone().into_owned(),
            cost: self.cost,
            class: self.class.map(str::to_owned),
        }
    }
}

/// An `/v1/authz` check that outlives its request: one a region-mate decides, as the key's
/// owner, while the connection waits.
pub(super) struct OwnedAuthz {
    rule: String,
    key: String,
    cost: u64,
    class: Option<String>,
}

impl OwnedAuthz {
    /// The rule's name.
    pub(super) fn rule(&self) -> &str {
        &self.rule
    }

    /// The check it asks for.
    pub(super) fn check(&self) -> CheckRef<'_> {
        CheckRef {
            rule: &self.rule,
            key: &self.key,
            cost: self.cost,
            class: self.class.as_deref(),
            idempotency_key: None,
            dry_run: false,
        }
    }
}

/// The parts of an `/v1/authz` request its key may be made of: method, URI and headers.
pub(super) type AuthzRequest<'a> = (&'a http::Method, &'a http::Uri, &'a HeaderMap);

/// Reads the key, cost and class of an `/v1/authz/{rule}` request: `404 unknown_rule`,
/// `400 missing_key` when the rule's key header (or a part of a composite key) is absent or
/// empty, `400 invalid_request` for a cost that is not a non-negative integer.
pub(super) fn authz_input<'a>(
    app: &App,
    rule: &str,
    peer: SocketAddr,
    (method, uri, headers): AuthzRequest<'a>,
) -> Result<AuthzInput<'a>, ApiError> {
    let rules = app.limiter.rules();
    let entry = rules.by_name.get(rule).ok_or_else(|| ApiError {
        status: 404,
        code: "unknown_rule",
        message: format!("rule: no rule named {rule:?} is configured"),
    })?;
    let key_header = match &entry.rule.key_from {
        Some(KeyFrom::Header(name)) => Some(name.as_str()),
        Some(KeyFrom::Ip | KeyFrom::Parts(_)) | None => None,
    };
    // One pass over the request's few headers instead of a hashed lookup per name; the first
    // value of each name counts, as `HeaderMap::get` would return it.
    let (mut key, mut cost, mut class, mut max_wait) = (None, None, None, None);
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
        if max_wait.is_none() && name == "x-ratelimit-max-wait" {
            max_wait = Some(value);
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
        None => match &entry.rule.key_from {
            Some(KeyFrom::Parts(parts)) => Cow::Owned(composite_key(
                parts,
                (method, uri, headers),
                peer,
                &app.config.load().api.trusted_proxies,
            )?),
            _ => client_ip(headers, peer, &app.config.load().api.trusted_proxies)?,
        },
    };
    let cost = header_u64(cost, u64::MAX)
        .map_err(|()| ApiError::invalid("header X-RateLimit-Cost: must be a non-negative integer"))?
        .unwrap_or(1);
    let class = class.and_then(|v| v.to_str().ok());
    let max_wait_ms = header_u64(max_wait, crate::wait::MAX_WAIT_MS)
        .map_err(|()| {
            ApiError::invalid(format!(
                "header X-RateLimit-Max-Wait: must be an integer from 0 to {} (ms)",
                crate::wait::MAX_WAIT_MS
            ))
        })?
        .unwrap_or(0);
    Ok(AuthzInput {
        key,
        cost,
        class,
        max_wait_ms,
    })
}

/// An integer header (trimmed): `Ok(None)` when it is absent, `Err` when it is not an
/// integer from 0 to `max`.
fn header_u64(v: Option<&HeaderValue>, max: u64) -> Result<Option<u64>, ()> {
    v.map(|v| {
        v.to_str()
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
            .filter(|&n| n <= max)
            .ok_or(())
    })
    .transpose()
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
    } else if out.list == Some(crate::limiter::List::Deny) {
        // On the deny list: refused for good, whatever the rule's deny status.
        let mut resp = http::Response::new(Full::new(Bytes::from_static(br#"{"error":"denied"}"#)));
        *resp.status_mut() = StatusCode::FORBIDDEN;
        resp
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
                delay_ms: 0,
            },
            window_secs: 60,
            local_remaining: Some(1),
            shaped: false,
            list: None,
        }
    }

    fn listed(h: &HeaderMap) -> Vec<(String, String)> {
        h.iter()
            .map(|(n, v)| (n.to_string(), v.to_str().unwrap_or("?").to_string()))
            .collect()
    }

    #[test]
    fn a_denial_body_is_what_the_document_says() {
        use http_body_util::BodyExt;
        let resp = authz_response("api", &outcome(false), StatusCode::TOO_MANY_REQUESTS);
        let Ok(collected) = block_on(resp.into_body().collect());
        let bytes = collected.to_bytes();
        // `AuthzDenial` refuses unknown fields: the hand-written body has exactly its fields.
        let body: AuthzDenial = serde_json::from_slice(&bytes).expect("an AuthzDenial");
        assert_eq!(
            (body.error.as_str(), body.retry_after_ms),
            ("rate_limited", 2_300)
        );
        // A key on the deny list: 403 and the body of `AuthzListedDenial`, whatever the rule's
        // deny status.
        let mut listed = outcome(false);
        listed.list = Some(crate::limiter::List::Deny);
        let resp = authz_response("api", &listed, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(resp.status(), StatusCode::FORBIDDEN);
        let Ok(collected) = block_on(resp.into_body().collect());
        let body: AuthzListedDenial =
            serde_json::from_slice(&collected.to_bytes()).expect("an AuthzListedDenial");
        assert_eq!(body.error, "denied");
    }

    /// Polls a future that is ready at once (a full body).
    fn block_on<F: std::future::Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("a runtime")
            .block_on(f)
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
