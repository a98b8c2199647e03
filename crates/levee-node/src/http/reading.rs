//! Reading state (API.md "Reading state"): `GET /v1/usage/{rule}/{key}`, `GET /v1/rules`,
//! `GET /v1/cluster`. Nothing here changes a counter.

use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::response::json_response;
use crate::app::App;
use crate::metrics::Endpoint;

/// The query of `GET /v1/usage/{rule}/{key}`.
#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(super) struct ClassQuery {
    /// The consumer class, for a rule with classes.
    class: Option<String>,
}

/// The answer of `GET /v1/usage/{rule}/{key}`.
#[derive(Serialize, ToSchema)]
#[schema(as = Usage)]
pub(super) struct UsageJson<'a> {
    /// The rule.
    rule: &'a str,
    /// The key.
    key: &'a str,
    /// The rule's global limit.
    limit: u64,
    /// What every region used, as this node knows it.
    used: u64,
    /// `limit` less `used`.
    remaining: u64,
    /// Milliseconds until `remaining` is back to `limit` if nothing more is taken.
    reset_after_ms: u64,
    /// What each region used, by region name.
    #[schema(value_type = std::collections::BTreeMap<String, u64>)]
    regions: serde_json::Map<String, serde_json::Value>,
    /// The key's owner in this node's region (extension: operators and tests use it).
    owner: String,
}

/// The answer of `GET /v1/rules`.
#[derive(Serialize, ToSchema)]
#[schema(as = Rules)]
pub(super) struct RulesJson<'a> {
    /// The rules in force, in configuration order, as the configuration writes them.
    #[schema(value_type = Vec<Object>)]
    rules: Vec<&'a levee_core::RuleSpec>,
}

/// `GET /v1/usage/{rule}/{key}`: the key's usage as this node knows it, per region, and the
/// key's owner in this node's region; counted.
#[utoipa::path(
    get,
    path = "/v1/usage/{rule}/{key}",
    tag = "state",
    summary = "A key's usage as this node knows it",
    params(
        ("rule" = String, Path, description = "the rule"),
        ("key" = String, Path, description = "the key"),
        ClassQuery,
    ),
    responses(
        (status = 200, description = "the key's usage", body = UsageJson<'_>),
        (status = 400, description = "a wrong key or class", body = super::response::ErrorJson<'_>),
        (status = 404, description = "no such rule", body = super::response::ErrorJson<'_>),
    ),
)]
pub(super) async fn usage(
    State(app): State<Arc<App>>,
    Path((rule, key)): Path<(String, String)>,
    Query(q): Query<ClassQuery>,
) -> Response {
    let owner = app.owner_of(&key);
    let resp = match app.limiter.usage(&rule, &key, q.class.as_deref()) {
        Ok(u) => {
            let regions = u
                .region_names
                .iter()
                .zip(&u.usage.regions)
                .map(|(n, v)| (n.clone(), serde_json::Value::from(*v)))
                .collect();
            json_response(
                StatusCode::OK,
                &UsageJson {
                    rule: &u.rule,
                    key: &u.key,
                    limit: u.usage.limit,
                    used: u.usage.used,
                    remaining: u.usage.remaining,
                    reset_after_ms: u.usage.reset_after_ms,
                    regions,
                    owner,
                },
            )
        }
        Err(e) => e.into_response(),
    };
    crate::metrics::http(Endpoint::Usage, resp.status().as_u16());
    resp
}

/// `GET /v1/rules`: the rules in force, in configuration order.
#[utoipa::path(
    get,
    path = "/v1/rules",
    tag = "state",
    summary = "The rules in force",
    responses((status = 200, description = "the rules, in configuration order", body = RulesJson<'_>)),
)]
pub(super) async fn rules(State(app): State<Arc<App>>) -> Response {
    let rules = app.limiter.rules();
    json_response(
        StatusCode::OK,
        &RulesJson {
            rules: rules.ordered.iter().map(|e| &e.rule.spec).collect(),
        },
    )
}

/// The answer of `GET /v1/cluster`: the status, and the ring of this node's region.
#[derive(Serialize, utoipa::ToSchema)]
pub(crate) struct ClusterJson {
    #[serde(flatten)]
    status: crate::app::ClusterStatus,
    ring: RingJson,
}
/// The ring of this node's region as this node uses it: a key's owner is
/// `levee_cluster::ring::Rings` over the `member` nodes, hashing the key's own bytes.
#[derive(Serialize, utoipa::ToSchema)]
struct RingJson {
    region: String,
    vnodes: u32,
    nodes: Vec<RingNode>,
}
#[derive(Serialize, utoipa::ToSchema)]
struct RingNode {
    id: String,
    /// The node's HTTP address: its own `node.http`, or `http` of its `[[cluster.node]]`.
    http: Option<String>,
    /// In this node's ring: this node, and the region-mates it believes reachable.
    member: bool,
}

/// `GET /v1/cluster`: this node, its peers and regions, and whether it is degraded; and
/// `ring`, what a client needs to send each check to its key's owner in this node's region
/// (the owner routing of `levee-client`, docs/clients.md).
#[utoipa::path(
    get,
    path = "/v1/cluster",
    tag = "state",
    summary = "This node, its peers and regions, and its region's ring",
    responses((status = 200, description = "the cluster as this node sees it", body = ClusterJson)),
)]
pub(super) async fn cluster(State(app): State<Arc<App>>) -> Response {
    let status = app.cluster_status();
    let config = app.config.load();
    let me = &status.node;
    let nodes = match &config.cluster {
        None => vec![RingNode {
            id: me.id.clone(),
            http: Some(me.http.clone()),
            member: true,
        }],
        Some(c) => c
            .nodes
            .iter()
            .filter(|n| n.region == me.region)
            .map(|n| {
                let is_me = n.id == me.id;
                RingNode {
                    id: n.id.clone(),
                    http: if is_me {
                        Some(me.http.clone())
                    } else {
                        n.http.clone()
                    },
                    member: is_me || status.peers.iter().any(|p| p.id == n.id && p.reachable),
                }
            })
            .collect(),
    };
    let ring = RingJson {
        region: me.region.clone(),
        vnodes: levee_cluster::ring::VNODES,
        nodes,
    };
    json_response(StatusCode::OK, &ClusterJson { status, ring })
}
