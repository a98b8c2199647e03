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
use crate::limiter::{ApiError, CheckRef, Field, Outcome};
use crate::metrics::Endpoint;
use crate::wait::max_wait_of;

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
    max_wait_ms: Option<i64>,
    all: Option<serde::de::IgnoredAny>,
}

impl<'a> FastCheck<'a> {
    /// Check `i` of a batch, validated (as [`super::request::CheckBody::check_ref`]).
    #[inline]
    fn check_ref(&self, i: usize) -> Result<CheckRef<'a>, ApiError> {
        batch_check(
            i,
            self.rule,
            self.key,
            self.cost,
            self.class,
            self.idempotency_key,
            self.dry_run,
            self.all.is_some(),
        )
    }
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
fn batch_checks_slow(max_batch: usize, bytes: &[u8]) -> Result<Vec<CheckBody>, ApiError> {
    let body: BatchBody = decode(bytes)?;
    if body.checks.len() > max_batch {
        return Err(too_many_checks(max_batch, body.checks.len()));
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

/// The body of `POST /v1/check/batch` as the reference decoding reads it: each check is then
/// read as a [`CheckBody`] (without `all`).
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = Batch)]
struct BatchBody {
    /// The checks, at most `api.max_batch`; each as the body of `/v1/check`, without `all`.
    #[schema(value_type = Vec<super::request::BatchCheck>)]
    checks: Vec<serde_json::Value>,
}

fn too_many_checks(max_batch: usize, n: usize) -> ApiError {
    ApiError::invalid(format!("checks: {n} checks, at most {max_batch} allowed"))
}

/// The fuzzing entry point of a batch body (`fuzz/`, target `http_bodies`): both ways of
/// reading it, and the checks each validates. When the fast path reads a body, the reference
/// must read the same checks; it panics if they differ.
#[doc(hidden)]
pub fn fuzz_batch_body(bytes: &[u8], max_batch: usize) {
    let slow = batch_checks_slow(max_batch, bytes);
    let Some(fast) = batch_checks_fast(bytes) else {
        return;
    };
    let fast: Vec<Result<CheckRef<'_>, ApiError>> = fast
        .iter()
        .enumerate()
        .map(|(i, c)| c.check_ref(i))
        .collect();
    if fast.len() > max_batch {
        assert!(
            slow.is_err(),
            "the reference read more than {max_batch} checks"
        );
        return;
    }
    let slow =
        slow.unwrap_or_else(|e| panic!("the fast path read a body the reference refuses: {e:?}"));
    assert_eq!(fast.len(), slow.len());
    for (i, (f, s)) in fast.iter().zip(&slow).enumerate() {
        match (f, s.check_ref(i)) {
            (Ok(f), Ok(s)) => assert_eq!(
                (f.rule, f.key, f.cost, f.class, f.idempotency_key, f.dry_run),
                (s.rule, s.key, s.cost, s.class, s.idempotency_key, s.dry_run),
            ),
            (Err(f), Err(s)) => assert_eq!(f.message, s.message),
            (f, s) => panic!("check {i}: the two paths disagree: {f:?} / {s:?}"),
        }
    }
}

/// Check `i`'s `max_wait_ms`, validated; `None` when it gives none.
fn max_wait_given(i: usize, v: Option<i64>) -> Result<Option<u64>, ApiError> {
    v.map(|_| max_wait_of(v, Field::Check(i))).transpose()
}

/// Writes the answer to a batch, `{"results":[…]}`, the same bytes `serde_json` would write
/// for [`DecisionJson`](super::decision::DecisionJson<'_>)s, straight into `out`. `escaped`:
/// whether rule and key strings may need escaping; strings the fast path borrowed from the
/// body never do (they held no backslash, and JSON forbids raw control characters and quotes
/// in strings). `waited`: per check, how long it waited for rights, for the checks that gave
/// `max_wait_ms` (empty when none did).
fn write_batch(
    out: &mut Vec<u8>,
    checks: &[CheckRef<'_>],
    outs: &[Outcome],
    waited: &[Option<u64>],
    escaped: bool,
) {
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
            (&b",\"limit\":"[..], Some(d.limit)),
            (b",\"remaining\":", Some(d.remaining)),
            (b",\"local_remaining\":", o.local_remaining),
            (b",\"reset_after_ms\":", Some(d.reset_after_ms)),
            (b",\"retry_after_ms\":", Some(d.retry_after_ms)),
        ] {
            if let Some(v) = v {
                out.extend_from_slice(name);
                out.extend_from_slice(n.format(v).as_bytes());
            }
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
        if let Some(delay) = o.delay_ms() {
            out.extend_from_slice(b",\"delay_ms\":");
            out.extend_from_slice(n.format(delay).as_bytes());
        }
        if let Some(list) = o.list {
            out.extend_from_slice(b",\"list\":\"");
            out.extend_from_slice(list.as_str().as_bytes());
            out.push(b'"');
        }
        if let Some(Some(ms)) = waited.get(i) {
            out.extend_from_slice(b",\"waited_ms\":");
            out.extend_from_slice(n.format(*ms).as_bytes());
        }
        out.push(b'}');
    }
    out.extend_from_slice(b"]}");
}

