//! The running node's shared state: configuration, limiter, readiness, reload.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use arc_swap::ArcSwap;
use axum::http::HeaderMap;
use metrics_exporter_prometheus::PrometheusHandle;
use serde::Serialize;

use crate::config::{Config, ConfigError};
use crate::limiter::{ApiError, CheckRef, Clock, Limiter, Outcome};
use crate::replication::{ClusterHost, Replication};
use levee_cluster::Route;
use levee_core::{Decision, RuleMode};
use levee_proto::{ForwardCheck, ForwardDecision};

/// Everything the HTTP handlers and background tasks share.
pub struct App {
    /// The configuration in force.
    pub config: ArcSwap<Config>,
    /// Rules, keys and decisions.
    pub limiter: Limiter,
    /// `/readyz` answers 200 once set.
    pub ready: AtomicBool,
    /// Set when shutdown begins.
    pub shutting_down: AtomicBool,
    /// The Prometheus exposition.
    pub prometheus: &'static PrometheusHandle,
    /// The cluster side, when the node runs in a cluster.
    pub replication: Option<Arc<Replication>>,
    /// `cluster.local_first`: a check whose key a region-mate owns is decided here when this
    /// node's own rights admit it ([`Limiter::check_if_held`]), and forwarded otherwise.
    /// Read at start (a change needs a restart).
    pub local_first: bool,
    /// Whether the last reload failed (the file on disk differs from the running one).
    reload_failed: AtomicBool,
    /// Checks waiting for rights now (`max_wait_ms`, see [`crate::wait`]).
    pub(crate) waiting: std::sync::atomic::AtomicUsize,
}

/// `/v1/cluster` for a node.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ClusterStatus {
    /// This node.
    pub node: NodeStatus,
    /// How the global limit is kept: always `strict` (escrow) since optimistic mode was
    /// removed.
    #[schema(value_type = String)]
    pub mode: &'static str,
    /// Whether this node decides under conservative caps.
    pub degraded: bool,
    /// Every peer.
    pub peers: Vec<PeerStatus>,
    /// Every region.
    pub regions: Vec<RegionStatus>,
    /// The node list this node runs, and whether every node of it runs it too.
    pub membership: MembershipStatus,
}

/// `membership` in `/v1/cluster` (docs/membership.md).
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct MembershipStatus {
    /// The list's version: its number of entries, removed nodes included (it grows with every
    /// node added, and the list is only ever appended to).
    pub version: usize,
    /// The list's digest (hex), the same on every node that runs the same list.
    pub digest: String,
    /// Every node of the list (removed ones aside) has said it runs this list. Until then
    /// every node's share of every limit is the smallest under the lists in play.
    pub agreed: bool,
    /// This node's decisions are still bound by a list other than its own (one it ran
    /// before, or one a peer runs or is bounded by): its shares are the smallest under them.
    /// `false` once the shares of this node's own list are in force; a share that grows then
    /// still waits for the window after next (docs/membership.md).
    pub bounded: bool,
    /// This node is leaving (`POST /admin/leave`): it owns no key and hands its rights over.
    pub leaving: bool,
}

/// This node in `/v1/cluster`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct NodeStatus {
    /// Node id.
    pub id: String,
    /// Region.
    pub region: String,
    /// HTTP address.
    pub http: String,
}

/// A peer in `/v1/cluster`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct PeerStatus {
    /// Node id.
    pub id: String,
    /// Region.
    pub region: String,
    /// Where this node reaches it.
    pub addr: String,
    /// Whether it was heard from within `suspect_after`.
    pub reachable: bool,
    /// Milliseconds since it was last heard from (`null`: never).
    pub last_heard_ms: Option<u64>,
    /// Replication lag: milliseconds since this node sent the latest batch the peer says it
    /// has received (about a round trip plus a gossip interval when it keeps up; `null`
    /// before its first acknowledgement).
    pub lag_ms: Option<u64>,
    /// Its clock minus this node's, in ms, estimated from the times its batches carry
    /// (bounded to ±500 ms, `max_clock_skew`; `null` until an exchange gave one).
    pub clock_offset_ms: Option<i64>,
    /// Keys of full states waiting to be sent to it (pulls, anti-entropy, catch-ups).
    pub backlog_keys: usize,
    /// Its part in the node list: `joining` (it has not said it runs this node's list),
    /// `active` (it runs it) or `gone` (removed from the list).
    #[schema(value_type = String)]
    pub state: &'static str,
}

