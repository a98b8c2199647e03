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
//! | `POST /admin/leave` | `leave.rs` |
//! | `PUT/GET/DELETE /v1/overrides/{rule}/{key}`, `GET /v1/overrides/{rule}` | `overrides.rs` |
//! | `GET /healthz`, `GET /readyz`, `GET /metrics` | `operations.rs` |
//! | `GET /openapi.json` (the OpenAPI 3.1 document of all of these) | `openapi.rs` |
//! | `GET /` (the status page), `GET /v1/status` | `status.rs` |
//! | no such endpoint (404), wrong method (405) | here |
//!
//! And what they share, each used by the files above and using none of them: `body.rs`
//! (reading a JSON body), `request.rs` (what a check body says, and its validation),
//! `decision.rs` (the JSON of a decision), `headers.rs` (the rate-limit headers, from which
//! `authz.rs` builds its own header map), `response.rs` (JSON answers, errors included),
//! `leftover.rs` (what a handler that answers early leaves of a body is read before the
//! answer, so the connection stays usable).
//!
//! Bodies are read up to `api.max_body` (413 beyond), must be JSON (415 otherwise), and are
//! decoded with the path of any wrong field in the error (400). Every error is
//! `{"error": code, "message": …}`: an extractor's plain-text rejection is rewritten so by
//! [`json_errors`], and hyper's own answers to requests it cannot parse (400, 414, 431) by
//! the server's connection stream (`server.rs`). A routed request that takes longer than
//! `api.request_timeout` is answered `503 unavailable`.

mod admin;
mod authz;
mod batch;
mod body;
mod check;
mod decision;
mod headers;
mod key_from;
mod leave;
mod leftover;
mod openapi;
mod operations;
mod overrides;
mod reading;
mod refund;
mod request;
mod response;
mod status;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::task::{Context, Poll};
use std::time::Instant;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{Method, StatusCode};
use axum::response::Response;
use axum::routing::{MethodRouter, any, get, post};
use http_body_util::{Either, Full};
use hyper::body::{Body as _, Incoming};
use hyper_util::service::TowerToHyperService;

pub use body::decode;
pub use openapi::document as openapi_document;
#[doc(hidden)]
pub use {batch::fuzz_batch_body, refund::fuzz_refund_body, request::fuzz_check_body};

use self::authz::{
    OwnedAuthz, authz_done, authz_hold, authz_input, authz_response, direct_authz_rule,
};
use self::response::error_response;
use crate::app::{App, Here};
use crate::limiter::{ApiError, Outcome};
use levee_core::NodeIdx;

/// Every route of the API: its path (axum's syntax, the OpenAPI document's too) and its
/// handlers. [`router`] is built from this table, and the tests compare the OpenAPI document
/// ([`openapi_document`]) with it, path by path and method by method.
fn routes() -> Vec<(&'static str, MethodRouter<Arc<App>>)> {
    vec![
        ("/v1/check", post(check::check)),
        ("/v1/check/batch", post(batch::batch)),
        ("/v1/refund", post(refund::refund)),
        ("/v1/authz/{rule}", any(authz::authz)),
        (
            "/v1/usage/{rule}/{key}",
            get(reading::usage).delete(admin::reset),
        ),
        ("/v1/rules", get(reading::rules)),
        ("/v1/cluster", get(reading::cluster)),
        ("/v1/status", get(status::status)),
        ("/healthz", get(operations::healthz)),
        ("/readyz", get(operations::readyz)),
        ("/metrics", get(operations::metrics)),
        ("/admin/reload", post(admin::reload)),
        ("/admin/leave", post(leave::leave)),
        (
            "/v1/overrides/{rule}/{key}",
            get(overrides::get)
                .put(overrides::put)
                .delete(overrides::delete),
        ),
        ("/v1/overrides/{rule}", get(overrides::list)),
        ("/openapi.json", get(openapi::openapi_json)),
        ("/", get(status::page)),
    ]
}

