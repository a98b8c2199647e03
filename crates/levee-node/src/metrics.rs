//! Every metric the node emits, in one place. Names follow `levee_<noun>_<unit>_total`; label
//! values are bounded (rule names come from the configuration; no key is ever a label).
//!
//! Handles for the per-rule counters are registered once per configuration load and kept with
//! the rule, so the decision path does not build label sets.

use std::sync::OnceLock;

use metrics::{Counter, Gauge, Histogram, counter, gauge, histogram};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

/// Installs the Prometheus recorder once per process and returns its handle.
pub fn install() -> &'static PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE.get_or_init(|| {
        let recorder = PrometheusBuilder::new()
            .set_buckets_for_metric(
                Matcher::Full("levee_check_duration_seconds".into()),
                &[
                    0.000_02, 0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01,
                    0.05,
                ],
            )
            .and_then(|b| {
                b.set_buckets_for_metric(
                    Matcher::Full("levee_retry_after_seconds".into()),
                    &[
                        0.01, 0.1, 0.5, 1.0, 5.0, 30.0, 60.0, 300.0, 3600.0, 86_400.0,
                    ],
                )
            })
            .expect("bucket lists are not empty")
            .build_recorder();
        let handle = recorder.handle();
        // Another recorder may already be installed in a test process; keep ours regardless.
        let _ = metrics::set_global_recorder(recorder);
        describe();
        // Shown at 0 from the start: "this node forwarded nothing" is a reading.
        counter!("levee_forwarded_checks_total").increment(0);
        handle
    })
}

fn describe() {
    use metrics::{Unit, describe_counter, describe_gauge, describe_histogram};
    describe_counter!(
        "levee_checks_total",
        "Decisions made, by rule, decision and mode."
    );
    describe_counter!(
        "levee_forwarded_checks_total",
        "Checks and refunds this node forwarded to their key's owner in its region."
    );
    describe_counter!(
        "levee_forward_late_given_back_total",
        "Checks a key's owner admitted after this node had stopped waiting for it and decided them itself: given back to the owner."
    );
    describe_counter!(
        "levee_forward_late_withheld_total",
        "Checks a key's owner admitted after this node had stopped waiting for it, kept counted: their window could end before a refund arrived."
    );
    describe_counter!(
        "levee_degraded_decisions_total",
        "Decisions made under a conservative cap."
    );
    describe_counter!(
        "levee_rights_moved_total",
        "Rights (tokens) this node gave to others by rebalancing (strict mode)."
    );
    describe_counter!(
        "levee_gossip_batches_missed_total",
        "Times a peer's batches were found missing and asked for again (see docs/replication.md, \"Lost batches\")."
    );
    describe_counter!(
        "levee_gossip_repaired_keys_total",
        "Keys queued for a peer by anti-entropy repairs (see docs/replication.md, \"Anti-entropy\")."
    );
    describe_counter!(
        "levee_replication_refused_total",
        "Messages and key states from peers refused after decoding (see docs/replication.md)."
    );
    describe_histogram!(
        "levee_check_duration_seconds",
        Unit::Seconds,
        "Time to decide one HTTP request."
    );
    describe_histogram!(
        "levee_retry_after_seconds",
        Unit::Seconds,
        "Retry-after of denied decisions."
    );
    describe_gauge!("levee_keys", "Keys held in memory.");
    describe_counter!(
        "levee_keys_evicted_total",
        "Keys evicted because max_keys was reached."
    );
    describe_gauge!(
        "levee_region_reachable",
        "1 while the region is heard from within suspect_after (its own region included), 0 while decisions assume it cut off."
    );
    describe_gauge!(
        "levee_membership_agreed",
        "1 while every node of this node's list says it runs the same list, 0 while a change of the node list settles (shares are then the smallest under the lists in play)."
    );
    describe_gauge!(
        "levee_membership_version",
        "Entries in this node's node list, removed nodes included: it grows with every node added."
    );
    describe_counter!(
        "levee_keys_evicted_live_total",
        "Keys evicted that held something (every sampled key was live): max_keys is too small."
    );
    describe_counter!(
        "levee_config_reloads_total",
        "Configuration reloads, by result."
    );
    describe_gauge!(
        "levee_config_last_reload_success",
        "1 if the last reload succeeded, 0 if it failed."
    );
    describe_counter!(
        "levee_http_requests_total",
        "HTTP requests, by endpoint and status class."
    );
    describe_counter!(
        "levee_idempotent_replays_total",
        "Checks answered from the idempotency cache."
    );
    describe_counter!("levee_snapshots_total", "Snapshots written, by result.");
    describe_gauge!("levee_snapshot_keys", "Keys in the last snapshot written.");
    describe_gauge!("levee_http_connections_open", "HTTP connections open now.");
    describe_counter!(
        "levee_http_connections_refused_total",
        "HTTP connections closed as soon as accepted because api.max_connections were open."
    );
    describe_counter!(
        "levee_http_connections_closed_total",
        "HTTP connections the node closed, by reason (idle, request_timeout)."
    );
    describe_counter!(
        "levee_waits_total",
        "Checks that waited for rights (max_wait_ms), by result: admitted, denied (the wait ended or the limit was used up), busy (too many waiting; answered at once)."
    );
    describe_counter!(
        "levee_notices_total",
        "Threshold notices, by result: sent, failed (retried for a minute), dropped (queue full or pending at shutdown)."
    );
    describe_counter!(
        "levee_notice_retries_total",
        "Threshold notice delivery attempts that failed and were retried."
    );
    describe_counter!(
        "levee_snapshot_corrupt_total",
        "Snapshots found unreadable at start-up and moved aside."
    );
}