/// A region in `/v1/cluster`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct RegionStatus {
    /// Region name.
    pub name: String,
    /// Its weight.
    pub weight: u32,
    /// Whether any of its nodes is reachable (always true for this node's region).
    pub reachable: bool,
}

impl App {
    /// A node's state for a configuration; `replication` when it runs in a cluster (started
    /// first with [`Replication::start`], then run with [`Replication::run`] on this app).
    pub fn new(
        config: Config,
        clock: Clock,
        prometheus: &'static PrometheusHandle,
        replication: Option<Arc<Replication>>,
    ) -> App {
        let limiter = Limiter::new(&config, clock);
        let local_first = config.cluster.as_ref().is_some_and(|c| c.local_first);
        App {
            config: ArcSwap::from_pointee(config),
            limiter,
            ready: AtomicBool::new(false),
            shutting_down: AtomicBool::new(false),
            prometheus,
            replication,
            local_first,
            reload_failed: AtomicBool::new(false),
            waiting: std::sync::atomic::AtomicUsize::new(0),
        }
    }

    /// The request time limit.
    pub fn request_timeout(&self) -> Duration {
        Duration::from_millis(self.config.load().api.request_timeout.as_millis())
    }

    /// The largest body accepted.
    pub fn max_body(&self) -> usize {
        usize::try_from(self.config.load().api.max_body.0).unwrap_or(usize::MAX)
    }

    /// Most checks in one call.
    pub fn max_batch(&self) -> usize {
        self.config.load().api.max_batch
    }

    /// Checks the admin bearer token, when one is configured.
    pub fn authorize(&self, headers: &HeaderMap) -> Result<(), ApiError> {
        let config = self.config.load();
        bearer(headers, config.api.admin_token.as_deref(), "admin")
    }

    /// Checks the bearer token of `POST /v1/refund`: `refund_token`, else `admin_token`, when
    /// either is configured.
    pub fn authorize_refund(&self, headers: &HeaderMap) -> Result<(), ApiError> {
        let config = self.config.load();
        match config.api.refund_token.as_deref() {
            Some(token) => bearer(headers, Some(token), "refund"),
            None => bearer(headers, config.api.admin_token.as_deref(), "admin"),
        }
    }

    /// Re-reads the configuration file. On error the running configuration stays in force,
    /// the error is logged and counted, and returned. Returns the number of rules loaded.
    pub fn reload(&self, trigger: &str) -> Result<usize, ConfigError> {
        let result = self.reload_file(trigger);
        self.reload_failed.store(result.is_err(), Ordering::Release);
        result
    }

    /// The configuration file was found back at the running content after a failed reload
    /// (a bad edit reverted): nothing to apply, and the running configuration is again the
    /// file's, so this counts as a successful reload.
    pub fn reverted(&self, trigger: &str) {
        if self.reload_failed.swap(false, Ordering::AcqRel) {
            tracing::info!(
                trigger,
                "the configuration file is back to the running configuration; nothing to reload"
            );
            crate::metrics::reload(true);
        }
    }

