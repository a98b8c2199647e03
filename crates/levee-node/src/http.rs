//! The HTTP API of `../shared/API.md`: routes, request parsing, answers and headers.
//!
//! Bodies are read up to `api.max_body` (413 beyond), must be JSON (415 otherwise), and are
//! decoded with the path of any wrong field in the error (400). Every error is
//! `{"error": code, "message": …}`.

use std::borrow::Cow;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::{Arc, LazyLock};
use std::task::{Context, Poll};
use std::time::Instant;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{ConnectInfo, Path, Query, Request, State};
use axum::http::{self, HeaderMap, HeaderName, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, post};
use bytes::BytesMut;
use http_body_util::{Either, Full};
use hyper::body::Incoming;
use hyper_util::service::TowerToHyperService;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::app::App;
use crate::limiter::{AllEntry, AllOutcome, ApiError, CheckRef, Field, Outcome};
use crate::metrics::Endpoint;
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
    bytes_response(
        status,
        serde_json::to_vec(body).unwrap_or_else(|_| b"{}".to_vec()),
    )
}

/// An answer with a JSON body already written.
fn bytes_response(status: StatusCode, bytes: Vec<u8>) -> Response {
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
    decode(&json_bytes(app, req).await?)
}

/// Reads a JSON body: 415 unless JSON, 413 beyond the limit.
async fn json_bytes(app: &App, req: Request) -> Result<Bytes, ApiError> {
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
    Ok(bytes)
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

impl CheckBody {
    /// Check `i` of a batch, validated and borrowing from `self`.
    fn check_ref(&self, i: usize) -> Result<CheckRef<'_>, ApiError> {
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

fn cost_of(cost: Option<i64>, field: Field) -> Result<u64, ApiError> {
    match cost {
        None => Ok(1),
        Some(c) if c < 0 => Err(ApiError::invalid(format!(
            "{field}cost: must not be negative"
        ))),
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

impl<'a> DecisionJson<'a> {
    fn new(rule: &'a str, key: &'a str, o: &Outcome) -> DecisionJson<'a> {
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
fn rate_limit_headers(headers: &mut HeaderMap, rule: &str, o: &Outcome) {
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
    crate::metrics::http(Endpoint::Check, resp.status().as_u16());
    resp
}

async fn check_inner(app: &App, req: Request) -> Result<Response, ApiError> {
    let body: CheckBody = json_body(app, req).await?;
    let cost = cost_of(body.cost, Field::Top)?;
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
        return Ok(all_response(&all, &out));
    }
    let rule = body
        .rule
        .ok_or_else(|| ApiError::invalid("rule: missing field"))?;
    let key = body
        .key
        .ok_or_else(|| ApiError::invalid("key: missing field"))?;
    let out = app
        .check(CheckRef {
            rule: &rule,
            key: &key,
            cost,
            class: body.class.as_deref(),
            idempotency_key: body.idempotency_key.as_deref(),
            dry_run: body.dry_run,
        })
        .await?;
    let mut resp = json_response(StatusCode::OK, &DecisionJson::new(&rule, &key, &out));
    rate_limit_headers(resp.headers_mut(), &rule, &out);
    Ok(resp)
}

fn all_response(entries: &[AllEntry], out: &AllOutcome) -> Response {
    #[derive(Serialize)]
    struct AllJson<'a> {
        #[serde(flatten)]
        top: DecisionJson<'a>,
        results: Vec<DecisionJson<'a>>,
    }
    let binding = &entries[out.binding];
    let mut shown = out.results[out.binding];
    shown.decision.allowed = out.allowed;
    let top = DecisionJson::new(&binding.rule, &binding.key, &shown);
    let results = entries
        .iter()
        .zip(&out.results)
        .map(|(e, o)| DecisionJson::new(&e.rule, &e.key, o))
        .collect();
    let mut resp = json_response(StatusCode::OK, &AllJson { top, results });
    rate_limit_headers(resp.headers_mut(), &binding.rule, &shown);
    resp
}

/// One check of a batch as the fast path reads it: strings borrowed from the body. A string
/// with an escape cannot be borrowed; such a body (like any body the fast path refuses) goes
/// through [`batch_checks_slow`], which decides what the answer is.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FastCheck<'a> {
    #[serde(borrow)]
    rule: Option<&'a str>,
    #[serde(borrow)]
    key: Option<&'a str>,
    cost: Option<i64>,
    #[serde(borrow)]
    class: Option<&'a str>,
    #[serde(borrow)]
    idempotency_key: Option<&'a str>,
    #[serde(default)]
    dry_run: bool,
    all: Option<serde::de::IgnoredAny>,
}

/// The body of `POST /v1/check/batch`, borrowed.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FastBatch<'a> {
    #[serde(borrow)]
    checks: Vec<ObjectOnly<FastCheck<'a>>>,
}

/// A value that must be a JSON object (serde would also read a struct from an array).
struct ObjectOnly<T>(T);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for ObjectOnly<T> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Object<T>(std::marker::PhantomData<T>);
        impl<'de, T: Deserialize<'de>> serde::de::Visitor<'de> for Object<T> {
            type Value = T;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
                T::deserialize(serde::de::value::MapAccessDeserializer::new(map))
            }
        }
        d.deserialize_map(Object(std::marker::PhantomData))
            .map(ObjectOnly)
    }
}