/// The gauge of open HTTP connections.
pub fn connections_open() -> Gauge {
    gauge!("levee_http_connections_open")
}

/// Counts a connection refused for being over `api.max_connections`.
pub fn connection_refused() {
    counter!("levee_http_connections_refused_total").increment(1);
}

/// Counts a connection the node closed: `idle` or `request_timeout`.
pub fn connection_closed(reason: &'static str) {
    counter!("levee_http_connections_closed_total", "reason" => reason).increment(1);
}

/// Counter handles of one rule.
#[derive(Clone)]
pub struct RuleMetrics {
    allowed: [Counter; 2],
    denied: [Counter; 2],
    /// The same decisions, as the status page reads them.
    activity: std::sync::Arc<crate::activity::RuleActivity>,
}

impl RuleMetrics {
    /// Registers the counters of rule `name`.
    pub fn new(name: &str) -> RuleMetrics {
        let c = |decision: &'static str, mode: &'static str| counter!("levee_checks_total", "rule" => name.to_owned(), "decision" => decision, "mode" => mode);
        RuleMetrics {
            allowed: [c("allowed", "enforce"), c("allowed", "shadow")],
            denied: [c("denied", "enforce"), c("denied", "shadow")],
            activity: crate::activity::rule(name),
        }
    }

    /// Counts one decision (`would_allow` is what the algorithm decided).
    #[inline]
    pub fn record(&self, would_allow: bool, shadow: bool) {
        let i = usize::from(shadow);
        self.activity.record(would_allow);
        if would_allow {
            &self.allowed[i]
        } else {
            &self.denied[i]
        }
        .increment(1);
    }
}

/// Process-wide handles used on the request path.
pub struct NodeMetrics {
    /// Degraded decisions.
    pub degraded: Counter,
    /// Check latency.
    pub check_duration: Histogram,
    /// Retry-after of denials.
    pub retry_after: Histogram,
    /// Keys held.
    pub keys: Gauge,
    /// Idempotent replays.
    pub replays: Counter,
}

impl NodeMetrics {
    /// Registers the handles.
    pub fn new() -> NodeMetrics {
        NodeMetrics {
            degraded: counter!("levee_degraded_decisions_total"),
            check_duration: histogram!("levee_check_duration_seconds"),
            retry_after: histogram!("levee_retry_after_seconds"),
            keys: gauge!("levee_keys"),
            replays: counter!("levee_idempotent_replays_total"),
        }
    }
}