    fn reload_file(&self, trigger: &str) -> Result<usize, ConfigError> {
        let current = self.config.load_full();
        let Some(path) = current.path.clone() else {
            tracing::info!(
                trigger,
                "reload requested; running on the embedded configuration, nothing to re-read"
            );
            crate::metrics::reload(true);
            return Ok(current.rules.len());
        };
        match Config::load(&path) {
            Ok(new) => {
                if let Some(why) = restart_needed(&current, &new) {
                    let e = ConfigError {
                        source_name: path.display().to_string(),
                        line: None,
                        field: why.into(),
                        message: "changes only on restart; the running configuration is kept"
                            .into(),
                    };
                    tracing::error!(trigger, error = %e, "configuration reload refused");
                    crate::metrics::reload(false);
                    return Err(e);
                }
                let rules = new.rules.len();
                match &self.replication {
                    Some(repl) => {
                        if let Err(e) =
                            repl.apply_config(&self.limiter, &new, self.limiter.clock.now_ms())
                        {
                            // The refusal names its entry (`cluster.node[2]: …`): that is the field.
                            let text = e.to_string();
                            let (field, message) = match text.split_once(": ") {
                                Some((f, m)) if f.starts_with("cluster.node") => (f, m),
                                _ => ("cluster.node", text.as_str()),
                            };
                            let e = ConfigError {
                                source_name: path.display().to_string(),
                                line: None,
                                field: field.into(),
                                message: format!("{message}; the running configuration is kept"),
                            };
                            tracing::error!(trigger, error = %e, "configuration reload refused");
                            crate::metrics::reload(false);
                            return Err(e);
                        }
                    }
                    None => self.limiter.replace_rules(&new, new.replicas.clone()),
                }
                if current.replicas.digest() != new.replicas.digest() {
                    tracing::info!(
                        trigger,
                        nodes = new.replicas.nodes().count(),
                        digest = format!("{:#018x}", new.replicas.digest()),
                        "node list changed: its shares apply once every node runs it"
                    );
                }
                self.config.store(Arc::new(new));
                tracing::info!(trigger, rules, path = %path.display(), "configuration reloaded");
                crate::metrics::reload(true);
                Ok(rules)
            }
            Err(e) => {
                tracing::error!(trigger, error = %e, "configuration reload failed; the running configuration is kept");
                crate::metrics::reload(false);
                Err(e)
            }
        }
    }

    /// The cluster as this node sees it.
    pub fn cluster_status(&self) -> ClusterStatus {
        let config = self.config.load();
        let rules = self.limiter.rules();
        let node = NodeStatus {
            id: config.node.id.clone(),
            region: config.node.region.clone(),
            http: config.node.http.to_string(),
        };
        let view = self.limiter.view();
        let replicas = &rules.replicas;
        let regions = match &config.cluster {
            None => vec![RegionStatus {
                name: config.node.region.clone(),
                weight: 1,
                reachable: true,
            }],
            Some(c) => c
                .regions
                .iter()
                .map(|(name, w)| RegionStatus {
                    name: name.clone(),
                    weight: *w,
                    reachable: replicas
                        .region_by_name(name)
                        .is_none_or(|r| !view.unreachable.contains(r)),
                })
                .collect(),
        };
        let peers = match (self.replication.as_ref(), &config.cluster) {
            (Some(repl), Some(c)) => {
                let (peers, list) = repl.peers(self.limiter.clock.now_ms());
                peers
                    .into_iter()
                    .map(|p| {
                        let id = repl.id_of(p.node).to_owned();
                        let addr = c
                            .nodes
                            .iter()
                            .find(|n| n.id == id)
                            .map(|n| n.addr.to_string())
                            .unwrap_or_default();
                        PeerStatus {
                            region: list.region_name(list.region_of(p.node)).to_owned(),
                            id,
                            addr,
                            reachable: p.reachable,
                            last_heard_ms: p.last_heard_ms_ago,
                            lag_ms: p.ack_lag_ms,
                            clock_offset_ms: p.clock_offset_ms,
                            backlog_keys: p.backlog_keys,
                            state: p.state.as_str(),
                        }
                    })
                    .collect()
            }
            _ => Vec::new(),
        };
        let (version, digest, agreed, bounded, leaving) = match self.replication.as_ref() {
            Some(repl) => repl.membership(replicas),
            None => (replicas.len(), replicas.digest(), true, false, false),
        };
        ClusterStatus {
            node,
            mode: "strict",
            degraded: view.degraded(),
            peers,
            regions,
            membership: MembershipStatus {
                version,
                digest: format!("{digest:016x}"),
                agreed,
                bounded,
                leaving,
            },
        }
    }

