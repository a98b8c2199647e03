//! One HTTP/1.1 request with a deadline, over a pooled hyper client.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde::de::DeserializeOwned;

use crate::{Decision, Error};

/// Headers of a node's answer kept with a [`Decision`].
const RATE_LIMIT_HEADERS: [&str; 6] = [
    "ratelimit-policy",
    "ratelimit",
    "x-ratelimit-limit",
    "x-ratelimit-remaining",
    "x-ratelimit-reset",
    "retry-after",
];

pub(crate) struct Transport {
    http: HyperClient<HttpConnector, Full<Bytes>>,
    timeout: Duration,
}

pub(crate) struct Reply {
    pub(crate) status: u16,
    headers: Vec<(String, String)>,
    body: Bytes,
}

impl Reply {
    pub(crate) fn json<T: DeserializeOwned>(&self) -> Result<T, Error> {
        serde_json::from_slice(&self.body).map_err(|e| Error::Decode(e.to_string()))
    }

    pub(crate) fn decision(self) -> Result<Decision, Error> {
        let mut d: Decision = self.json()?;
        d.headers = self.headers;
        Ok(d)
    }

    pub(crate) fn error(&self) -> Error {
        let v: serde_json::Value = serde_json::from_slice(&self.body).unwrap_or_default();
        let s = |f: &str| v.get(f).and_then(|x| x.as_str()).unwrap_or("").to_owned();
        Error::Api {
            status: self.status,
            code: s("error"),
            message: s("message"),
        }
    }
}

impl Transport {
    pub(crate) fn new(timeout: Duration) -> Transport {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(timeout));
        Transport {
            http: HyperClient::builder(TokioExecutor::new())
                .pool_idle_timeout(Duration::from_secs(30))
                .build(connector),
            timeout,
        }
    }

    /// `method` (`GET`, `POST`, `PUT`, `DELETE`) of `base` + `path`, with a JSON body if
    /// given, within the timeout and `wait` more (how long the node may wait for rights,
    /// `max_wait_ms`, before it answers).
    pub(crate) async fn request(
        &self,
        method: http::Method,
        base: &str,
        path: &str,
        body: Option<Vec<u8>>,
        token: Option<&str>,
        wait: Duration,
    ) -> Result<Reply, String> {
        let mut req = http::Request::builder()
            .uri(format!("{base}{path}"))
            .method(method);
        if body.is_some() {
            req = req.header(http::header::CONTENT_TYPE, "application/json");
        }
        if let Some(t) = token {
            req = req.header(http::header::AUTHORIZATION, format!("Bearer {t}"));
        }
        let req = req
            .body(Full::new(Bytes::from(body.unwrap_or_default())))
            .map_err(|e| e.to_string())?;
        let exchange = async {
            let resp = self.http.request(req).await.map_err(|e| e.to_string())?;
            let status = resp.status().as_u16();
            let headers = RATE_LIMIT_HEADERS
                .iter()
                .filter_map(|h| {
                    let v = resp.headers().get(*h)?.to_str().ok()?;
                    Some(((*h).to_owned(), v.to_owned()))
                })
                .collect();
            let body = resp
                .into_body()
                .collect()
                .await
                .map_err(|e| e.to_string())?
                .to_bytes();
            Ok(Reply {
                status,
                headers,
                body,
            })
        };
        let within = self.timeout.saturating_add(wait);
        match tokio::time::timeout(within, exchange).await {
            Ok(r) => r,
            Err(_) => Err(format!("no answer within {within:?}")),
        }
    }
}

/// `http://host:port` from `host:port` or a URL (a trailing `/` dropped).
pub(crate) fn base_url(s: &str) -> Result<String, Error> {
    let s = s.trim().trim_end_matches('/');
    let url = if s.starts_with("http://") {
        s.to_owned()
    } else if s.starts_with("https://") {
        return Err(Error::Config(format!(
            "{s}: https is not supported (plain HTTP only; see the crate's docs)"
        )));
    } else {
        format!("http://{s}")
    };
    url.parse::<http::Uri>()
        .map_err(|e| Error::Config(format!("{s}: {e}")))?;
    Ok(url)
}

/// A path segment, percent-encoded (everything but unreserved characters).
pub(crate) fn encode_segment(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}
