//! `POST /v1/check`: one decision, or an atomic `all` call over several rules and keys
//! (nothing is consumed unless every entry allows). `200` with the decision's JSON and its
//! rate-limit headers whenever a decision was made.

use std::sync::Arc;
use std::time::Instant;

use super::body::json_body;
use super::decision::{AllJson, CheckJson, DecisionJson};
use super::headers::rate_limit_headers;
use super::request::{CheckBody, cost_of};
use super::response::json_response;
use crate::app::App;
use crate::limiter::{AllEntry, AllOutcome, ApiError, CheckRef, Field, check_idempotency_key};
use crate::metrics::Endpoint;
use crate::wait::max_wait_of;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

/// `POST /v1/check`, timed and counted.
#[utoipa::path(
    post,
    path = "/v1/check",
    tag = "decisions",
    summary = "One decision, or an atomic `all` call",
    request_body = super::request::CheckRequest,
    responses(
        (status = 200, description = "a decision was made (allowed or not)", body = CheckJson<'_>, headers(
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
    ),
)]
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
    check_idempotency_key(Field::Top, body.idempotency_key.as_deref())?;
    let max_wait_ms = max_wait_of(body.max_wait_ms, Field::Top)?;
    if let Some(all) = body.all {
        if body.rule.is_some() || body.key.is_some() || body.class.is_some() {
            return Err(ApiError::invalid(
                "all: give either `all` or `rule` and `key`, not both",
            ));
        }
        if body.max_wait_ms.is_some() {
            return Err(ApiError::invalid(
                "max_wait_ms: an atomic `all` call is answered at once; give max_wait_ms to \
                 single checks (or to each check of a batch)",
            ));
        }
        if all.len() > app.max_batch() {
            return Err(ApiError::invalid(format!(
                "all: {} entries, at most {} allowed",
                all.len(),
                app.max_batch()
            )));
        }
        let out = app
            .check_all(&all, cost, body.dry_run, body.idempotency_key.as_deref())
            .await?;
        return Ok(all_response(&all, &out));
    }
    let rule = body
        .rule
        .ok_or_else(|| ApiError::invalid("rule: missing field"))?;
    let key = body
        .key
        .ok_or_else(|| ApiError::invalid("key: missing field"))?;
    let req = CheckRef {
        rule: &rule,
        key: &key,
        cost,
        class: body.class.as_deref(),
        idempotency_key: body.idempotency_key.as_deref(),
        dry_run: body.dry_run,
    };
    let (out, waited) = app.check_waiting(req, max_wait_ms).await?;
    let mut resp = json_response(
        StatusCode::OK,
        &CheckJson::One(
            DecisionJson::new(&rule, &key, &out).waited(body.max_wait_ms.map(|_| waited)),
        ),
    );
    rate_limit_headers(resp.headers_mut(), &rule, &out);
    Ok(resp)
}

/// The answer to an `all` call: the decision and the binding rule's figures at the top, one
/// result per entry in `results`, and the binding rule's rate-limit headers.
fn all_response(entries: &[AllEntry], out: &AllOutcome) -> Response {
    let binding = &entries[out.binding];
    let mut shown = out.results[out.binding];
    shown.decision.allowed = out.allowed;
    // The call proceeds when its slowest rule lets it: the longest delay of any entry.
    if let Some(delay) = out.results.iter().filter_map(|o| o.delay_ms()).max() {
        shown.shaped = true;
        shown.decision.delay_ms = delay;
    }
    let top = DecisionJson::new(&binding.rule, &binding.key, &shown);
    let results = entries
        .iter()
        .zip(&out.results)
        .map(|(e, o)| DecisionJson::new(&e.rule, &e.key, o))
        .collect();
    let mut resp = json_response(StatusCode::OK, &CheckJson::All(AllJson { top, results }));
    rate_limit_headers(resp.headers_mut(), &binding.rule, &shown);
    resp
}