    /// The id of the node that owns `key` in this node's region (this node when alone).
    pub fn owner_of(&self, key: &str) -> String {
        match self.replication.as_ref() {
            Some(repl) => repl.id_of(repl.owner(key)).to_owned(),
            None => self.config.load().node.id.clone(),
        }
    }

    /// The part of [`App::check`] that needs no other node: the check decided here when this
    /// node owns its key, runs alone, or decides it from an allow or deny list (or the check
    /// is refused); else the region-mate that owns the key. The `/v1/authz` direct path
    /// answers the first on the connection's thread and leaves the second to the router.
    pub fn check_here(&self, req: CheckRef<'_>) -> Here {
        let Some(repl) = self.replication.as_ref() else {
            return Here::Decided(self.limiter.check(req));
        };
        match repl.route(req.key) {
            Route::Local => Here::Decided(self.limiter.check(req)),
            Route::Owner(owner) => match self.limiter.validate(req) {
                Err(e) => Here::Decided(Err(e)),
                Ok(()) if self.limiter.is_listed(req) => Here::Decided(self.limiter.check(req)),
                Ok(()) if self.local_first => match self.limiter.check_if_held(req) {
                    Ok(Some(out)) => Here::Decided(Ok(out)),
                    Ok(None) => Here::AtOwner(owner),
                    Err(e) => Here::Decided(Err(e)),
                },
                Ok(()) => Here::AtOwner(owner),
            },
            Route::Alone => Here::Decided(
                self.limiter
                    .validate(req)
                    .and_then(|()| self.limiter.check_with(req, true)),
            ),
        }
    }

    /// Decides a check where it belongs ([`Replication::route`]): here if this node owns the
    /// key (or runs alone), else at the owner in this region; alone, under this node's
    /// conservative cap, if the owner is unreachable or does not answer in time.
    pub async fn check(&self, req: CheckRef<'_>) -> Result<Outcome, ApiError> {
        match self.check_here(req) {
            Here::Decided(out) => out,
            Here::AtOwner(owner) => self.check_at_owner(req, owner).await,
        }
    }

    /// The rest of [`App::check`] for a check [`App::check_here`] left to `owner`: its
    /// decision, or this node's alone if the owner does not answer in time.
    pub async fn check_at_owner(
        &self,
        req: CheckRef<'_>,
        owner: levee_core::NodeIdx,
    ) -> Result<Outcome, ApiError> {
        let now = self.limiter.clock.now_ms();
        // (A key is only ever at an owner in a cluster.)
        if let Some(repl) = self.replication.as_ref()
            && let Some(d) = repl.forward(owner, forward_check(req, false), now).await
        {
            return self
                .limiter
                .outcome_of(req, decision_of(d, &self.limiter, req));
        }
        self.limiter.check_with(req, true)
    }

    /// Gives tokens back where the key's consumption is counted (its owner).
    pub async fn refund(&self, req: CheckRef<'_>) -> Result<Outcome, ApiError> {
        let Some(repl) = self.replication.as_ref() else {
            return self.limiter.refund(req);
        };
        let alone = match repl.route(req.key) {
            Route::Local => false,
            Route::Alone => true,
            Route::Owner(owner) => {
                self.limiter.validate(req)?;
                if self.local_first
                    && let Some(out) = self.limiter.refund_if_held(req)?
                {
                    return Ok(out);
                }
                let now = self.limiter.clock.now_ms();
                if let Some(d) = repl.forward(owner, forward_check(req, true), now).await {
                    return self
                        .limiter
                        .outcome_of(req, decision_of(d, &self.limiter, req));
                }
                true
            }
        };
        self.limiter.refund_with(req, alone)
    }

    /// Marks the node ready (or not).
    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::Release);
    }
}

/// Where [`App::check_here`] left a check.
pub enum Here {
    /// Decided (or refused) here.
    Decided(Result<Outcome, ApiError>),
    /// To be decided by this region-mate, the key's owner.
    AtOwner(levee_core::NodeIdx),
}

