//! The HTTP API of `../shared/API.md`: routes, request parsing, answers and headers.
//!
//! Bodies are read up to `api.max_body` (413 beyond), must be JSON (415 otherwise), and are
//! decoded with the path of any wrong field in the error (400). Every error is
//! `{"error": code, "message": …}`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{ConnectInfo, Path, Query, Request, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, post};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::app::App;
use crate::limiter::{AllEntry, AllOutcome, ApiError, CheckRequest, Outcome};
use levee_core::rule::KeyFrom;

/// Builds the router of the API.
pub fn router(app: Arc<App>) -> Router {
    Router::new()
        .route("/v1/check", post(check))
        .route("/v1/check/batch", post(batch))
        .route("/v1/refund", post(refund))
        .route("/v1/authz/{rule}", any(authz))
        .route("/v1/usage/{rule}/{key}", get(usage).delete(reset))
        .route("/v1/rules", get(rules))
        .route("/v1/cluster", get(cluster))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/admin/reload", post(reload))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(axum::middleware::from_fn_with_state(
            Arc::clone(&app),
            guard,
        ))
        .with_state(app)
}

/// Time limit, and `503` while the node is not serving.
async fn guard(
    State(app): State<Arc<App>>,
    req: Request,
    next: axum::middleware::Next,
) -> Response {
    let timeout = app.request_timeout();
    match tokio::time::timeout(timeout, next.run(req)).await {
        Ok(resp) => resp,
        Err(_) => error_response(&ApiError {
            status: 503,
            code: "unavailable",
            message: format!("the request took longer than {} ms", timeout.as_millis()),
        }),
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        error_response(&self)
    }
}

fn error_response(e: &ApiError) -> Response {
    #[derive(Serialize)]
    struct Body<'a> {
        error: &'a str,
        message: &'a str,
    }
    json_response(
        StatusCode::from_u16(e.status).unwrap_or(StatusCode::BAD_REQUEST),
        &Body {
            error: e.code,
            message: &e.message,
        },
    )
}

fn json_response<T: Serialize>(status: StatusCode, body: &T) -> Response {
    let bytes = serde_json::to_vec(body).unwrap_or_else(|_| b"{}".to_vec());
    let mut resp = Response::new(Body::from(bytes));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

/// Reads and decodes a JSON body: 415 unless JSON, 413 beyond the limit, 400 naming the field.
async fn json_body<T: DeserializeOwned>(app: &App, req: Request) -> Result<T, ApiError> {
    let (parts, body) = req.into_parts();
    let limit = app.max_body();
    if let Some(len) = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
        && len > limit as u64
    {
        return Err(too_large(limit));
    }
    let is_json = parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(|v| {
            v.split(';')
                .next()
                .unwrap_or("")
                .trim()
                .to_ascii_lowercase()
        })
        .is_some_and(|v| {
            v == "application/json" || (v.starts_with("application/") && v.ends_with("+json"))
        });
    if !is_json {
        return Err(ApiError {
            status: 415,
            code: "unsupported_media_type",
            message: "Content-Type must be application/json".into(),
        });
    }
    let bytes: Bytes = axum::body::to_bytes(body, limit).await.map_err(|e| {
        if std::error::Error::source(&e).is_some_and(|s| s.is::<http_body_util::LengthLimitError>())
            || e.to_string().contains("length limit")
        {
            too_large(limit)
        } else {
            ApiError::invalid(format!("body: could not be read: {e}"))
        }
    })?;
    decode(&bytes)
}

fn too_large(limit: usize) -> ApiError {
    ApiError {
        status: 413,
        code: "payload_too_large",
        message: format!("the body is over the limit of {limit} bytes"),
    }
}

/// Decodes a JSON object, naming the path of a wrong field. Anything but an object (serde
/// would also read a struct from a positional array) is refused.
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    match bytes.iter().find(|b| !b.is_ascii_whitespace()) {
        Some(b'{') => {}
        Some(b'[' | b'"' | b'-' | b'0'..=b'9' | b't' | b'f' | b'n') => {
            return Err(ApiError::invalid("body: must be a JSON object"));
        }
        None => return Err(ApiError::invalid("body: empty; a JSON object is required")),
        Some(_) => return Err(ApiError::invalid("body: malformed JSON")),
    }
    let de = &mut serde_json::Deserializer::from_slice(bytes);
    let value = serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        let msg = strip_position(&inner.to_string());
        if inner.is_syntax() || inner.is_eof() {
            ApiError::invalid(format!("body: malformed JSON: {msg}"))
        } else if path == "." || path == "?" || path.is_empty() {
            ApiError::invalid(format!("body: {msg}"))
        } else {
            ApiError::invalid(format!("{path}: {msg}"))
        }
    })?;
    Ok(value)
}

