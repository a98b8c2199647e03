//! The harness's side of the HTTP API: one blocking request, a key's view, Prometheus samples.

use std::time::Duration;

use serde::Serialize;
use serde_json::Value;

/// An HTTP answer.
#[derive(Debug, Clone)]
pub struct Reply {
    /// The status code.
    pub status: u16,
    /// The body as text.
    pub body: String,
    /// The body as JSON (`Null` if it is not JSON).
    pub json: Value,
}

/// A keep-alive HTTP client whose requests give up after `timeout`.
pub fn agent(timeout: Duration) -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(timeout))
        .build()
        .into()
}

/// One HTTP exchange; `Err` if there was no answer.
pub fn http(
    agent: &ureq::Agent,
    method: &str,
    url: &str,
    body: Option<&str>,
) -> Result<Reply, String> {
    let req = ureq::http::Request::builder().method(method).uri(url);
    let result = match body {
        Some(b) => agent.run(
            req.header("content-type", "application/json")
                .body(b.as_bytes().to_vec())
                .map_err(|e| e.to_string())?,
        ),
        None => agent.run(req.body(()).map_err(|e| e.to_string())?),
    };
    let resp = result.map_err(|e| e.to_string())?;
    let status = resp.status().as_u16();
    let body = resp
        .into_body()
        .with_config()
        .limit(16 << 20)
        .read_to_string()
        .map_err(|e| e.to_string())?;
    let json = serde_json::from_str(&body).unwrap_or(Value::Null);
    Ok(Reply { status, body, json })
}

pub use levee_blackbox::{encode_segment, metric};

/// What a node's `GET /v1/usage/{rule}/{key}` says of a key: the global figure and the
/// per-region ones. Two nodes agree on a key when their views are equal.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct View {
    /// `used`.
    pub used: u64,
    /// `regions`, as JSON.
    pub regions: Value,
}

impl View {
    /// The view in a `/v1/usage` answer, if it is one.
    pub fn of(u: &Value) -> Option<View> {
        Some(View {
            used: u["used"].as_u64()?,
            regions: u["regions"].clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_a_sample_by_its_exact_label_set() {
        let text = "# HELP x\nlevee_transport_connections_total{peer=\"eu-2\",direction=\"outbound\"} 3\n\
                    levee_transport_connections_total{direction=\"inbound\",peer=\"eu-2\"} 1\nplain 7\n";
        let name = "levee_transport_connections_total";
        assert_eq!(
            metric(text, name, &[("direction", "outbound"), ("peer", "eu-2")]),
            Some(3.0)
        );
        assert_eq!(
            metric(text, name, &[("peer", "eu-2"), ("direction", "inbound")]),
            Some(1.0)
        );
        assert_eq!(metric(text, name, &[("peer", "eu-2")]), None);
        assert_eq!(metric(text, "plain", &[]), Some(7.0));
    }

    #[test]
    fn encodes_reserved_bytes() {
        assert_eq!(encode_segment("a b/ü"), "a%20b%2F%C3%BC");
    }
}