/// The checks of a batch body, borrowed from it; `None` when the fast path cannot read the
/// body (a malformed or wrongly typed field, an escaped string, a duplicate field …).
fn batch_checks_fast(bytes: &[u8]) -> Option<Vec<FastCheck<'_>>> {
    if bytes.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return None;
    }
    let body: FastBatch<'_> = serde_json::from_slice(bytes).ok()?;
    Some(body.checks.into_iter().map(|c| c.0).collect())
}

/// The checks of a batch body as owned values, through `serde_json::Value` and
/// `serde_path_to_error`: slower, and the reference for what a body means and how a wrong
/// one is explained (the path of the field, the first wrong check first).
fn batch_checks_slow(app: &App, bytes: &[u8]) -> Result<Vec<CheckBody>, ApiError> {
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct BatchBody {
        checks: Vec<serde_json::Value>,
    }
    let body: BatchBody = decode(bytes)?;
    if body.checks.len() > app.max_batch() {
        return Err(too_many_checks(app, body.checks.len()));
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
        c.check_ref(i)?;
        checks.push(c);
    }
    Ok(checks)
}

fn too_many_checks(app: &App, n: usize) -> ApiError {
    ApiError::invalid(format!(
        "checks: {n} checks, at most {} allowed",
        app.max_batch()
    ))
}

/// Validates the fields of check `i` of a batch (both paths): the same messages, in the same
/// order.
#[allow(clippy::too_many_arguments)]
fn batch_check<'a>(
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