fn strip_position(msg: &str) -> String {
    match msg.rfind(" at line ") {
        Some(i) => msg[..i].to_owned(),
        None => msg.to_owned(),
    }
}

/// The body of `POST /v1/check`: a single check, or an atomic `all` call.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CheckBody {
    rule: Option<String>,
    key: Option<String>,
    cost: Option<i64>,
    class: Option<String>,
    idempotency_key: Option<String>,
    #[serde(default)]
    dry_run: bool,
    all: Option<Vec<AllEntry>>,
}

fn cost_of(cost: Option<i64>, field: &str) -> Result<u64, ApiError> {
    match cost {
        None => Ok(1),
        Some(c) if c < 0 => Err(ApiError::invalid(format!("{field}: must not be negative"))),
        Some(c) => Ok(c as u64),
    }
}

/// The JSON of one decision.
#[derive(Serialize)]
struct DecisionJson<'a> {
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

impl<'a> From<&'a Outcome> for DecisionJson<'a> {
    fn from(o: &'a Outcome) -> DecisionJson<'a> {
        let d = &o.decision;
        DecisionJson {
            allowed: d.allowed,
            rule: &o.rule,
            key: &o.key,
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

/// Adds the rate-limit headers of an outcome.
fn rate_limit_headers(headers: &mut HeaderMap, o: &Outcome) {
    let d = &o.decision;
    let reset_secs = d.reset_after_ms.div_ceil(1000);
    let mut put = |name: HeaderName, value: String| {
        if let Ok(v) = HeaderValue::from_str(&value) {
            headers.insert(name, v);
        }
    };
    put(
        HeaderName::from_static("ratelimit-policy"),
        format!("\"{}\";q={};w={}", o.rule, d.limit, o.window_secs),
    );
    put(
        HeaderName::from_static("ratelimit"),
        format!("\"{}\";r={};t={}", o.rule, d.remaining, reset_secs),
    );
    put(
        HeaderName::from_static("x-ratelimit-limit"),
        d.limit.to_string(),
    );
    put(
        HeaderName::from_static("x-ratelimit-remaining"),
        d.remaining.to_string(),
    );
    put(
        HeaderName::from_static("x-ratelimit-reset"),
        reset_secs.to_string(),
    );
    if !d.allowed {
        put(
            header::RETRY_AFTER,
            d.retry_after_ms.div_ceil(1000).max(1).to_string(),
        );
    }
}

async fn check(State(app): State<Arc<App>>, req: Request) -> Response {
    let started = Instant::now();
    let resp = match check_inner(&app, req).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    };
    app.limiter
        .metrics()
        .check_duration
        .record(started.elapsed().as_secs_f64());
    crate::metrics::http("check", resp.status().as_u16());
    resp
}

async fn check_inner(app: &App, req: Request) -> Result<Response, ApiError> {
    let body: CheckBody = json_body(app, req).await?;
    let cost = cost_of(body.cost, "cost")?;
    if let Some(all) = body.all {
        if body.rule.is_some() || body.key.is_some() || body.class.is_some() {
            return Err(ApiError::invalid(
                "all: give either `all` or `rule` and `key`, not both",
            ));
        }
        if all.len() > app.max_batch() {
            return Err(ApiError::invalid(format!(
                "all: {} entries, at most {} allowed",
                all.len(),
                app.max_batch()
            )));
        }
        let out =
            app.limiter
                .check_all(&all, cost, body.dry_run, body.idempotency_key.as_deref())?;
        return Ok(all_response(&out));
    }
    let rule = body
        .rule
        .ok_or_else(|| ApiError::invalid("rule: missing field"))?;
    let key = body
        .key
        .ok_or_else(|| ApiError::invalid("key: missing field"))?;
    let req = CheckRequest {
        rule,
        key,
        cost,
        class: body.class,
        idempotency_key: body.idempotency_key,
        dry_run: body.dry_run,
    };
    let out = app.check(&req).await?;
    let mut resp = json_response(StatusCode::OK, &DecisionJson::from(&out));
    rate_limit_headers(resp.headers_mut(), &out);
    Ok(resp)
}

fn all_response(out: &AllOutcome) -> Response {
    #[derive(Serialize)]
    struct AllJson<'a> {
        #[serde(flatten)]
        top: DecisionJson<'a>,
        results: Vec<DecisionJson<'a>>,
    }
    let binding = &out.results[out.binding];
    let mut top = DecisionJson::from(binding);
    top.allowed = out.allowed;
    let results = out.results.iter().map(DecisionJson::from).collect();
    let mut resp = json_response(StatusCode::OK, &AllJson { top, results });
    let mut shown = binding.clone();
    shown.decision.allowed = out.allowed;
    rate_limit_headers(resp.headers_mut(), &shown);
    resp
}

async fn batch(State(app): State<Arc<App>>, req: Request) -> Response {
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct BatchBody {
        checks: Vec<serde_json::Value>,
    }
    #[derive(Serialize)]
    struct BatchJson<'a> {
        results: Vec<DecisionJson<'a>>,
    }
    let started = Instant::now();
    let result: Result<Response, ApiError> = async {
        let body: BatchBody = json_body(&app, req).await?;
        if body.checks.len() > app.max_batch() {
            return Err(ApiError::invalid(format!(
                "checks: {} checks, at most {} allowed",
                body.checks.len(),
                app.max_batch()
            )));
        }
        let mut checks = Vec::with_capacity(body.checks.len());
        for (i, v) in body.checks.into_iter().enumerate() {
            if !v.is_object() {
                return Err(ApiError::invalid(format!(
                    "checks[{i}]: must be a JSON object"
                )));
            }
            let c: CheckBody = serde_path_to_error::deserialize(v).map_err(|e| {
                let path = e.path().to_string();
                let msg = strip_position(&e.into_inner().to_string());
                if path == "." {
                    ApiError::invalid(format!("checks[{i}]: {msg}"))
                } else {
                    ApiError::invalid(format!("checks[{i}].{path}: {msg}"))
                }
            })?;
            if c.all.is_some() {
                return Err(ApiError::invalid(format!(
                    "checks[{i}].all: atomic calls go to /v1/check"
                )));
            }
            let cost = cost_of(c.cost, &format!("checks[{i}].cost"))?;
            let rule = c
                .rule
                .ok_or_else(|| ApiError::invalid(format!("checks[{i}].rule: missing field")))?;
            let key = c
                .key
                .ok_or_else(|| ApiError::invalid(format!("checks[{i}].key: missing field")))?;
            checks.push(CheckRequest {
                rule,
                key,
                cost,
                class: c.class,
                idempotency_key: c.idempotency_key,
                dry_run: c.dry_run,
            });
        }
        let outs = app.batch(&checks).await?;
        Ok(json_response(
            StatusCode::OK,
            &BatchJson {
                results: outs.iter().map(DecisionJson::from).collect(),
            },
        ))
    }
    .await;
    let resp = result.unwrap_or_else(IntoResponse::into_response);
    app.limiter
        .metrics()
        .check_duration
        .record(started.elapsed().as_secs_f64());
    crate::metrics::http("batch", resp.status().as_u16());
    resp
}

