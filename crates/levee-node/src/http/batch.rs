//! `POST /v1/check/batch`: many independent decisions, in the order given, `{"results":[…]}`.
//!
//! Two ways to read a body. The fast one borrows every string from the body and serializes the
//! answer by hand; any body it cannot read (a malformed or wrongly typed field, an escaped
//! string, a duplicate field …) goes through the slow one, owned values and
//! `serde_path_to_error`, which is the reference for what a body means and how a wrong one is
//! explained. Both validate each check with [`batch_check`], so they give the same messages.

use std::sync::Arc;
use std::time::Instant;

use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

use super::body::{ObjectOnly, decode, json_bytes, strip_position};
use super::request::{CheckBody, batch_check};
use super::response::bytes_response;
use crate::app::App;
use crate::limiter::{ApiError, CheckRef, Outcome};
use crate::metrics::Endpoint;

/// One check of a batch as the fast path reads it: strings borrowed from the body. A string
/// with an escape cannot be borrowed; such a body (like any body the fast path refuses) goes
/// through [`batch_checks_slow`], which decides what the answer is.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FastCheck<'a> {
    #[serde(borrow)]
    rule: Option<&'a str>,
    #[serde(borrow)]
    key: Option<&'a str>,
    cost: Option<i64>,
    #[serde(borrow)]
    class: Option<&'a str>,
    #[serde(borrow)]
    idempotency_key: Option<&'a str>,
    #[serde(default)]
    dry_run: bool,
    all: Option<serde::de::IgnoredAny>,
}

/// The body of `POST /v1/check/batch`, borrowed.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FastBatch<'a> {
    #[serde(borrow)]
    checks: Vec<ObjectOnly<FastCheck<'a>>>,
}

/// The checks of a batch body, borrowed from it; `None` when the fast path cannot read the
/// body (a malformed or wrongly typed field, an escaped string, a duplicate field …).
///
/// `#[inline]`: the handler that calls it is compiled into axum's `Handler` glue, in another
/// codegen unit; this keeps it inlined there, as it was when everything lived in one file.
#[inline]
fn batch_checks_fast(bytes: &[u8]) -> Option<Vec<FastCheck<'_>>> {
    if bytes.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return None;
    }
    let body: FastBatch<'_> = serde_json::from_slice(bytes).ok()?;
    Some(body.checks.into_iter().map(|c| c.0).collect())
}

/// The checks of a batch body as owned values, through `serde_json::Value` and
/// `serde_path_to_error`: slower, and the reference for what a body means and how a wrong
/// one is explained (the path of the field, the first wrong check first).
fn batch_checks_slow(app: &App, bytes: &[u8]) -> Result<Vec<CheckBody>, ApiError> {
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct BatchBody {
        checks: Vec<serde_json::Value>,
    }
    let body: BatchBody = decode(bytes)?;
    if body.checks.len() > app.max_batch() {
        return Err(too_many_checks(app, body.checks.len()));
    }
    let mut checks = Vec::with_capacity(body.checks.len());
    for (i, v) in body.checks.into_iter().enumerate() {
        if !v.is_object() {
            return Err(ApiError::invalid(format!(
                "checks[{i}]: must be a JSON object"
            )));
        }
        let c: CheckBody = serde_path_to_error::deserialize(v).map_err(|e| {
            let path = e.path().to_string();
            let msg = strip_position(&e.into_inner().to_string());
            if path == "." {
                ApiError::invalid(format!("checks[{i}]: {msg}"))
            } else {
                ApiError::invalid(format!("checks[{i}].{path}: {msg}"))
            }
        })?;
        c.check_ref(i)?;
        checks.push(c);
    }
    Ok(checks)
}

fn too_many_checks(app: &App, n: usize) -> ApiError {
    ApiError::invalid(format!(
        "checks: {n} checks, at most {} allowed",
        app.max_batch()
    ))
}

