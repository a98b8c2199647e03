//! `POST /admin/leave` (admin token): the node hands every right it holds over before it is
//! removed from the list (docs/membership.md, "Leaving").

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::response::json_response;
use crate::app::App;
use crate::limiter::ApiError;
use crate::metrics::Endpoint;

/// How long `POST /admin/leave` waits by default for the node to hold nothing.
pub(super) const LEAVE_WAIT_DEFAULT_MS: u64 = 30_000;
/// The longest `wait_ms` accepted.
pub(super) const LEAVE_WAIT_MAX_MS: u64 = 600_000;

/// The query of `POST /admin/leave`.
#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(super) struct LeaveQuery {
    /// How long to wait for the node to hold nothing, in ms (default 30000, at most 600000).
    /// The node keeps leaving after the answer either way.
    #[param(minimum = 0, maximum = 600_000)]
    wait_ms: Option<u64>,
}

/// The answer of `POST /admin/leave`.
#[derive(Serialize, ToSchema)]
#[schema(as = Leave)]
pub(super) struct LeaveJson {
    /// Every peer it hears knows this node is leaving and it holds nothing beyond what it
    /// used: it can be stopped and removed from the list with nothing lost.
    left: bool,
    /// Rights (tokens) given to other nodes since it started leaving.
    handed_over: u64,
    /// Keys it still holds rights of (0 once left).
    keys_holding: usize,
    /// Rights it still holds beyond what it used (0 once left).
    holding: u64,
    /// The peers it hears that have not yet said they know it is leaving.
    not_acknowledged: Vec<String>,
    /// The peers it does not hear (none within `cluster.suspect_after`): not waited for. They
    /// learn of the leave, or of the removal, when they are heard again; what they give this
    /// node before that is out of service until the removal's growth applies.
    unreachable: Vec<String>,
    /// What to do next.
    message: String,
}

/// `POST /admin/leave`: this node stops owning keys (its region-mates take them over, or
/// other regions' nodes if it is the last of its region), tells its peers, and gives every
/// right it holds to the keys' owners. `200` with `left: true` once every peer knows and it
/// holds nothing; `202` with `left: false` and what it still holds if that takes longer than
/// `wait_ms` (it goes on leaving: ask again). A node leaves until it restarts. Counted.
#[utoipa::path(
    post,
    path = "/admin/leave",
    tag = "admin",
    summary = "Hand every right over before being removed from the list",
    params(LeaveQuery),
    security((), ("bearer" = [])),
    responses(
        (status = 200, description = "left: it holds nothing and every peer knows", body = LeaveJson),
        (status = 202, description = "still leaving after `wait_ms` (it goes on): what it still holds, who has not acknowledged", body = LeaveJson),
        (status = 400, description = "a wrong `wait_ms`", body = super::response::ErrorJson<'_>),
        (status = 401, description = "`api.admin_token` is configured and the bearer token is missing or wrong", body = super::response::ErrorJson<'_>),
        (status = 409, description = "`not_clustered`: the node runs alone, there is nobody to hand rights to", body = super::response::ErrorJson<'_>),
    ),
)]
pub(super) async fn leave(
    State(app): State<Arc<App>>,
    Query(q): Query<LeaveQuery>,
    headers: HeaderMap,
) -> Response {
    let resp = match leave_checked(&app, &q, &headers).await {
        Ok((status, body)) => json_response(status, &body),
        Err(e) => e.into_response(),
    };
    crate::metrics::http(Endpoint::Leave, resp.status().as_u16());
    resp
}

async fn leave_checked(
    app: &Arc<App>,
    q: &LeaveQuery,
    headers: &HeaderMap,
) -> Result<(StatusCode, LeaveJson), ApiError> {
    app.authorize(headers)?;
    let wait_ms = q.wait_ms.unwrap_or(LEAVE_WAIT_DEFAULT_MS);
    if wait_ms > LEAVE_WAIT_MAX_MS {
        return Err(ApiError::invalid(format!(
            "wait_ms: {wait_ms} is more than {LEAVE_WAIT_MAX_MS} (the node keeps leaving after the answer: ask again)"
        )));
    }
    let Some(repl) = app.replication.as_ref() else {
        return Err(ApiError {
            status: 409,
            code: "not_clustered",
            message:
                "this node runs alone (no [cluster] section): there is nobody to hand its rights to"
                    .into(),
        });
    };
    let p = repl
        .leave(app.as_ref(), Duration::from_millis(wait_ms))
        .await;
    let (status, message) = if p.done && p.unreachable.is_empty() {
        (
            StatusCode::OK,
            "this node holds nothing and every peer knows it is leaving: stop it, then mark it removed (removed = true) in every node's list".to_owned(),
        )
    } else if p.done {
        (
            StatusCode::OK,
            format!(
                "this node holds nothing and every peer it hears knows it is leaving: stop it, then mark it removed (removed = true) in every node's list; {} not heard, not told: they learn of it when heard again",
                p.unreachable.join(", ")
            ),
        )
    } else if !p.not_acknowledged.is_empty() {
        (
            StatusCode::ACCEPTED,
            format!(
                "still leaving: {} have not acknowledged it (are they reachable?); it goes on, ask again",
                p.not_acknowledged.join(", ")
            ),
        )
    } else {
        (
            StatusCode::ACCEPTED,
            format!(
                "still leaving: it holds {} rights of {} keys, handed over at every gossip interval; it goes on, ask again",
                p.holding, p.keys_holding
            ),
        )
    };
    Ok((
        status,
        LeaveJson {
            left: p.done,
            handed_over: p.handed_over,
            keys_holding: p.keys_holding,
            holding: p.holding,
            not_acknowledged: p.not_acknowledged,
            unreachable: p.unreachable,
            message,
        },
    ))
}