/// Writes the answer to a batch, `{"results":[…]}`, the same bytes `serde_json` would write
/// for [`DecisionJson`]s, straight into `out`. `escaped`: whether rule and key strings may
/// need escaping; strings the fast path borrowed from the body never do (they held no
/// backslash, and JSON forbids raw control characters and quotes in strings).
fn write_batch(out: &mut Vec<u8>, checks: &[CheckRef<'_>], outs: &[Outcome], escaped: bool) {
    let mut n = itoa::Buffer::new();
    let string = |out: &mut Vec<u8>, s: &str| {
        if escaped {
            // Writing into a Vec cannot fail.
            let _ = serde_json::to_writer(&mut *out, s);
        } else {
            out.push(b'"');
            out.extend_from_slice(s.as_bytes());
            out.push(b'"');
        }
    };
    out.extend_from_slice(b"{\"results\":[");
    for (i, (c, o)) in checks.iter().zip(outs).enumerate() {
        let d = &o.decision;
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(if d.allowed {
            b"{\"allowed\":true,\"rule\":"
        } else {
            b"{\"allowed\":false,\"rule\":"
        });
        string(out, c.rule);
        out.extend_from_slice(b",\"key\":");
        string(out, c.key);
        for (name, v) in [
            (&b",\"limit\":"[..], d.limit),
            (b",\"remaining\":", d.remaining),
            (b",\"reset_after_ms\":", d.reset_after_ms),
            (b",\"retry_after_ms\":", d.retry_after_ms),
        ] {
            out.extend_from_slice(name);
            out.extend_from_slice(n.format(v).as_bytes());
        }
        out.extend_from_slice(b",\"mode\":\"");
        out.extend_from_slice(d.mode.as_str().as_bytes());
        out.extend_from_slice(if d.degraded {
            b"\",\"degraded\":true"
        } else {
            b"\",\"degraded\":false"
        });
        if d.mode == levee_core::RuleMode::Shadow {
            out.extend_from_slice(if d.would_allow {
                b",\"would_allow\":true"
            } else {
                b",\"would_allow\":false"
            });
        }
        out.push(b'}');
    }
    out.extend_from_slice(b"]}");
}

async fn batch(State(app): State<Arc<App>>, req: Request) -> Response {
    let started = Instant::now();
    let result: Result<Response, ApiError> = async {
        let bytes = json_bytes(&app, req).await?;
        let slow;
        let escaped;
        let checks: Vec<CheckRef<'_>> = match batch_checks_fast(&bytes) {
            Some(fast) => {
                if fast.len() > app.max_batch() {
                    return Err(too_many_checks(&app, fast.len()));
                }
                escaped = false;
                fast.into_iter()
                    .enumerate()
                    .map(|(i, c)| {
                        batch_check(
                            i,
                            c.rule,
                            c.key,
                            c.cost,
                            c.class,
                            c.idempotency_key,
                            c.dry_run,
                            c.all.is_some(),
                        )
                    })
                    .collect::<Result<_, _>>()?
            }
            None => {
                slow = batch_checks_slow(&app, &bytes)?;
                escaped = true;
                slow.iter()
                    .enumerate()
                    .map(|(i, c)| c.check_ref(i))
                    .collect::<Result<_, _>>()?
            }
        };
        let outs = app.batch(&checks).await?;
        let mut body = Vec::with_capacity(16 + checks.len() * 192);
        write_batch(&mut body, &checks, &outs, escaped);
        Ok(bytes_response(StatusCode::OK, body))
    }
    .await;
    let resp = result.unwrap_or_else(IntoResponse::into_response);
    app.limiter
        .metrics()
        .check_duration
        .record(started.elapsed().as_secs_f64());
    crate::metrics::http(Endpoint::Batch, resp.status().as_u16());
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
        let cost = cost_of(body.cost, Field::Top)?;
        let out = app
            .refund(CheckRef {
                rule: &body.rule,
                key: &body.key,
                cost,
                class: body.class.as_deref(),
                idempotency_key: None,
                dry_run: false,
            })
            .await?;
        let mut resp = json_response(
            StatusCode::OK,
            &DecisionJson::new(&body.rule, &body.key, &out),
        );
        rate_limit_headers(resp.headers_mut(), &body.rule, &out);
        Ok(resp)
    }
    .await;
    let resp = result.unwrap_or_else(IntoResponse::into_response);
    crate::metrics::http(Endpoint::Refund, resp.status().as_u16());
    resp
}

#[derive(Deserialize)]
struct AuthzQuery {
    deny_status: Option<String>,
}

