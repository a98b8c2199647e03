//! Reading state (API.md "Reading state"): `GET /v1/usage/{rule}/{key}`, `GET /v1/rules`,
//! `GET /v1/cluster`. Nothing here changes a counter.

use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};

use super::response::json_response;
use crate::app::App;
use crate::metrics::Endpoint;

#[derive(Deserialize)]
pub(super) struct ClassQuery {
    class: Option<String>,
}

/// `GET /v1/usage/{rule}/{key}`: the key's usage as this node knows it, per region, and the
/// key's owner in this node's region; counted.
pub(super) async fn usage(
    State(app): State<Arc<App>>,
    Path((rule, key)): Path<(String, String)>,
    Query(q): Query<ClassQuery>,
) -> Response {
    #[derive(Serialize)]
    struct UsageJson<'a> {
        rule: &'a str,
        key: &'a str,
        limit: u64,
        used: u64,
        remaining: u64,
        reset_after_ms: u64,
        regions: serde_json::Map<String, serde_json::Value>,
        /// The key's owner in this node's region (extension: operators and tests use it).
        owner: String,
    }
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
pub(super) async fn rules(State(app): State<Arc<App>>) -> Response {
    #[derive(Serialize)]
    struct RulesJson<'a> {
        rules: Vec<&'a levee_core::RuleSpec>,
    }
    let rules = app.limiter.rules();
    json_response(
        StatusCode::OK,
        &RulesJson {
            rules: rules.ordered.iter().map(|e| &e.rule.spec).collect(),
        },
    )
}

/// `GET /v1/cluster`: this node, its peers and regions, and whether it is degraded.
pub(super) async fn cluster(State(app): State<Arc<App>>) -> Response {
    json_response(StatusCode::OK, &app.cluster_status())
}
