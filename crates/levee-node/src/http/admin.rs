//! The endpoints that need the admin bearer token when one is configured (`401
//! unauthorized` otherwise): `POST /admin/reload` and `DELETE /v1/usage/{rule}/{key}`.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use utoipa::ToSchema;

use super::response::json_response;
use crate::app::App;
use crate::metrics::Endpoint;

/// The answer of `DELETE /v1/usage/{rule}/{key}`.
#[derive(Serialize, ToSchema)]
#[schema(as = Reset)]
pub(super) struct ResetJson<'a> {
    /// The rule.
    rule: &'a str,
    /// The key.
    key: &'a str,
    /// Whether this node held anything for the key.
    reset: bool,
}

/// The answer of `POST /admin/reload`: `reloaded` and the number of `rules` in force, or the
/// refusal (`400`: `error` is `invalid_config`, `message` says why, `reloaded` is false).
#[derive(Serialize, ToSchema)]
#[schema(as = Reload)]
pub(super) struct ReloadJson {
    /// Whether the new configuration is in force.
    reloaded: bool,
    /// The number of rules in force (when reloaded).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(required = false, value_type = usize)]
    rules: Option<usize>,
    /// `invalid_config` (when refused).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(required = false, value_type = String)]
    error: Option<&'static str>,
    /// Why the configuration was refused.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(required = false, value_type = String)]
    message: Option<String>,
}

/// `DELETE /v1/usage/{rule}/{key}`: forgets the key on this node (every class bucket of it);
/// `reset` says whether anything was held. Counted.
#[utoipa::path(
    delete,
    path = "/v1/usage/{rule}/{key}",
    tag = "admin",
    summary = "Forget a key on this node",
    params(
        ("rule" = String, Path, description = "the rule"),
        ("key" = String, Path, description = "the key"),
    ),
    security((), ("bearer" = [])),
    responses(
        (status = 200, description = "forgotten", body = ResetJson<'_>),
        (status = 400, description = "a wrong key", body = super::response::ErrorJson<'_>),
        (status = 401, description = "`api.admin_token` is configured and the bearer token is missing or wrong", body = super::response::ErrorJson<'_>),
        (status = 404, description = "no such rule", body = super::response::ErrorJson<'_>),
    ),
)]
pub(super) async fn reset(
    State(app): State<Arc<App>>,
    Path((rule, key)): Path<(String, String)>,
    headers: HeaderMap,
) -> Response {
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

/// `POST /admin/reload`: re-reads the configuration file; `400 invalid_config` (and the
/// running configuration kept) when the new one is refused. Counted.
#[utoipa::path(
    post,
    path = "/admin/reload",
    tag = "admin",
    summary = "Re-read the configuration file",
    security((), ("bearer" = [])),
    responses(
        (status = 200, description = "reloaded", body = ReloadJson),
        (status = 400, description = "the new configuration was refused (`invalid_config`); the running one is kept", body = ReloadJson),
        (status = 401, description = "`api.admin_token` is configured and the bearer token is missing or wrong", body = super::response::ErrorJson<'_>),
    ),
)]
pub(super) async fn reload(State(app): State<Arc<App>>, headers: HeaderMap) -> Response {
    let resp = match app.authorize(&headers) {
        Err(e) => e.into_response(),
        Ok(()) => match app.reload("admin") {
            Ok(rules) => json_response(
                StatusCode::OK,
                &ReloadJson {
                    reloaded: true,
                    rules: Some(rules),
                    error: None,
                    message: None,
                },
            ),
            Err(e) => json_response(
                StatusCode::BAD_REQUEST,
                &ReloadJson {
                    reloaded: false,
                    rules: None,
                    error: Some("invalid_config"),
                    message: Some(e.to_string()),
                },
            ),
        },
    };
    crate::metrics::http(Endpoint::Reload, resp.status().as_u16());
    resp
}
