//! A `tower::Layer` that rate-limits an HTTP service (axum, hyper) through Levee.
//!
//! ```no_run
//! # async fn f() -> Result<(), levee_client::Error> {
//! use levee_client::{Client, layer::RateLimitLayer};
//! let client = Client::builder().node("127.0.0.1:8750").build()?;
//! // 1,000 searches a minute per tenant, the tenant from `X-Tenant`.
//! let layer = RateLimitLayer::new(client, "search-per-minute", |req: &http::Request<String>| {
//!     req.headers().get("x-tenant")?.to_str().ok().map(str::to_owned)
//! });
//! // axum: Router::new().route(...).layer(layer)
//! # let _ = layer; Ok(()) }
//! ```
//!
//! Allowed: the inner service answers, with the node's rate-limit headers added. Denied:
//! `429` with the headers, `Retry-After` and `{"error":"rate_limited","retry_after_ms":N}`,
//! and the inner service is not called. No key in the request: `400
//! {"error":"missing_key"}`. The node unreachable: as the client's [`crate::Fallback`] says;
//! with [`crate::Fallback::Error`], `503 {"error":"unavailable"}`.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{HeaderName, HeaderValue, Request, Response, StatusCode};
use tower_layer::Layer;
use tower_service::Service;

use crate::{Check, Client, Decision};

/// Rate-limits a service by a key taken from each request with `F`.
pub struct RateLimitLayer<F> {
    client: Client,
    rule: Arc<str>,
    key: Arc<F>,
}

impl<F> Clone for RateLimitLayer<F> {
    fn clone(&self) -> Self {
        RateLimitLayer {
            client: self.client.clone(),
            rule: self.rule.clone(),
            key: self.key.clone(),
        }
    }
}

impl<F> RateLimitLayer<F> {
    /// Each request is checked against `rule` with the key `key(&request)` returns.
    pub fn new(client: Client, rule: impl Into<Arc<str>>, key: F) -> RateLimitLayer<F> {
        RateLimitLayer {
            client,
            rule: rule.into(),
            key: Arc::new(key),
        }
    }
}

impl<S, F> Layer<S> for RateLimitLayer<F> {
    type Service = RateLimit<S, F>;

    fn layer(&self, inner: S) -> RateLimit<S, F> {
        RateLimit {
            inner,
            layer: self.clone(),
        }
    }
}

/// The service of [`RateLimitLayer`].
pub struct RateLimit<S, F> {
    inner: S,
    layer: RateLimitLayer<F>,
}

impl<S: Clone, F> Clone for RateLimit<S, F> {
    fn clone(&self) -> Self {
        RateLimit {
            inner: self.inner.clone(),
            layer: self.layer.clone(),
        }
    }
}

fn json<B: From<String>>(status: StatusCode, body: String) -> Response<B> {
    let mut resp = Response::new(B::from(body));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

fn add_headers<B>(resp: &mut Response<B>, d: &Decision) {
    for (name, value) in &d.headers {
        if name == "retry-after" && d.allowed {
            continue;
        }
        if let (Ok(n), Ok(v)) = (
            HeaderName::try_from(name.as_str()),
            HeaderValue::try_from(value.as_str()),
        ) {
            resp.headers_mut().insert(n, v);
        }
    }
}

impl<S, F, ReqB, ResB> Service<Request<ReqB>> for RateLimit<S, F>
where
    S: Service<Request<ReqB>, Response = Response<ResB>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    F: Fn(&Request<ReqB>) -> Option<String> + Send + Sync + 'static,
    ReqB: Send + 'static,
    ResB: From<String> + Send + 'static,
{
    type Response = Response<ResB>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Response<ResB>, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqB>) -> Self::Future {
        // The service that was polled ready answers this request; a clone takes its place.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let layer = self.layer.clone();
        Box::pin(async move {
            let Some(key) = (layer.key)(&req) else {
                return Ok(json(
                    StatusCode::BAD_REQUEST,
                    serde_json::json!({
                        "error": "missing_key",
                        "message": format!("no key for rule {} in the request", layer.rule),
                    })
                    .to_string(),
                ));
            };
            let decision = match layer.client.check(&Check::new(&*layer.rule, key)).await {
                Ok(d) => d,
                Err(e) => {
                    return Ok(json(
                        StatusCode::SERVICE_UNAVAILABLE,
                        serde_json::json!({"error": "unavailable", "message": e.to_string()})
                            .to_string(),
                    ));
                }
            };
            if !decision.allowed {
                let mut resp = json(
                    StatusCode::TOO_MANY_REQUESTS,
                    format!(
                        r#"{{"error":"rate_limited","retry_after_ms":{}}}"#,
                        decision.retry_after_ms
                    ),
                );
                add_headers(&mut resp, &decision);
                if !resp.headers().contains_key(http::header::RETRY_AFTER) {
                    let secs = decision.retry_after_ms.div_ceil(1000).max(1);
                    resp.headers_mut()
                        .insert(http::header::RETRY_AFTER, HeaderValue::from(secs));
                }
                return Ok(resp);
            }
            let mut resp = inner.call(req).await?;
            add_headers(&mut resp, &decision);
            Ok(resp)
        })
    }
}