/// `POST /v1/check/batch`, timed and counted.
#[utoipa::path(
    post,
    path = "/v1/check/batch",
    tag = "decisions",
    summary = "Many independent decisions, in order",
    request_body = BatchBody,
    responses(
        (status = 200, description = "one decision per check", body = super::decision::BatchJson<'_>),
        (status = 400, description = "a malformed body or a wrong field (the message names it)", body = super::response::ErrorJson<'_>),
        (status = 404, description = "no such rule", body = super::response::ErrorJson<'_>),
        (status = 413, description = "the body is over `api.max_body`", body = super::response::ErrorJson<'_>),
        (status = 415, description = "the body is not JSON", body = super::response::ErrorJson<'_>),
    ),
)]
pub(super) async fn batch(State(app): State<Arc<App>>, req: Request) -> Response {
    let started = Instant::now();
    let result: Result<Response, ApiError> = async {
        let bytes = json_bytes(&app, req).await?;
        let slow;
        let escaped;
        // Each check's `max_wait_ms`, validated, as given (`None`: not given).
        let mut waits: Vec<Option<u64>> = Vec::new();
        let checks: Vec<CheckRef<'_>> = match batch_checks_fast(&bytes) {
            Some(fast) => {
                if fast.len() > app.max_batch() {
                    return Err(too_many_checks(app.max_batch(), fast.len()));
                }
                escaped = false;
                let mut checks = Vec::with_capacity(fast.len());
                for (i, c) in fast.into_iter().enumerate() {
                    checks.push(c.check_ref(i)?);
                    waits.push(max_wait_given(i, c.max_wait_ms)?);
                }
                checks
            }
            None => {
                slow = batch_checks_slow(app.max_batch(), &bytes)?;
                escaped = true;
                let mut checks = Vec::with_capacity(slow.len());
                for (i, c) in slow.iter().enumerate() {
                    checks.push(c.check_ref(i)?);
                    waits.push(max_wait_given(i, c.max_wait_ms)?);
                }
                checks
            }
        };
        let merged = app.merges(waits.iter().any(|w| w.is_some_and(|ms| ms > 0)));
        let mut outs = app.batch(&checks).await?;
        let mut waited = Vec::new();
        if waits.iter().any(Option::is_some) {
            let ms: Vec<u64> = waits.iter().map(|w| w.unwrap_or(0)).collect();
            let took = app.wait_for_rights(&checks, &mut outs, &ms, merged).await?;
            waited = waits.iter().zip(took).map(|(w, t)| w.map(|_| t)).collect();
        }
        let mut body = Vec::with_capacity(16 + checks.len() * 192);
        write_batch(&mut body, &checks, &outs, &waited, escaped);
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
    use super::*;
    use crate::http::decision::{BatchJson, DecisionJson};

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
                delay_ms: if allowed { 250 } else { 0 },
            },
            window_secs: 60,
            local_remaining: degraded.then_some(3),
            shaped: allowed || degraded,
            list: match (allowed, mode) {
                (true, _) => Some(crate::limiter::List::Allow),
                (false, RuleMode::Shadow) => Some(crate::limiter::List::Deny),
                _ => None,
            },
        };
        let outs = [
            decision(true, RuleMode::Enforce, false),
            decision(false, RuleMode::Shadow, true),
            decision(false, RuleMode::Enforce, true),
        ];
        let check = |rule, key| CheckRef::of(rule, key, 1);
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
            // No check gave max_wait_ms; some did (one waited, one did not).
            for waited in [vec![], vec![None, Some(0), Some(731)]] {
                let mut ours = Vec::new();
                write_batch(&mut ours, &checks, &outs, &waited, escaped);
                let reference = serde_json::to_vec(&BatchJson {
                    results: checks
                        .iter()
                        .zip(&outs)
                        .enumerate()
                        .map(|(i, (c, o))| {
                            DecisionJson::new(c.rule, c.key, o)
                                .waited(waited.get(i).copied().flatten())
                        })
                        .collect(),
                })
                .unwrap();
                assert_eq!(
                    String::from_utf8(ours).unwrap(),
                    String::from_utf8(reference).unwrap()
                );
            }
        }
        let mut empty = Vec::new();
        write_batch(&mut empty, &[], &[], &[], false);
        assert_eq!(empty, br#"{"results":[]}"#);
    }
}
