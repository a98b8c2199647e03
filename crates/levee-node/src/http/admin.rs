//! The endpoints that need the admin bearer token when one is configured (`401
//! unauthorized` otherwise): `POST /admin/reload` and `DELETE /v1/usage/{rule}/{key}`.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use super::response::json_response;
use crate::app::App;
use crate::metrics::Endpoint;

/// `DELETE /v1/usage/{rule}/{key}`: forgets the key on this node (every class bucket of it);
/// `reset` says whether anything was held. Counted.
pub(super) async fn reset(
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

/// `POST /admin/reload`: re-reads the configuration file; `400 invalid_config` (and the
/// running configuration kept) when the new one is refused. Counted.
pub(super) async fn reload(State(app): State<Arc<App>>, headers: HeaderMap) -> Response {
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