/// Writes the answer to a batch, `{"results":[…]}`, the same bytes `serde_json` would write
/// for [`DecisionJson`](super::decision::DecisionJson)s, straight into `out`. `escaped`:
/// whether rule and key strings may need escaping; strings the fast path borrowed from the
/// body never do (they held no backslash, and JSON forbids raw control characters and quotes
/// in strings).
fn write_batch(out: &mut Vec<u8>, checks: &[CheckRef<'_>], outs: &[Outcome], escaped: bool) {
    let mut n = itoa::Buffer::new();
    let string = |out: &mut Vec<u8>, s: &str| {
        if escaped {
            // Writing into a Vec cannot fail.
            let _ = serde_json::to_writer(&mut *out, s);
        } else {
            out.push(b'"');
            out.extend_from_slice(s.as_bytes());
            out.push(b'"');
        }
    };
    out.extend_from_slice(b"{\"results\":[");
    for (i, (c, o)) in checks.iter().zip(outs).enumerate() {
        let d = &o.decision;
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(if d.allowed {
            b"{\"allowed\":true,\"rule\":"
        } else {
            b"{\"allowed\":false,\"rule\":"
        });
        string(out, c.rule);
        out.extend_from_slice(b",\"key\":");
        string(out, c.key);
        for (name, v) in [
            (&b",\"limit\":"[..], d.limit),
            (b",\"remaining\":", d.remaining),
            (b",\"reset_after_ms\":", d.reset_after_ms),
            (b",\"retry_after_ms\":", d.retry_after_ms),
        ] {
            out.extend_from_slice(name);
            out.extend_from_slice(n.format(v).as_bytes());
        }
        out.extend_from_slice(b",\"mode\":\"");
        out.extend_from_slice(d.mode.as_str().as_bytes());
        out.extend_from_slice(if d.degraded {
            b"\",\"degraded\":true"
        } else {
            b"\",\"degraded\":false"
        });
        if d.mode == levee_core::RuleMode::Shadow {
            out.extend_from_slice(if d.would_allow {
                b",\"would_allow\":true"
            } else {
                b",\"would_allow\":false"
            });
        }
        out.push(b'}');
    }
    out.extend_from_slice(b"]}");
}

/// `POST /v1/check/batch`, timed and counted.
pub(super) async fn batch(State(app): State<Arc<App>>, req: Request) -> Response {
    let started = Instant::now();
    let result: Result<Response, ApiError> = async {
        let bytes = json_bytes(&app, req).await?;
        let slow;
        let escaped;
        let checks: Vec<CheckRef<'_>> = match batch_checks_fast(&bytes) {
            Some(fast) => {
                if fast.len() > app.max_batch() {
                    return Err(too_many_checks(&app, fast.len()));
                }
                escaped = false;
                fast.into_iter()
                    .enumerate()
                    .map(|(i, c)| {
                        batch_check(
                            i,
                            c.rule,
                            c.key,
                            c.cost,
                            c.class,
                            c.idempotency_key,
                            c.dry_run,
                            c.all.is_some(),
                        )
                    })
                    .collect::<Result<_, _>>()?
            }
            None => {
                slow = batch_checks_slow(&app, &bytes)?;
                escaped = true;
                slow.iter()
                    .enumerate()
                    .map(|(i, c)| c.check_ref(i))
                    .collect::<Result<_, _>>()?
            }
        };
        let outs = app.batch(&checks).await?;
        let mut body = Vec::with_capacity(16 + checks.len() * 192);
        write_batch(&mut body, &checks, &outs, escaped);
        Ok(bytes_response(StatusCode::OK, body))
    }
    .await;
    let resp = result.unwrap_or_else(IntoResponse::into_response);
    app.limiter
        .metrics()
        .check_duration
        .record(started.elapsed().as_secs_f64());
    crate::metrics::http(Endpoint::Batch, resp.status().as_u16());
    resp
}

#[cfg(test)]
mod tests {
    use serde::Serialize;

    use super::*;
    use crate::http::decision::DecisionJson;

    #[test]
    fn the_batch_answer_is_what_serde_json_writes() {
        use levee_core::{Decision, RuleMode};
        let decision = |allowed, mode, degraded| Outcome {
            decision: Decision {
                allowed,
                would_allow: !allowed,
                limit: 100,
                remaining: 7,
                reset_after_ms: 1_234,
                retry_after_ms: u64::MAX,
                mode,
                degraded,
            },
            window_secs: 60,
        };
        let outs = [
            decision(true, RuleMode::Enforce, false),
            decision(false, RuleMode::Shadow, true),
            decision(false, RuleMode::Enforce, true),
        ];
        let check = |rule, key| CheckRef {
            rule,
            key,
            cost: 1,
            class: None,
            idempotency_key: None,
            dry_run: false,
        };
        for (checks, escaped) in [
            (
                vec![check("api", "k1"), check("r", "é✓"), check("a-b", "x y")],
                false,
            ),
            (
                vec![
                    check("api", "q\"uote"),
                    check("r", "back\\slash"),
                    check("t", "tab\t\u{1}"),
                ],
                true,
            ),
        ] {
            let mut ours = Vec::new();
            write_batch(&mut ours, &checks, &outs, escaped);
            #[derive(Serialize)]
            struct Results<'a> {
                results: Vec<DecisionJson<'a>>,
            }
            let reference = serde_json::to_vec(&Results {
                results: checks
                    .iter()
                    .zip(&outs)
                    .map(|(c, o)| DecisionJson::new(c.rule, c.key, o))
                    .collect(),
            })
            .unwrap();
            assert_eq!(
                String::from_utf8(ours).unwrap(),
                String::from_utf8(reference).unwrap()
            );
        }
        let mut empty = Vec::new();
        write_batch(&mut empty, &[], &[], false);
        assert_eq!(empty, br#"{"results":[]}"#);
    }
}