/// The paths of every route, as [`router`] serves them.
pub fn route_paths() -> Vec<&'static str> {
    routes().into_iter().map(|(path, _)| path).collect()
}

/// Builds the router of the API.
pub fn router(app: Arc<App>) -> Router {
    status::start_clock();
    routes()
        .into_iter()
        .fold(Router::new(), |r, (path, handlers)| r.route(path, handlers))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(axum::middleware::from_fn_with_state(
            Arc::clone(&app),
            guard,
        ))
        .layer(axum::middleware::map_response(json_errors))
        .with_state(app)
}

/// Every error answer is JSON: one that is not (an extractor's rejection — a path segment
/// that is not UTF-8 once percent-decoded, a query string that cannot be read) is rewritten
/// into `{"error": code, "message": …}` with its text as the message.
async fn json_errors(resp: Response) -> Response {
    let status = resp.status();
    let is_json = resp
        .headers()
        .get(axum::http::header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
    if !(status.is_client_error() || status.is_server_error()) || is_json {
        return resp;
    }
    let (parts, body) = resp.into_parts();
    let text = axum::body::to_bytes(body, 64 * 1024)
        .await
        .map(|b| String::from_utf8_lossy(&b).trim().to_owned())
        .unwrap_or_default();
    let code = match status.as_u16() {
        400 => "invalid_request",
        401 => "unauthorized",
        404 => "not_found",
        405 => "method_not_allowed",
        413 => "payload_too_large",
        415 => "unsupported_media_type",
        503 => "unavailable",
        s if s >= 500 => "internal",
        _ => "invalid_request",
    };
    let message = if text.is_empty() {
        status
            .canonical_reason()
            .unwrap_or("the request was refused")
            .to_owned()
    } else {
        text
    };
    let mut out = error_response(&ApiError {
        status: status.as_u16(),
        code,
        message,
    });
    // Keep what else the answer said (`Allow`, `Retry-After` …), but not its length or type.
    for (name, value) in &parts.headers {
        if name != axum::http::header::CONTENT_TYPE && name != axum::http::header::CONTENT_LENGTH {
            out.headers_mut().insert(name.clone(), value.clone());
        }
    }
    out
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

/// The HTTP service of one connection. `/v1/authz/{rule}` is answered directly — no router,
/// no extractors, the key borrowed from its header — since it is what gateways call on
/// every request they pass: on this thread when it can be decided here (a single node; in a
/// cluster, a key this node owns, or a node alone), else by asking the key's owner in this
/// region. Everything else (and `/v1/authz` with a query string or a percent-encoded rule
/// name, or a caller that may wait for rights in a cluster) goes through [`router`].
#[derive(Clone)]
pub struct Api {
    app: Arc<App>,
    router: TowerToHyperService<Router>,
    peer: SocketAddr,
    calls: Option<Arc<AtomicU32>>,
}

impl Api {
    /// The service for a connection from `peer`.
    pub fn new(app: Arc<App>, router: Router, peer: SocketAddr) -> Api {
        Api {
            app,
            router: TowerToHyperService::new(router),
            peer,
            calls: None,
        }
    }

    /// The same service, counting its calls in `calls` (the server tells the answers hyper
    /// makes by itself from the service's by it).
    pub fn counting(self, calls: Arc<AtomicU32>) -> Api {
        Api {
            calls: Some(calls),
            ..self
        }
    }

    /// The direct path's answer to an `/v1/authz` check decided (or refused) on this thread.
    fn answer_authz(
        &self,
        rule: &str,
        started: Instant,
        decided: Result<Outcome, ApiError>,
    ) -> ApiFuture {
        match direct_answer(&self.app, rule, started, decided) {
            (resp, None) => {
                authz_done(&self.app, started, resp.status());
                ApiFuture::Ready(Some(resp))
            }
            // A leaky bucket's delay: the answer waits, off this call.
            (resp, Some(hold)) => {
                let app = Arc::clone(&self.app);
                ApiFuture::Routed(Box::pin(async move {
                    tokio::time::sleep(hold).await;
                    authz_done(&app, started, resp.status());
                    resp
                }))
            }
        }
    }

    /// The direct path's answer to an `/v1/authz` check whose key a region-mate owns: asked
    /// of the owner (no router, the request read once), answered when it decides.
    fn answer_authz_at_owner(
        &self,
        check: OwnedAuthz,
        owner: NodeIdx,
        started: Instant,
    ) -> ApiFuture {
        let app = Arc::clone(&self.app);
        ApiFuture::Routed(Box::pin(async move {
            let decided = app.check_at_owner(check.check(), owner).await;
            let (resp, hold) = direct_answer(&app, check.rule(), started, decided);
            if let Some(hold) = hold {
                tokio::time::sleep(hold).await;
            }
            authz_done(&app, started, resp.status());
            resp
        }))
    }
}

/// The answer to a direct `/v1/authz` check, and how long to hold it (a leaky bucket's
/// delay).
fn direct_answer(
    app: &App,
    rule: &str,
    started: Instant,
    decided: Result<Outcome, ApiError>,
) -> (Response<ApiBody>, Option<std::time::Duration>) {
    match decided {
        Ok(out) => (
            authz_response(rule, &out, StatusCode::TOO_MANY_REQUESTS).map(Either::Left),
            authz_hold(app, started, &out),
        ),
        Err(e) => (error_response(&e).map(Either::Right), None),
    }
}

impl hyper::service::Service<Request<Incoming>> for Api {
    type Response = Response<ApiBody>;
    type Error = Infallible;
    type Future = ApiFuture;

    fn call(&self, mut req: Request<Incoming>) -> ApiFuture {
        if let Some(calls) = &self.calls {
            calls.fetch_add(1, Ordering::Relaxed);
        }
        // A request with a body (which `/v1/authz` never reads) goes through the router, which
        // reads what a handler left of it before answering.
        let bodiless = req.body().is_end_stream();
        if bodiless && let Some(rule) = direct_authz_rule(req.uri()) {
            let started = Instant::now();
            match authz_input(
                &self.app,
                rule,
                self.peer,
                (req.method(), req.uri(), req.headers()),
            ) {
                // In a cluster a caller that may wait for rights goes through the router.
                Ok(input) if input.max_wait_ms > 0 && self.app.replication.is_some() => {}
                Ok(input) => {
                    return match self.app.check_here(input.check(rule)) {
                        Here::Decided(out) => self.answer_authz(rule, started, out),
                        Here::AtOwner(owner) => {
                            self.answer_authz_at_owner(input.to_owned_check(rule), owner, started)
                        }
                    };
                }
                Err(e) => return self.answer_authz(rule, started, Err(e)),
            }
        }
        req.extensions_mut().insert(ConnectInfo(self.peer));
        // Only a request with a body needs somewhere to leave it, and the app to bound the
        // wait for its rest.
        let left = (!bodiless).then(|| (leftover::Leftover::default(), Arc::clone(&self.app)));
        let tracked = left.as_ref().map(|(l, _)| Arc::clone(l));
        let routed = self
            .router
            .call(req.map(|body| leftover::Tracked::new(body, tracked)));
        ApiFuture::Routed(Box::pin(async move {
            let mut resp = match routed.await {
                Ok(resp) => resp,
                Err(never) => match never {},
            };
            let rest = left.and_then(|(l, app)| Some((l.lock().take()?, app)));
            if let Some((rest, app)) = rest
                && !leftover::drain(rest, app.max_body(), app.request_timeout()).await
            {
                resp.headers_mut().insert(
                    axum::http::header::CONNECTION,
                    axum::http::HeaderValue::from_static("close"),
                );
            }
            resp.map(Either::Right)
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
