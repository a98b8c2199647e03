//! `POST /v1/check`: one decision, or an atomic `all` call over several rules and keys
//! (nothing is consumed unless every entry allows). `200` with the decision's JSON and its
//! rate-limit headers whenever a decision was made.

use std::sync::Arc;
use std::time::Instant;

use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use super::body::json_body;
use super::decision::DecisionJson;
use super::headers::rate_limit_headers;
use super::request::{CheckBody, cost_of};
use super::response::json_response;
use crate::app::App;
use crate::limiter::{AllEntry, AllOutcome, ApiError, CheckRef, Field};
use crate::metrics::Endpoint;

/// `POST /v1/check`, timed and counted.
pub(super) async fn check(State(app): State<Arc<App>>, req: Request) -> Response {
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

/// The answer to an `all` call: the decision and the binding rule's figures at the top, one
/// result per entry in `results`, and the binding rule's rate-limit headers.
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
