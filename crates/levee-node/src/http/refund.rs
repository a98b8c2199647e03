//! `POST /v1/refund`: gives tokens back (never above the limit); `200` with the new figures
//! and their rate-limit headers. Needs `api.refund_token` (else `api.admin_token`) when one is
//! configured; a retry with the same `idempotency_key` gets the first refund's answer and gives
//! nothing more back.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use utoipa::ToSchema;

use super::body::json_body;
use super::decision::DecisionJson;
use super::headers::rate_limit_headers;
use super::request::cost_of;
use super::response::json_response;
use crate::app::App;
use crate::limiter::{ApiError, CheckRef, Field, check_idempotency_key};
use crate::metrics::Endpoint;

/// The body of `POST /v1/refund`.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = Refund)]
pub(super) struct RefundBody {
    /// The rule.
    rule: String,
    /// The key: 1–512 bytes.
    #[schema(min_length = 1, max_length = 512)]
    key: String,
    /// Tokens to give back (default 1).
    #[schema(minimum = 0)]
    #[serde(default, deserialize_with = "super::request::integer")]
    cost: Option<i64>,
    /// The consumer class, for a rule with classes.
    class: Option<String>,
    /// A retry with the same value gets the first refund's answer and gives nothing more back;
    /// at most 256 bytes.
    #[schema(max_length = 256)]
    idempotency_key: Option<String>,
}

/// The fuzzing entry point of a `POST /v1/refund` body (`fuzz/`, target `http_bodies`):
/// decoded and its cost checked as the endpoint does.
#[doc(hidden)]
pub fn fuzz_refund_body(bytes: &[u8]) {
    if let Ok(body) = super::body::decode::<RefundBody>(bytes) {
        let _ = cost_of(body.cost, Field::Top);
        let _ = check_idempotency_key(Field::Top, body.idempotency_key.as_deref());
    }
}

/// `POST /v1/refund`, counted.
#[utoipa::path(
    post,
    path = "/v1/refund",
    tag = "decisions",
    summary = "Give tokens back (never above the limit)",
    request_body = RefundBody,
    security((), ("bearer" = [])),
    responses(
        (status = 200, description = "the key's figures after the refund", body = super::decision::DecisionJson<'_>, headers(
            ("RateLimit-Policy" = String, description = "`\"rule\";q=limit;w=window_secs`"),
            ("RateLimit" = String, description = "`\"rule\";r=remaining;t=reset_secs`"),
            ("X-RateLimit-Limit" = u64, description = "the limit"),
            ("X-RateLimit-Remaining" = u64, description = "the remaining tokens"),
            ("X-RateLimit-Reset" = u64, description = "seconds until the reset"),
            ("Retry-After" = u64, description = "on a denial: seconds to wait"),
        )),
        (status = 400, description = "a malformed body or a wrong field (the message names it)", body = super::response::ErrorJson<'_>),
        (status = 404, description = "no such rule", body = super::response::ErrorJson<'_>),
        (status = 413, description = "the body is over `api.max_body`", body = super::response::ErrorJson<'_>),
        (status = 415, description = "the body is not JSON", body = super::response::ErrorJson<'_>),
        (status = 401, description = "`api.refund_token` (else `api.admin_token`) is configured and the bearer token is missing or wrong", body = super::response::ErrorJson<'_>),
    ),
)]
pub(super) async fn refund(State(app): State<Arc<App>>, req: Request) -> Response {
    let result: Result<Response, ApiError> = async {
        app.authorize_refund(req.headers())?;
        let body: RefundBody = json_body(&app, req).await?;
        let cost = cost_of(body.cost, Field::Top)?;
        check_idempotency_key(Field::Top, body.idempotency_key.as_deref())?;
        let out = app
            .refund(CheckRef {
                rule: &body.rule,
                key: &body.key,
                cost,
                class: body.class.as_deref(),
                idempotency_key: body.idempotency_key.as_deref(),
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