async fn refund(State(app): State<Arc<App>>, req: Request) -> Response {
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct RefundBody {
        rule: String,
        key: String,
        cost: Option<i64>,
        class: Option<String>,
    }
    let result: Result<Response, ApiError> = async {
        let body: RefundBody = json_body(&app, req).await?;
        let cost = cost_of(body.cost, "cost")?;
        let req = CheckRequest {
            rule: body.rule,
            key: body.key,
            cost,
            class: body.class,
            idempotency_key: None,
            dry_run: false,
        };
        let out = app.refund(&req).await?;
        let mut resp = json_response(StatusCode::OK, &DecisionJson::from(&out));
        rate_limit_headers(resp.headers_mut(), &out);
        Ok(resp)
    }
    .await;
    let resp = result.unwrap_or_else(IntoResponse::into_response);
    crate::metrics::http("refund", resp.status().as_u16());
    resp
}

#[derive(Deserialize)]
struct AuthzQuery {
    deny_status: Option<String>,
}

async fn authz(
    State(app): State<Arc<App>>,
    Path(rule): Path<String>,
    Query(q): Query<AuthzQuery>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
) -> Response {
    let started = Instant::now();
    let resp = authz_inner(&app, &rule, q, peer, &headers)
        .await
        .unwrap_or_else(IntoResponse::into_response);
    app.limiter
        .metrics()
        .check_duration
        .record(started.elapsed().as_secs_f64());
    crate::metrics::http("authz", resp.status().as_u16());
    resp
}