impl Default for NodeMetrics {
    fn default() -> NodeMetrics {
        NodeMetrics::new()
    }
}

/// Counter handles of threshold notices (`levee_notices_total{result}` and retries).
#[derive(Clone)]
pub struct NoticeMetrics {
    /// Answered 2xx.
    pub sent: Counter,
    /// Retried for a minute, given up.
    pub failed: Counter,
    /// The target's queue was full, or still pending at shutdown.
    pub dropped: Counter,
    /// Attempts that failed and were retried.
    pub retries: Counter,
}

impl NoticeMetrics {
    /// Registers the handles.
    pub fn new() -> NoticeMetrics {
        let c = |result: &'static str| counter!("levee_notices_total", "result" => result);
        NoticeMetrics {
            sent: c("sent"),
            failed: c("failed"),
            dropped: c("dropped"),
            retries: counter!("levee_notice_retries_total"),
        }
    }
}

impl Default for NoticeMetrics {
    fn default() -> NoticeMetrics {
        NoticeMetrics::new()
    }
}

/// Counts a configuration reload.
pub fn reload(ok: bool) {
    counter!("levee_config_reloads_total", "result" => if ok { "ok" } else { "error" })
        .increment(1);
    gauge!("levee_config_last_reload_success").set(if ok { 1.0 } else { 0.0 });
}

/// Whether `region` is reachable from this node, as decisions assume it (1) or not (0).
pub fn region_reachable(region: &str, reachable: bool) {
    gauge!("levee_region_reachable", "region" => region.to_owned()).set(if reachable {
        1.0
    } else {
        0.0
    });
}

/// Counts evictions, and those of keys that held something (absolute totals from the store).
pub fn evictions(total: u64, live: u64) {
    counter!("levee_keys_evicted_total").absolute(total);
    counter!("levee_keys_evicted_live_total").absolute(live);
}

/// Counts a snapshot.
pub fn snapshot(ok: bool, keys: usize) {
    counter!("levee_snapshots_total", "result" => if ok { "ok" } else { "error" }).increment(1);
    if ok {
        gauge!("levee_snapshot_keys").set(keys as f64);
    }
}

/// Counts a snapshot found unreadable at start-up (and moved aside).
pub fn snapshot_corrupt() {
    counter!("levee_snapshot_corrupt_total").increment(1);
}

/// The endpoints `levee_http_requests_total` counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// `POST /v1/check`.
    Check,
    /// `POST /v1/check/batch`.
    Batch,
    /// `POST /v1/refund`.
    Refund,
    /// `/v1/authz/{rule}`.
    Authz,
    /// `GET /v1/usage/{rule}/{key}`.
    Usage,
    /// `DELETE /v1/usage/{rule}/{key}`.
    Reset,
    /// `POST /admin/reload`.
    Reload,
    /// `/v1/overrides/…`.
    Overrides,
    /// `POST /admin/leave`.
    Leave,
}

/// The `endpoint` label of each [`Endpoint`], in its order.
const ENDPOINTS: [&str; 9] = [
    "check",
    "batch",
    "refund",
    "authz",
    "usage",
    "reset",
    "reload",
    "overrides",
    "leave",
];
const CLASSES: [&str; 4] = ["2xx", "4xx", "5xx", "other"];

/// Counts an HTTP answer (handles are registered once, not looked up per request).
#[inline]
pub fn http(endpoint: Endpoint, status: u16) {
    static HANDLES: OnceLock<Vec<Counter>> = OnceLock::new();
    let handles = HANDLES.get_or_init(|| {
        ENDPOINTS
            .iter()
            .flat_map(|e| CLASSES.iter().map(move |c| counter!("levee_http_requests_total", "endpoint" => *e, "status" => *c)))
            .collect()
    });
    let class = match status {
        200..=299 => 0,
        400..=499 => 1,
        500..=599 => 2,
        _ => 3,
    };
    handles[endpoint as usize * CLASSES.len() + class].increment(1);
}
