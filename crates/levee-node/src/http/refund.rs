//! `POST /v1/refund`: gives tokens back (never above the limit); `200` with the new figures
//! and their rate-limit headers.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

use super::body::json_body;
use super::decision::DecisionJson;
use super::headers::rate_limit_headers;
use super::request::cost_of;
use super::response::json_response;
use crate::app::App;
use crate::limiter::{ApiError, CheckRef, Field};
use crate::metrics::Endpoint;

/// `POST /v1/refund`, counted.
pub(super) async fn refund(State(app): State<Arc<App>>, req: Request) -> Response {
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