async fn authz_inner(
    app: &App,
    rule: &str,
    q: AuthzQuery,
    peer: SocketAddr,
    headers: &HeaderMap,
) -> Result<Response, ApiError> {
    let deny_status = match q.deny_status.as_deref() {
        None => StatusCode::TOO_MANY_REQUESTS,
        Some(s) => s
            .parse::<u16>()
            .ok()
            .filter(|c| (400..=499).contains(c))
            .and_then(|c| StatusCode::from_u16(c).ok())
            .ok_or_else(|| {
                ApiError::invalid(format!("deny_status: {s:?} is not a 4xx status code"))
            })?,
    };
    let key_from = {
        let rules = app.limiter.rules();
        let entry = rules.by_name.get(rule).ok_or_else(|| ApiError {
            status: 404,
            code: "unknown_rule",
            message: format!("rule: no rule named {rule:?} is configured"),
        })?;
        entry.rule.key_from.clone().unwrap_or(KeyFrom::Ip)
    };
    let key = match &key_from {
        KeyFrom::Header(name) => headers
            .get(name.as_str())
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
            .filter(|v| !v.is_empty())
            .map(str::to_owned)
            .ok_or_else(|| ApiError {
                status: 400,
                code: "missing_key",
                message: format!("header {name}: missing or empty"),
            })?,
        KeyFrom::Ip => client_ip(headers, peer),
    };
    let cost = match headers.get("x-ratelimit-cost") {
        None => 1,
        Some(v) => v
            .to_str()
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
            .ok_or_else(|| {
                ApiError::invalid("header X-RateLimit-Cost: must be a non-negative integer")
            })?,
    };
    let class = headers
        .get("x-ratelimit-class")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let out = app
        .check(&CheckRequest {
            rule: rule.to_owned(),
            key,
            cost,
            class,
            idempotency_key: None,
            dry_run: false,
        })
        .await?;
    let mut resp = if out.decision.allowed {
        Response::new(Body::empty())
    } else {
        #[derive(Serialize)]
        struct Denied {
            error: &'static str,
            retry_after_ms: u64,
        }
        json_response(
            deny_status,
            &Denied {
                error: "rate_limited",
                retry_after_ms: out.decision.retry_after_ms,
            },
        )
    };
    rate_limit_headers(resp.headers_mut(), &out);
    Ok(resp)
}

/// The client's address: the first `X-Forwarded-For` entry, else `X-Real-IP`, else the peer.
fn client_ip(headers: &HeaderMap, peer: SocketAddr) -> String {
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
    forwarded
        .or(real)
        .map(str::to_owned)
        .unwrap_or_else(|| peer.ip().to_string())
}

#[derive(Deserialize)]
struct ClassQuery {
    class: Option<String>,
}

async fn usage(
    State(app): State<Arc<App>>,
    Path((rule, key)): Path<(String, String)>,
    Query(q): Query<ClassQuery>,
) -> Response {
    #[derive(Serialize)]
    struct UsageJson<'a> {
        rule: &'a str,
        key: &'a str,
        limit: u64,
        used: u64,
        remaining: u64,
        reset_after_ms: u64,
        regions: serde_json::Map<String, serde_json::Value>,
        /// The key's owner in this node's region (extension: operators and tests use it).
        owner: String,
    }
    let owner = app.owner_of(&key);
    let resp = match app.limiter.usage(&rule, &key, q.class.as_deref()) {
        Ok(u) => {
            let regions = u
                .region_names
                .iter()
                .zip(&u.usage.regions)
                .map(|(n, v)| (n.clone(), serde_json::Value::from(*v)))
                .collect();
            json_response(
                StatusCode::OK,
                &UsageJson {
                    rule: &u.rule,
                    key: &u.key,
                    limit: u.usage.limit,
                    used: u.usage.used,
                    remaining: u.usage.remaining,
                    reset_after_ms: u.usage.reset_after_ms,
                    regions,
                    owner,
                },
            )
        }
        Err(e) => e.into_response(),
    };
    crate::metrics::http("usage", resp.status().as_u16());
    resp
}

