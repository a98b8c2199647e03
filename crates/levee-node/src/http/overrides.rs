//! `/v1/overrides/{rule}/{key}` and `/v1/overrides/{rule}`: per-key overrides, allow and deny
//! lists (API.md "Per-key overrides, allow and deny lists"). Writing (`PUT`, `DELETE`) needs
//! the admin token when one is configured; reading does not. The limiter keeps them
//! (`limiter/overrides.rs`); in a cluster they reach every node by gossip.

use std::sync::Arc;

use axum::extract::{Path, Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use levee_core::overrides::override_value;
use levee_core::{HumanDuration, Millis, OverrideReg, OverrideValue};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::body::json_body;
use super::response::json_response;
use crate::app::App;
use crate::limiter::ApiError;
use crate::metrics::Endpoint;

/// The longest `ttl` an override may have.
pub(super) const MAX_TTL_MS: Millis = 366 * 86_400_000;

/// The body of `PUT /v1/overrides/{rule}/{key}`: one of `limit` (window, quota and sliding
/// log rules), `rate` and `burst` (token and leaky buckets; `burst` defaults to `rate`), or
/// `action`; and an optional `ttl`. Read as one object (any field missing, unknown fields
/// refused) and checked by [`parse`]; documented as [`OverrideBodyDoc`], one of three shapes.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct OverrideBody {
    #[serde(default)]
    limit: Option<u64>,
    #[serde(default)]
    rate: Option<u64>,
    #[serde(default)]
    burst: Option<u64>,
    #[serde(default)]
    action: Option<String>,
    #[serde(default)]
    ttl: Option<String>,
}

/// The body of `PUT /v1/overrides/{rule}/{key}`, as the document says it: exactly one of
/// three shapes. Which one a rule takes depends on its algorithm (a window's `limit`, a
/// bucket's `rate`), which a schema cannot say: the other is `400` naming the field.
#[derive(Deserialize, ToSchema)]
#[serde(untagged)]
#[allow(
    dead_code,
    reason = "documentation only: the handler reads OverrideBody"
)]
#[schema(as = OverrideBody)]
pub(super) enum OverrideBodyDoc {
    /// Windows, quotas, sliding logs.
    Limit(OverrideLimit),
    /// Token and leaky buckets.
    Rate(OverrideRate),
    /// The allow or deny list.
    Action(OverrideAction),
}

/// `{"limit": N}`: the key's own limit (windows, quotas, sliding logs).
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[allow(dead_code, reason = "documentation only")]
#[schema(as = OverrideLimit)]
pub(super) struct OverrideLimit {
    /// The key's limit per window or period.
    #[schema(minimum = 1, maximum = 1_000_000_000_000_u64)]
    limit: u64,
    /// How long it lasts (`"30s"`, `"1h"`, `"7d"`: 1 ms to 366 days); forever when absent.
    #[schema(required = false, value_type = String, pattern = "^[0-9]{1,12}(ms|s|m|h|d)$", example = "1h")]
    ttl: Option<String>,
}

/// `{"rate": R, "burst": B}`: the key's own rate and burst (token and leaky buckets).
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[allow(dead_code, reason = "documentation only")]
#[schema(as = OverrideRate)]
pub(super) struct OverrideRate {
    /// Tokens per the rule's `per`.
    #[schema(minimum = 1, maximum = 1_000_000_000_000_u64)]
    rate: u64,
    /// Capacity (token bucket) or queue (leaky bucket); defaults to `rate`.
    #[schema(required = false, value_type = u64, minimum = 1, maximum = 999_999_999)]
    burst: Option<u64>,
    /// How long it lasts (`"30s"`, `"1h"`, `"7d"`: 1 ms to 366 days); forever when absent.
    #[schema(required = false, value_type = String, pattern = "^[0-9]{1,12}(ms|s|m|h|d)$", example = "1h")]
    ttl: Option<String>,
}

/// `{"action": "allow" | "deny"}`: the key on the allow list (admitted, not counted) or the
/// deny list (refused).
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[allow(dead_code, reason = "documentation only")]
#[schema(as = OverrideAction)]
pub(super) struct OverrideAction {
    /// `allow` or `deny`.
    #[schema(value_type = String, pattern = "^(allow|deny)$")]
    action: String,
    /// How long it lasts (`"30s"`, `"1h"`, `"7d"`: 1 ms to 366 days); forever when absent.
    #[schema(required = false, value_type = String, pattern = "^[0-9]{1,12}(ms|s|m|h|d)$", example = "1h")]
    ttl: Option<String>,
}