/// `/v1/authz/{rule}` through the router: requests with a query string (`deny_status`), or
/// a rule name that needs percent-decoding. The others take [`Api`]'s direct path; both
/// answer alike.
async fn authz(
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
fn authz_done(app: &App, started: Instant, status: StatusCode) {
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

/// What `/v1/authz/{rule}` reads from the request: the key (borrowed from a header when it
/// can be), the cost and the class.
struct AuthzInput<'a> {
    key: Cow<'a, str>,
    cost: u64,
    class: Option<&'a str>,
}

impl AuthzInput<'_> {
    fn check<'b>(&'b self, rule: &'b str) -> CheckRef<'b> {
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

fn authz_input<'a>(
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
fn authz_response(
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

/// The body of every answer: a full buffer (the direct path) or the router's body.
pub type ApiBody = Either<Full<Bytes>, Body>;

/// The HTTP service of one connection. `/v1/authz/{rule}` on a single node is answered
/// directly — no router, no extractors, no boxed future, the key borrowed from its header —
/// since it is what gateways call on every request they pass; everything else (and
/// `/v1/authz` with a query string, a percent-encoded rule name, or in a cluster, where the
/// decision may wait on the key's owner) goes through [`router`].
#[derive(Clone)]
pub struct Api {
    app: Arc<App>,
    router: TowerToHyperService<Router>,
    peer: SocketAddr,
}

impl Api {
    /// The service for a connection from `peer`.
    pub fn new(app: Arc<App>, router: Router, peer: SocketAddr) -> Api {
        Api {
            app,
            router: TowerToHyperService::new(router),
            peer,
        }
    }
}

/// The rule of an `/v1/authz/{rule}` request the direct path can answer.
fn direct_authz_rule(uri: &axum::http::Uri) -> Option<&str> {
    if uri.query().is_some() {
        return None;
    }
    let rule = uri.path().strip_prefix("/v1/authz/")?;
    (!rule.is_empty() && !rule.bytes().any(|b| b == b'/' || b == b'%')).then_some(rule)
}

impl hyper::service::Service<Request<Incoming>> for Api {
    type Response = Response<ApiBody>;
    type Error = Infallible;
    type Future = ApiFuture;

    fn call(&self, mut req: Request<Incoming>) -> ApiFuture {
        if let Some(rule) = direct_authz_rule(req.uri())
            && self.app.replication.is_none()
        {
            let started = Instant::now();
            let resp = match authz_input(&self.app, rule, self.peer, req.headers()) {
                Ok(input) => match self.app.limiter.check(input.check(rule)) {
                    Ok(out) => {
                        authz_response(rule, &out, StatusCode::TOO_MANY_REQUESTS).map(Either::Left)
                    }
                    Err(e) => error_response(&e).map(Either::Right),
                },
                Err(e) => error_response(&e).map(Either::Right),
            };
            authz_done(&self.app, started, resp.status());
            return ApiFuture::Ready(Some(resp));
        }
        req.extensions_mut().insert(ConnectInfo(self.peer));
        let routed = self.router.call(req);
        ApiFuture::Routed(Box::pin(async move {
            match routed.await {
                Ok(resp) => resp.map(Either::Right),
                Err(never) => match never {},
            }
        }))
    }
}

/// The future of [`Api`]: an answer already made, or the router's.
pub enum ApiFuture {
    /// Answered directly (taken when polled).
    Ready(Option<Response<ApiBody>>),
    /// Answered by the router.
    Routed(Pin<Box<dyn Future<Output = Response<ApiBody>> + Send>>),
}

impl Future for ApiFuture {
    type Output = Result<Response<ApiBody>, Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.get_mut() {
            ApiFuture::Ready(resp) => Poll::Ready(Ok(resp.take().unwrap_or_else(|| {
                error_response(&ApiError {
                    status: 500,
                    code: "internal",
                    message: "the answer was already sent".into(),
                })
                .map(Either::Right)
            }))),
            ApiFuture::Routed(fut) => fut.as_mut().poll(cx).map(Ok),
        }
    }
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
    crate::metrics::http(Endpoint::Usage, resp.status().as_u16());
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
    crate::metrics::http(Endpoint::Reset, resp.status().as_u16());
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
    crate::metrics::http(Endpoint::Reload, resp.status().as_u16());
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
    fn decode_names_the_wrong_field() {
        let e = decode::<CheckBody>(br#"{"rule": "a", "key": "k", "cost": "x"}"#).unwrap_err();
        assert!(e.message.starts_with("cost:"), "{}", e.message);
        let e = decode::<CheckBody>(br#"{"rule": "a", "bogus": 1}"#).unwrap_err();
        assert!(e.message.contains("bogus"), "{}", e.message);
        let e = decode::<CheckBody>(b"{not json").unwrap_err();
        assert!(e.message.starts_with("body:"), "{}", e.message);
    }

    #[test]
    fn the_batch_answer_is_what_serde_json_writes() {
        use levee_core::{Decision, RuleMode};
        let decision = |allowed, mode, degraded| Outcome {
            decision: Decision {
                allowed,
                would_allow: !allowed,
                limit: 100,
                remaining: 7,
                reset_after_ms: 1_234,
                retry_after_ms: u64::MAX,
                mode,
                degraded,
            },
            window_secs: 60,
        };
        let outs = [
            decision(true, RuleMode::Enforce, false),
            decision(false, RuleMode::Shadow, true),
            decision(false, RuleMode::Enforce, true),
        ];
        let check = |rule, key| CheckRef {
            rule,
            key,
            cost: 1,
            class: None,
            idempotency_key: None,
            dry_run: false,
        };
        for (checks, escaped) in [
            (
                vec![check("api", "k1"), check("r", "é✓"), check("a-b", "x y")],
                false,
            ),
            (
                vec![
                    check("api", "q\"uote"),
                    check("r", "back\\slash"),
                    check("t", "tab\t\u{1}"),
                ],
                true,
            ),
        ] {
            let mut ours = Vec::new();
            write_batch(&mut ours, &checks, &outs, escaped);
            #[derive(Serialize)]
            struct Results<'a> {
                results: Vec<DecisionJson<'a>>,
            }
            let reference = serde_json::to_vec(&Results {
                results: checks
                    .iter()
                    .zip(&outs)
                    .map(|(c, o)| DecisionJson::new(c.rule, c.key, o))
                    .collect(),
            })
            .unwrap();
            assert_eq!(
                String::from_utf8(ours).unwrap(),
                String::from_utf8(reference).unwrap()
            );
        }
        let mut empty = Vec::new();
        write_batch(&mut empty, &[], &[], false);
        assert_eq!(empty, br#"{"results":[]}"#);
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
