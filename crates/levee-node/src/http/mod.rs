//! The HTTP API of `API.md`: the router, and the service of one connection that answers
//! `/v1/authz/{rule}` directly on a single node.
//!
//! Where each endpoint lives:
//!
//! | endpoint | file |
//! |---|---|
//! | `POST /v1/check` (one check, or an atomic `all` call) | `check.rs` |
//! | `POST /v1/check/batch` | `batch.rs` |
//! | `POST /v1/refund` | `refund.rs` |
//! | `ANY /v1/authz/{rule}`, routed and direct | `authz.rs` (the direct path is [`Api`], here) |
//! | `GET /v1/usage/{rule}/{key}`, `GET /v1/rules`, `GET /v1/cluster` | `reading.rs` |
//! | `DELETE /v1/usage/{rule}/{key}`, `POST /admin/reload` | `admin.rs` |
//! | `GET /healthz`, `GET /readyz`, `GET /metrics` | `operations.rs` |
//! | no such endpoint (404), wrong method (405) | here |
//!
//! And what they share, each used by the files above and using none of them: `body.rs`
//! (reading a JSON body), `request.rs` (what a check body says, and its validation),
//! `decision.rs` (the JSON of a decision), `headers.rs` (the rate-limit headers, from which
//! `authz.rs` builds its own header map), `response.rs` (JSON answers, errors included).
//!
//! Bodies are read up to `api.max_body` (413 beyond), must be JSON (415 otherwise), and are
//! decoded with the path of any wrong field in the error (400). Every error is
//! `{"error": code, "message": …}`. A routed request that takes longer than
//! `api.request_timeout` is answered `503 unavailable`.

mod admin;
mod authz;
mod batch;
mod body;
mod check;
mod decision;
mod headers;
mod operations;
mod reading;
mod refund;
mod request;
mod response;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{Method, StatusCode};
use axum::response::Response;
use axum::routing::{any, get, post};
use http_body_util::{Either, Full};
use hyper::body::Incoming;
use hyper_util::service::TowerToHyperService;

pub use body::decode;

use self::authz::{authz_done, authz_input, authz_response, direct_authz_rule};
use self::response::error_response;
use crate::app::App;
use crate::limiter::ApiError;

/// Builds the router of the API.
pub fn router(app: Arc<App>) -> Router {
    Router::new()
        .route("/v1/check", post(check::check))
        .route("/v1/check/batch", post(batch::batch))
        .route("/v1/refund", post(refund::refund))
        .route("/v1/authz/{rule}", any(authz::authz))
        .route(
            "/v1/usage/{rule}/{key}",
            get(reading::usage).delete(admin::reset),
        )
        .route("/v1/rules", get(reading::rules))
        .route("/v1/cluster", get(reading::cluster))
        .route("/healthz", get(operations::healthz))
        .route("/readyz", get(operations::readyz))
        .route("/metrics", get(operations::metrics))
        .route("/admin/reload", post(admin::reload))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(axum::middleware::from_fn_with_state(
            Arc::clone(&app),
            guard,
        ))
        .with_state(app)
}

/// The time limit of a routed request: `503 unavailable` when the answer is not ready within
/// `api.request_timeout`. (A node that is starting or shutting down still answers; only
/// `/readyz` says so.)
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
