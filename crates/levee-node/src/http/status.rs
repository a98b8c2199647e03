//! The status page for people, `GET /` (API.md "Machine-readable contract and a page for
//! people"), and the JSON it polls besides `/v1/cluster`: `GET /v1/status`, this node's
//! decisions per rule and its busiest keys (`crate::activity`).
//!
//! The page is one HTML document with its CSS and JavaScript inline (no external asset, no
//! build step): it polls `/v1/status` and `/v1/cluster` every second, turns the decision
//! totals into rates, and writes every value with `textContent` (keys are the callers' and are
//! never read as HTML).

use std::sync::{Arc, LazyLock};
use std::time::Instant;

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::Response;
use serde::Serialize;
use utoipa::ToSchema;

use super::response::json_response;
use crate::activity;
use crate::app::{App, NodeStatus};

/// The busiest keys shown.
const BUSIEST: usize = 10;

/// When the process started (first asked), for `uptime_ms`.
static STARTED: LazyLock<Instant> = LazyLock::new(Instant::now);

/// The answer of `GET /v1/status`.
#[derive(Serialize, ToSchema)]
#[schema(as = Status)]
pub(super) struct StatusJson {
    /// This node.
    node: NodeStatus,
    /// Milliseconds since the node began serving.
    uptime_ms: u64,
    /// Keys this node holds state for.
    keys: usize,
    /// Rights (tokens) this node has given to others by strict mode's rebalancing since it
    /// started (0 on a single node).
    rights_moved: u64,
    /// The decisions of each rule in force since the node started (a rule keeps its counts
    /// through reloads); rates are differences between two readings.
    rules: Vec<RuleActivityJson>,
    /// The busiest keys now, most first (sampled; see `sample_every`).
    busiest_keys: Vec<BusyKeyJson>,
    /// One decision in this many (per thread) is sampled into `busiest_keys`.
    sample_every: u32,
}

/// The decisions of one rule.
#[derive(Serialize, ToSchema)]
#[schema(as = RuleActivity)]
pub(super) struct RuleActivityJson {
    /// The rule.
    rule: String,
    /// `enforce` or `shadow`.
    #[schema(schema_with = super::openapi::rule_mode)]
    mode: &'static str,
    /// Decisions the rule's algorithm allowed (a shadow rule's would-be decisions).
    allowed: u64,
    /// Decisions it denied.
    denied: u64,
}

/// A busy key.
#[derive(Serialize, ToSchema)]
#[schema(as = BusyKey)]
pub(super) struct BusyKeyJson {
    /// The rule.
    rule: String,
    /// The key.
    key: String,
    /// Its decisions lately, estimated from the samples (recent ones weigh more: counts are
    /// halved every 10 s).
    decisions: u64,
    /// How much of `decisions` may belong to keys it displaced in the table.
    error: u64,
}

/// `GET /v1/status`: this node's decisions per rule and its busiest keys.
#[utoipa::path(
    get,
    path = "/v1/status",
    tag = "state",
    summary = "This node's decisions per rule and its busiest keys",
    responses((status = 200, description = "the node's activity", body = StatusJson)),
)]
pub(super) async fn status(State(app): State<Arc<App>>) -> Response {
    json_response(StatusCode::OK, &status_json(&app))
}

fn status_json(app: &App) -> StatusJson {
    let config = app.config.load();
    let rules = app.limiter.rules();
    let counts = activity::rules();
    StatusJson {
        node: NodeStatus {
            id: config.node.id.clone(),
            region: config.node.region.clone(),
            http: config.node.http.to_string(),
        },
        uptime_ms: u64::try_from(STARTED.elapsed().as_millis()).unwrap_or(u64::MAX),
        keys: app.limiter.store().len(),
        rights_moved: activity::rights_moved(),
        rules: rules
            .ordered
            .iter()
            .map(|e| {
                let name = &e.rule.spec.name;
                let (allowed, denied) = counts
                    .iter()
                    .find(|(n, _, _)| n == name)
                    .map_or((0, 0), |(_, a, d)| (*a, *d));
                RuleActivityJson {
                    rule: name.clone(),
                    mode: e.rule.mode.as_str(),
                    allowed,
                    denied,
                }
            })
            .collect(),
        busiest_keys: activity::busiest(BUSIEST)
            .into_iter()
            .map(|k| BusyKeyJson {
                rule: k.rule,
                key: k.key,
                decisions: k.count,
                error: k.error,
            })
            .collect(),
        sample_every: activity::SAMPLE_EVERY,
    }
}

