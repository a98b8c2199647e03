//! Probes and metrics (API.md "Operations"): `GET /healthz`, `GET /readyz`, `GET /metrics`.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::Response;
use serde::Serialize;
use utoipa::ToSchema;

use super::response::{error_response, json_response};
use crate::app::App;
use crate::limiter::ApiError;

/// The answer of `GET /healthz` (`ok`) and `GET /readyz` (`ready`).
#[derive(Serialize, ToSchema)]
#[schema(as = Health)]
pub(super) struct HealthJson {
    /// `ok` or `ready`.
    status: &'static str,
}

/// `GET /healthz`: `200` while the process serves.
#[utoipa::path(
    get,
    path = "/healthz",
    tag = "operations",
    summary = "Liveness",
    responses((status = 200, description = "the process serves", body = HealthJson)),
)]
pub(super) async fn healthz() -> Response {
    json_response(StatusCode::OK, &HealthJson { status: "ok" })
}

/// `GET /readyz`: `200` once the node is ready, `503 unavailable` while it is starting, once
/// it is shutting down, and once it is leaving the cluster (`POST /admin/leave`).
#[utoipa::path(
    get,
    path = "/readyz",
    tag = "operations",
    summary = "Readiness",
    responses(
        (status = 200, description = "ready", body = HealthJson),
        (status = 503, description = "starting, shutting down, or leaving the cluster", body = super::response::ErrorJson<'_>),
    ),
)]
pub(super) async fn readyz(State(app): State<Arc<App>>) -> Response {
    let leaving = app.replication.as_ref().is_some_and(|r| r.is_leaving());
    if app.ready.load(Ordering::Acquire) && !app.shutting_down.load(Ordering::Acquire) && !leaving {
        json_response(StatusCode::OK, &HealthJson { status: "ready" })
    } else {
        let why = if app.shutting_down.load(Ordering::Acquire) {
            "shutting down"
        } else if leaving {
            "leaving the cluster (POST /admin/leave): it owns no key; stop it, then mark it removed in every node's list"
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

/// `GET /metrics`: the Prometheus text exposition, with the key gauge and the eviction
/// counter brought up to date first.
#[utoipa::path(
    get,
    path = "/metrics",
    tag = "operations",
    summary = "Prometheus metrics",
    responses((status = 200, description = "the Prometheus text exposition", content_type = "text/plain; version=0.0.4; charset=utf-8", body = String)),
)]
pub(super) async fn metrics(State(app): State<Arc<App>>) -> Response {
    let store = app.limiter.store();
    app.limiter.metrics().keys.set(store.len() as f64);
    crate::metrics::evictions(store.evictions(), store.evictions_live());
    let body = app.prometheus.render();
    let mut resp = Response::new(Body::from(body));
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    resp
}