/// A check as it is forwarded to its owner.
pub(crate) fn forward_check(req: CheckRef<'_>, refund: bool) -> ForwardCheck {
    ForwardCheck {
        rule: req.rule.to_owned(),
        key: req.key.to_owned(),
        cost: req.cost,
        class: req.class.map(str::to_owned),
        dry_run: req.dry_run,
        idempotency_key: req.idempotency_key.map(str::to_owned),
        refund,
    }
}

pub(crate) fn decision_of(d: ForwardDecision, limiter: &Limiter, req: CheckRef<'_>) -> Decision {
    let mode = limiter
        .rules()
        .by_name
        .get(req.rule)
        .map_or(RuleMode::Enforce, |e| e.rule.mode);
    Decision {
        allowed: d.allowed,
        would_allow: d.would_allow,
        limit: d.limit,
        remaining: d.remaining,
        reset_after_ms: d.reset_after_ms,
        // An admitted decision's `retry_after_ms` carries its delay (`replication/forward.rs`).
        retry_after_ms: if d.would_allow { 0 } else { d.retry_after_ms },
        mode,
        degraded: d.degraded,
        delay_ms: if d.would_allow && d.allowed && mode == RuleMode::Enforce {
            d.retry_after_ms
        } else {
            0
        },
    }
}

/// Which changed setting a reload cannot apply (addresses, identity, joining or leaving a
/// cluster). The node list itself changes on reload (`Replication::apply_config`).
fn restart_needed(old: &Config, new: &Config) -> Option<&'static str> {
    if old.node.http != new.node.http {
        return Some("node.http");
    }
    if old.node.id != new.node.id || old.node.region != new.node.region {
        return Some("node.id");
    }
    if old.node.gossip != new.node.gossip {
        return Some("node.gossip");
    }
    if old.node.data_dir != new.node.data_dir {
        return Some("node.data_dir");
    }
    if old.node.max_keys != new.node.max_keys {
        return Some("node.max_keys");
    }
    if old.cluster.is_some() != new.cluster.is_some() {
        return Some("cluster");
    }
    if old.cluster_wire_version() != new.cluster_wire_version() {
        return Some("cluster.wire_version");
    }
    let topology = |c: &Config| c.cluster.as_ref().map(|c| c.gossip_topology);
    if topology(old) != topology(new) {
        return Some("cluster.gossip_topology");
    }
    let local_first = |c: &Config| c.cluster.as_ref().map(|c| c.local_first);
    if local_first(old) != local_first(new) {
        return Some("cluster.local_first");
    }
    None
}

/// Checks `Authorization: Bearer <token>` when a token is configured; `which` names it in
/// the error.
fn bearer(headers: &HeaderMap, token: Option<&str>, which: &str) -> Result<(), ApiError> {
    let Some(token) = token else {
        return Ok(());
    };
    let given = headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim);
    match given {
        Some(g) if constant_time_eq(g.as_bytes(), token.as_bytes()) => Ok(()),
        Some(_) => Err(ApiError {
            status: 401,
            code: "unauthorized",
            message: "Authorization: wrong bearer token".into(),
        }),
        None => Err(ApiError {
            status: 401,
            code: "unauthorized",
            message: format!(
                "Authorization: a bearer token is required (Authorization: Bearer <{which} token>)"
            ),
        }),
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

impl ClusterHost for App {
    fn limiter(&self) -> &Limiter {
        &self.limiter
    }

    fn synced(&self) {
        if !self.shutting_down.load(Ordering::Acquire) {
            self.set_ready(true);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::restart_needed;
    use crate::config::one_node_cluster;

    /// `cluster.local_first` is read at start: a reload that changes it names it (and the
    /// running setting is kept), one that keeps it does not.
    #[test]
    fn a_reload_that_changes_local_first_names_the_field() {
        let parse = |extra: &str| one_node_cluster(extra).unwrap_or_else(|e| panic!("{e}"));
        let off = parse("");
        let on = parse("local_first = true\n");
        assert_eq!(restart_needed(&off, &on), Some("cluster.local_first"));
        assert_eq!(restart_needed(&on, &off), Some("cluster.local_first"));
        assert_eq!(restart_needed(&on, &on), None);
    }
}