/// Starts the uptime clock (called when the router is built).
pub(super) fn start_clock() {
    LazyLock::force(&STARTED);
}

/// `GET /`: the status page for a browser (`Accept: text/html`); anything else gets the JSON
/// of `GET /v1/status`.
#[utoipa::path(
    get,
    path = "/",
    tag = "operations",
    summary = "The status page (HTML for a browser, else the JSON of /v1/status)",
    responses((status = 200, description = "the live status page, or the node's activity", content(
        (String = "text/html"),
        (StatusJson = "application/json"),
    ))),
)]
pub(super) async fn page(State(app): State<Arc<App>>, headers: HeaderMap) -> Response {
    let wants_html = headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|m| {
            m.split(';')
                .next()
                .is_some_and(|m| m.trim().eq_ignore_ascii_case("text/html"))
        });
    if !wants_html {
        return json_response(StatusCode::OK, &status_json(&app));
    }
    let mut resp = Response::new(Body::from(PAGE));
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    // Everything is inline and served by the node: nothing else may load.
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'",
        ),
    );
    resp
}

/// The page: inline CSS and JavaScript.
const PAGE: &str = r##"<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>Levee status</title>
<style>
  :root { color-scheme: light; --ok: #1a7f37; --bad: #cf222e; --muted: #57606a; --line: #d0d7de; }
  body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 0; color: #1f2328; background: #f6f8fa; }
  header { background: #24292f; color: #fff; padding: 12px 24px; display: flex; gap: 24px; align-items: baseline; flex-wrap: wrap; }
  header h1 { font-size: 18px; margin: 0; }
  header .sub { color: #c9d1d9; }
  main { padding: 16px 24px; display: grid; grid-template-columns: repeat(auto-fit, minmax(440px, 1fr)); gap: 16px; }
  section { background: #fff; border: 1px solid var(--line); border-radius: 6px; padding: 12px 16px; }
  h2 { font-size: 15px; margin: 0 0 8px; }
  table { border-collapse: collapse; width: 100%; }
  th, td { text-align: left; padding: 4px 8px; border-bottom: 1px solid var(--line); white-space: nowrap; }
  td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
  td.key { max-width: 260px; overflow: hidden; text-overflow: ellipsis; font-family: ui-monospace, monospace; }
  .badge { display: inline-block; padding: 0 8px; border-radius: 10px; font-size: 12px; font-weight: 600; }
  .reachable { background: #dafbe1; color: var(--ok); }
  .unreachable { background: #ffebe9; color: var(--bad); }
  .degraded { background: #fff8c5; color: #7d4e00; }
  .muted { color: var(--muted); }
  footer { padding: 0 24px 16px; color: var(--muted); font-size: 12px; }
</style>
</head>
<body>
<header>
  <h1>Levee</h1>
  <span class="sub">node <b id="node-id">…</b> in region <b id="node-region">…</b></span>
  <span class="sub">mode <b id="cluster-mode">…</b></span>
  <span id="degraded" class="badge reachable">…</span>
  <span class="sub">keys held <b id="keys">…</b></span>
  <span class="sub">rights given away <b id="rights-moved">…</b></span>
</header>
<main>
  <section><h2>Regions</h2>
    <table id="regions"><thead><tr><th>region</th><th class="num">weight</th><th>state</th></tr></thead><tbody></tbody></table>
  </section>
  <section><h2>Peers</h2>
    <table id="peers"><thead><tr><th>node</th><th>region</th><th>state</th><th class="num">last heard</th><th class="num">lag</th><th class="num">backlog</th></tr></thead><tbody></tbody></table>
    <p id="no-peers" class="muted" hidden>This node runs alone.</p>
  </section>
  <section><h2>Decisions per second</h2>
    <table id="rules"><thead><tr><th>rule</th><th>mode</th><th class="num">allowed/s</th><th class="num">denied/s</th><th class="num">allowed</th><th class="num">denied</th></tr></thead><tbody></tbody></table>
  </section>
  <section><h2>Busiest keys</h2>
    <table id="keys-table"><thead><tr><th>rule</th><th>key</th><th class="num">decisions (est.)</th></tr></thead><tbody></tbody></table>
    <p id="no-keys" class="muted" hidden>No decision yet.</p>
  </section>
</main>
<footer><span id="updated">loading…</span> · <a href="/openapi.json">/openapi.json</a> · <a href="/v1/status">/v1/status</a> · <a href="/v1/cluster">/v1/cluster</a> · <a href="/metrics">/metrics</a></footer>
<script>
"use strict";
const $ = (id) => document.getElementById(id);
let last = null;
function cell(row, text, cls) {
  const td = document.createElement("td");
  td.textContent = text;
  if (cls) td.className = cls;
  row.appendChild(td);
  return td;
}
function badge(row, ok, yes, no) {
  const td = document.createElement("td");
  const b = document.createElement("span");
  b.className = "badge " + (ok ? "reachable" : "unreachable");
  b.textContent = ok ? yes : no;
  td.appendChild(b);
  row.appendChild(td);
}
function fill(table, items, each) {
  const body = $(table).tBodies[0];
  body.replaceChildren();
  for (const it of items) {
    const tr = document.createElement("tr");
    each(tr, it);
    body.appendChild(tr);
  }
}
const ms = (v) => v === null || v === undefined ? "—" : v + " ms";
const rate = (v) => v.toFixed(v < 10 ? 1 : 0);
async function get(path) {
  const r = await fetch(path, { headers: { accept: "application/json" }, cache: "no-store" });
  if (!r.ok) throw new Error(path + ": " + r.status);
  return r.json();
}
async function refresh() {
  try {
    const [status, cluster] = await Promise.all([get("/v1/status"), get("/v1/cluster")]);
    $("node-id").textContent = cluster.node.id;
    $("node-region").textContent = cluster.node.region;
    $("cluster-mode").textContent = cluster.mode;
    $("degraded").textContent = cluster.degraded ? "degraded" : "healthy";
    $("degraded").className = "badge " + (cluster.degraded ? "degraded" : "reachable");
    $("keys").textContent = status.keys;
    $("rights-moved").textContent = status.rights_moved;
    fill("regions", cluster.regions, (tr, r) => {
      tr.dataset.region = r.name;
      tr.className = r.reachable ? "region-reachable" : "region-unreachable";
      cell(tr, r.name);
      cell(tr, r.weight, "num");
      badge(tr, r.reachable, "reachable", "unreachable");
    });
    fill("peers", cluster.peers, (tr, p) => {
      tr.dataset.peer = p.id;
      cell(tr, p.id);
      cell(tr, p.region);
      badge(tr, p.reachable, "reachable", "unreachable");
      cell(tr, ms(p.last_heard_ms), "num");
      cell(tr, ms(p.lag_ms), "num");
      cell(tr, p.backlog_keys, "num");
    });
    $("no-peers").hidden = cluster.peers.length > 0;
    const now = status.uptime_ms;
    const before = last && now > last.uptime_ms ? last : null;
    fill("rules", status.rules, (tr, r) => {
      const prev = before && before.rules.find((x) => x.rule === r.rule);
      const secs = before ? (now - before.uptime_ms) / 1000 : 0;
      const per = (a, b) => (prev && secs > 0 ? rate(Math.max(0, a - b) / secs) : "—");
      tr.dataset.rule = r.rule;
      cell(tr, r.rule);
      cell(tr, r.mode);
      cell(tr, prev ? per(r.allowed, prev.allowed) : "—", "num");
      cell(tr, prev ? per(r.denied, prev.denied) : "—", "num");
      cell(tr, r.allowed, "num");
      cell(tr, r.denied, "num");
    });
    fill("keys-table", status.busiest_keys, (tr, k) => {
      tr.dataset.key = k.key;
      cell(tr, k.rule);
      cell(tr, k.key, "key").title = k.key;
      cell(tr, "~" + k.decisions, "num");
    });
    $("no-keys").hidden = status.busiest_keys.length > 0;
    last = status;
    $("updated").textContent = "updated " + new Date().toLocaleTimeString();
    document.body.dataset.loaded = "true";
  } catch (e) {
    $("updated").textContent = "cannot reach the node: " + e.message;
  }
}
refresh();
setInterval(refresh, 1000);
</script>
</body>
</html>
"##;