/// An override as answered: its key's figures, or its list, and how long it has left.
#[derive(Serialize, ToSchema)]
#[schema(as = Override)]
pub(super) struct OverrideJson<'a> {
    /// The rule.
    rule: &'a str,
    /// The key.
    key: &'a str,
    /// The key's limit (windows, quotas, sliding logs).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(required = false, value_type = u64)]
    limit: Option<u64>,
    /// The key's rate (buckets).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(required = false, value_type = u64)]
    rate: Option<u64>,
    /// The key's burst (buckets).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(required = false, value_type = u64)]
    burst: Option<u64>,
    /// `allow` or `deny`.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(required = false, value_type = String)]
    action: Option<&'static str>,
    /// Milliseconds until it disappears (absent: it lasts until deleted).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(required = false, value_type = u64)]
    expires_in_ms: Option<u64>,
}

impl<'a> OverrideJson<'a> {
    fn new(rule: &'a str, key: &'a str, reg: &OverrideReg, now: Millis) -> OverrideJson<'a> {
        let mut o = OverrideJson {
            rule,
            key,
            limit: None,
            rate: None,
            burst: None,
            action: None,
            expires_in_ms: reg.expires_at.map(|at| at.saturating_sub(now)),
        };
        match reg.value {
            Some(OverrideValue::Limit(l)) => o.limit = Some(l),
            Some(OverrideValue::Rate { rate, burst }) => {
                o.rate = Some(rate);
                o.burst = Some(burst);
            }
            Some(OverrideValue::Allow) => o.action = Some("allow"),
            Some(OverrideValue::Deny) => o.action = Some("deny"),
            None => {}
        }
        o
    }
}

/// The answer of `GET /v1/overrides/{rule}`.
#[derive(Serialize, ToSchema)]
#[schema(as = Overrides)]
pub(super) struct OverridesJson<'a> {
    /// The rule's overrides in force, by key.
    overrides: Vec<OverrideJson<'a>>,
}

/// The value and ttl of a body, or a `400` naming the field.
fn parse(body: &OverrideBody) -> Result<(OverrideValue, Option<Millis>), ApiError> {
    let value = override_value(body.limit, body.rate, body.burst, body.action.as_deref())
        .map_err(|e| ApiError::invalid(e.to_string()))?;
    let ttl = match &body.ttl {
        None => None,
        Some(t) => {
            let d: HumanDuration = t
                .parse()
                .map_err(|e| ApiError::invalid(format!("ttl: {e}")))?;
            match d.as_millis() {
                0 => return Err(ApiError::invalid("ttl: must be at least 1ms")),
                ms if ms > MAX_TTL_MS => {
                    return Err(ApiError::invalid("ttl: must be at most 366d"));
                }
                ms => Some(ms),
            }
        }
    };
    Ok((value, ttl))
}