async fn reset(
    State(app): State<Arc<App>>,
    Path((rule, key)): Path<(String, String)>,
    headers: HeaderMap,
) -> Response {
    #[derive(Serialize)]
    struct ResetJson<'a> {
        rule: &'a str,
        key: &'a str,
        reset: bool,
    }
    let resp = match app
        .authorize(&headers)
        .and_then(|()| app.limiter.reset(&rule, &key))
    {
        Ok(existed) => json_response(
            StatusCode::OK,
            &ResetJson {
                rule: &rule,
                key: &key,
                reset: existed,
            },
        ),
        Err(e) => e.into_response(),
    };
    crate::metrics::http("reset", resp.status().as_u16());
    resp
}

async fn rules(State(app): State<Arc<App>>) -> Response {
    #[derive(Serialize)]
    struct RulesJson<'a> {
        rules: Vec<&'a levee_core::RuleSpec>,
    }
    let rules = app.limiter.rules();
    json_response(
        StatusCode::OK,
        &RulesJson {
            rules: rules.ordered.iter().map(|e| &e.rule.spec).collect(),
        },
    )
}

async fn cluster(State(app): State<Arc<App>>) -> Response {
    json_response(StatusCode::OK, &app.cluster_status())
}

async fn healthz() -> Response {
    json_response(StatusCode::OK, &serde_json::json!({ "status": "ok" }))
}

async fn readyz(State(app): State<Arc<App>>) -> Response {
    if app.ready.load(Ordering::Acquire) && !app.shutting_down.load(Ordering::Acquire) {
        json_response(StatusCode::OK, &serde_json::json!({ "status": "ready" }))
    } else {
        let why = if app.shutting_down.load(Ordering::Acquire) {
            "shutting down"
        } else {
            "starting"
        };
        error_response(&ApiError {
            status: 503,
            code: "unavailable",
            message: format!("the node is {why}"),
        })
    }
}

async fn metrics(State(app): State<Arc<App>>) -> Response {
    let store = app.limiter.store();
    app.limiter.metrics().keys.set(store.len() as f64);
    crate::metrics::evictions(store.evictions());
    let body = app.prometheus.render();
    let mut resp = Response::new(Body::from(body));
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    resp
}

async fn reload(State(app): State<Arc<App>>, headers: HeaderMap) -> Response {
    let resp = match app.authorize(&headers) {
        Err(e) => e.into_response(),
        Ok(()) => match app.reload("admin") {
            Ok(rules) => json_response(
                StatusCode::OK,
                &serde_json::json!({ "reloaded": true, "rules": rules }),
            ),
            Err(e) => json_response(
                StatusCode::BAD_REQUEST,
                &serde_json::json!({ "error": "invalid_config", "message": e.to_string(), "reloaded": false }),
            ),
        },
    };
    crate::metrics::http("reload", resp.status().as_u16());
    resp
}

async fn not_found(method: Method, uri: axum::http::Uri) -> Response {
    error_response(&ApiError {
        status: 404,
        code: "not_found",
        message: format!("no endpoint {method} {}", uri.path()),
    })
}

async fn method_not_allowed(method: Method, uri: axum::http::Uri) -> Response {
    error_response(&ApiError {
        status: 405,
        code: "method_not_allowed",
        message: format!("{method} is not allowed on {}", uri.path()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decode_names_the_wrong_field() {
        let e = decode::<CheckBody>(br#"{"rule": "a", "key": "k", "cost": "x"}"#).unwrap_err();
        assert!(e.message.starts_with("cost:"), "{}", e.message);
        let e = decode::<CheckBody>(br#"{"rule": "a", "bogus": 1}"#).unwrap_err();
        assert!(e.message.contains("bogus"), "{}", e.message);
        let e = decode::<CheckBody>(b"{not json").unwrap_err();
        assert!(e.message.starts_with("body:"), "{}", e.message);
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