/// `PUT /v1/overrides/{rule}/{key}`: the key's own figures, or its list, from the next
/// decision on, on every node.
#[utoipa::path(
    put,
    path = "/v1/overrides/{rule}/{key}",
    tag = "admin",
    summary = "Give a key its own figures, or put it on the allow or deny list",
    params(
        ("rule" = String, Path, description = "the rule"),
        ("key" = String, Path, description = "the key"),
    ),
    request_body = OverrideBodyDoc,
    security((), ("bearer" = [])),
    responses(
        (status = 200, description = "the override as stored", body = OverrideJson<'_>),
        (status = 400, description = "a wrong body (the message names the field) or key", body = super::response::ErrorJson<'_>),
        (status = 401, description = "`api.admin_token` is configured and the bearer token is missing or wrong", body = super::response::ErrorJson<'_>),
        (status = 404, description = "no such rule (`unknown_rule`)", body = super::response::ErrorJson<'_>),
        (status = 409, description = "`node.max_overrides` overrides are in force (`too_many_overrides`)", body = super::response::ErrorJson<'_>),
        (status = 413, description = "the body is over `api.max_body`", body = super::response::ErrorJson<'_>),
        (status = 415, description = "the body is not JSON", body = super::response::ErrorJson<'_>),
    ),
)]
pub(super) async fn put(
    State(app): State<Arc<App>>,
    Path((rule, key)): Path<(String, String)>,
    req: Request,
) -> Response {
    let resp = match put_inner(&app, &rule, &key, req).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    };
    crate::metrics::http(Endpoint::Overrides, resp.status().as_u16());
    resp
}

async fn put_inner(app: &App, rule: &str, key: &str, req: Request) -> Result<Response, ApiError> {
    app.authorize(req.headers())?;
    let body: OverrideBody = json_body(app, req).await?;
    let (value, ttl) = parse(&body)?;
    let reg = app.limiter.put_override(rule, key, value, ttl)?;
    let now = app.limiter.clock.now_ms();
    Ok(json_response(
        StatusCode::OK,
        &OverrideJson::new(rule, key, &reg, now),
    ))
}

/// `GET /v1/overrides/{rule}/{key}`: the key's override in force.
#[utoipa::path(
    get,
    path = "/v1/overrides/{rule}/{key}",
    tag = "state",
    summary = "A key's override",
    params(
        ("rule" = String, Path, description = "the rule"),
        ("key" = String, Path, description = "the key"),
    ),
    responses(
        (status = 200, description = "the override in force", body = OverrideJson<'_>),
        (status = 400, description = "a wrong key", body = super::response::ErrorJson<'_>),
        (status = 404, description = "no such rule (`unknown_rule`), or the key has no override (`not_found`)", body = super::response::ErrorJson<'_>),
    ),
)]
pub(super) async fn get(
    State(app): State<Arc<App>>,
    Path((rule, key)): Path<(String, String)>,
) -> Response {
    let now = app.limiter.clock.now_ms();
    let resp = match app.limiter.get_override(&rule, &key) {
        Ok(reg) => json_response(StatusCode::OK, &OverrideJson::new(&rule, &key, &reg, now)),
        Err(e) => e.into_response(),
    };
    crate::metrics::http(Endpoint::Overrides, resp.status().as_u16());
    resp
}

/// `DELETE /v1/overrides/{rule}/{key}`: the rule's own figures apply again (`204`, whether or
/// not the key had an override).
#[utoipa::path(
    delete,
    path = "/v1/overrides/{rule}/{key}",
    tag = "admin",
    summary = "Remove a key's override",
    params(
        ("rule" = String, Path, description = "the rule"),
        ("key" = String, Path, description = "the key"),
    ),
    security((), ("bearer" = [])),
    responses(
        (status = 204, description = "the key has no override any more"),
        (status = 400, description = "a wrong key", body = super::response::ErrorJson<'_>),
        (status = 401, description = "`api.admin_token` is configured and the bearer token is missing or wrong", body = super::response::ErrorJson<'_>),
        (status = 404, description = "no such rule (`unknown_rule`)", body = super::response::ErrorJson<'_>),
    ),
)]
pub(super) async fn delete(
    State(app): State<Arc<App>>,
    Path((rule, key)): Path<(String, String)>,
    headers: axum::http::HeaderMap,
) -> Response {
    let resp = match app
        .authorize(&headers)
        .and_then(|()| app.limiter.delete_override(&rule, &key))
    {
        Ok(_) => StatusCode::NO_CONTENT.into_response(),
        Err(e) => e.into_response(),
    };
    crate::metrics::http(Endpoint::Overrides, resp.status().as_u16());
    resp
}

/// `GET /v1/overrides/{rule}`: the rule's overrides in force, by key.
#[utoipa::path(
    get,
    path = "/v1/overrides/{rule}",
    tag = "state",
    summary = "A rule's overrides",
    params(("rule" = String, Path, description = "the rule")),
    responses(
        (status = 200, description = "the rule's overrides in force", body = OverridesJson<'_>),
        (status = 404, description = "no such rule (`unknown_rule`)", body = super::response::ErrorJson<'_>),
    ),
)]
pub(super) async fn list(State(app): State<Arc<App>>, Path(rule): Path<String>) -> Response {
    let now = app.limiter.clock.now_ms();
    let resp = match app.limiter.list_overrides(&rule) {
        Ok(all) => json_response(
            StatusCode::OK,
            &OverridesJson {
                overrides: all
                    .iter()
                    .map(|(k, reg)| OverrideJson::new(&rule, k, reg, now))
                    .collect(),
            },
        ),
        Err(e) => e.into_response(),
    };
    crate::metrics::http(Endpoint::Overrides, resp.status().as_u16());
    resp
}
