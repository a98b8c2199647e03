//! Configuration: the TOML file a node runs from, its defaults and its validation.
//!
//! Every error names the line and the field (`levee.toml:12: rule "api": field `rate`: must
//! be at least 1`). A configuration is validated whole before anything uses it, so a reload
//! with a bad file changes nothing.

mod error;
mod sections;
mod size;

pub use error::ConfigError;
use error::{find_key_line, line_at, name_rule, rule_names, table_extent, toml_error};
pub use sections::*;
pub use size::ByteSize;

use std::path::{Path, PathBuf};

use levee_core::{ReplicaSet, ReplicaSpec, Rule, RuleSpec};
use serde::Deserialize;

/// The configuration a node runs on when started without `--config`: one node on
/// `127.0.0.1:8750` with a few example rules.
pub const DEFAULT_CONFIG: &str = include_str!("../../../../config/levee.toml");

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    #[serde(default)]
    node: NodeSection,
    #[serde(default)]
    cluster: Option<ClusterSection>,
    #[serde(default)]
    api: ApiSection,
    #[serde(default, rename = "rule")]
    rules: Vec<toml::Spanned<RuleSpec>>,
    #[serde(default, rename = "notify")]
    notify: Vec<toml::Spanned<NotifySection>>,
}

/// A validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// `[node]`.
    pub node: NodeSection,
    /// `[cluster]`, if any.
    pub cluster: Option<ClusterSection>,
    /// `[api]`.
    pub api: ApiSection,
    /// The rules, validated and bound to the replica set, in file order.
    pub rules: Vec<Rule>,
    /// The agreed replica set (a single node without `[cluster]`).
    pub replicas: ReplicaSet,
    /// `[[notify]]`: threshold notice targets, validated, in file order.
    pub notify: Vec<NotifySection>,
    /// Where it was read from (`None`: the embedded default).
    pub path: Option<PathBuf>,
    /// The text it was parsed from.
    pub text: String,
}

/// When set (and not empty), replaces `api.admin_token` of the file: a container or a unit
/// passes the token as a secret rather than in the configuration.
pub const ADMIN_TOKEN_ENV: &str = "LEVEE_ADMIN_TOKEN";
/// When set (and not empty), replaces `api.refund_token` of the file.
pub const REFUND_TOKEN_ENV: &str = "LEVEE_REFUND_TOKEN";

impl Config {
    /// Reads and validates a configuration file.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
            source_name: path.display().to_string(),
            line: None,
            field: "file".into(),
            message: format!("cannot read: {e}"),
        })?;
        let mut config = Config::parse(&text, &path.display().to_string())?;
        config.path = Some(path.to_owned());
        Ok(config)
    }

    /// The protocol version of the frames this node sends (`cluster.wire_version`, by
    /// default this build's `levee_proto::VERSION`).
    pub fn cluster_wire_version(&self) -> u8 {
        self.cluster
            .as_ref()
            .and_then(|c| c.wire_version)
            .unwrap_or(levee_proto::VERSION)
    }

    /// The embedded default configuration.
    pub fn embedded() -> Config {
        Config::parse(DEFAULT_CONFIG, "<embedded>").expect("the embedded configuration is valid")
    }

    /// Parses and validates configuration text; `source_name` names it in errors.
    pub fn parse(text: &str, source_name: &str) -> Result<Config, ConfigError> {
        let err = |line: Option<usize>, field: &str, message: String| ConfigError {
            source_name: source_name.to_owned(),
            line,
            field: field.to_owned(),
            message,
        };
        let raw: RawConfig = {
            let de = toml::Deserializer::parse(text)
                .map_err(|e| toml_error(text, source_name, &e, ""))?;
            serde_path_to_error::deserialize(de).map_err(|e| {
                let path = e.path().to_string();
                let mut error = toml_error(text, source_name, e.inner(), &path);
                error.field = name_rule(&error.field, &rule_names(text));
                error
            })?
        };
        let node = raw.node;
        let line_of_key = |key: &str| find_key_line(text, 0..text.len(), key);
        if node.id.is_empty() {
            return Err(err(
                line_of_key("id"),
                "node.id",
                "must not be empty".into(),
            ));
        }
        if node.max_keys == 0 {
            return Err(err(
                line_of_key("max_keys"),
                "node.max_keys",
                "must be at least 1".into(),
            ));
        }
        if node.snapshot_interval.as_millis() < 100 {
            return Err(err(
                line_of_key("snapshot_interval"),
                "node.snapshot_interval",
                "must be at least 100ms".into(),
            ));
        }
        let mut api = raw.api;
        // Secrets from the environment (a container's or a unit's), over the file's values.
        for (var, slot) in [
            (ADMIN_TOKEN_ENV, &mut api.admin_token),
            (REFUND_TOKEN_ENV, &mut api.refund_token),
        ] {
            if let Some(token) = std::env::var(var).ok().filter(|t| !t.is_empty()) {
                *slot = Some(token);
            }
        }
        if api.max_body.0 < 64 {
            return Err(err(
                line_of_key("max_body"),
                "api.max_body",
                "must be at least 64 bytes".into(),
            ));
        }
        if api.request_timeout.as_millis() == 0 {
            return Err(err(
                line_of_key("request_timeout"),
                "api.request_timeout",
                "must be at least 1ms".into(),
            ));
        }
        if api.max_batch == 0 || api.max_batch > 100_000 {
            return Err(err(
                line_of_key("max_batch"),
                "api.max_batch",
                "must be from 1 to 100000".into(),
            ));
        }
        if api.admin_token.as_deref() == Some("") {
            return Err(err(
                line_of_key("admin_token"),
                "api.admin_token",
                "must not be empty (omit it to disable)".into(),
            ));
        }
        if api.refund_token.as_deref() == Some("") {
            return Err(err(
                line_of_key("refund_token"),
                "api.refund_token",
                "must not be empty (omit it to use admin_token)".into(),
            ));
        }
        if api.admin_token.is_none() && !api.admin_open && !node.http.ip().is_loopback() {
            return Err(err(
                line_of_key("http"),
                "api.admin_token",
                format!(
                    "required when node.http ({}) is not a loopback address: without it anyone \
                     who reaches the port can reload, reset counters and refund; set \
                     admin_token (or the LEVEE_ADMIN_TOKEN environment variable), or \
                     admin_open = true to run open on purpose",
                    node.http
                ),
            ));
        }
        if api.idle_timeout.as_millis() == 0 {
            return Err(err(
                line_of_key("idle_timeout"),
                "api.idle_timeout",
                "must be at least 1ms".into(),
            ));
        }
        if api.max_connections == 0 {
            return Err(err(
                line_of_key("max_connections"),
                "api.max_connections",
                "must be at least 1".into(),
            ));
        }
        if raw
            .cluster
            .as_ref()
            .is_some_and(|c| c.mode == ClusterMode::Optimistic)
        {
            return Err(err(
                line_of_key("mode"),
                "cluster.mode",
                OPTIMISTIC_REMOVED.into(),
            ));
        }
        let replicas = match &raw.cluster {
            None => ReplicaSet::single(&node.id, &node.region),
            Some(cluster) => {
                let regions: Vec<(String, u32)> = cluster
                    .regions
                    .iter()
                    .map(|(k, v)| (k.clone(), *v))
                    .collect();
                if let Some(n) = cluster.nodes.iter().find(|n| n.weight == Some(0)) {
                    return Err(err(
                        line_of_key("weight"),
                        "cluster.node.weight",
                        format!(
                            "node {:?}: weight must be an integer from 1 to 1000000 (to remove a node, set `removed = true`)",
                            n.id
                        ),
                    ));
                }
                let specs: Vec<ReplicaSpec> = cluster
                    .nodes
                    .iter()
                    .map(|n| ReplicaSpec {
                        id: n.id.clone(),
                        region: n.region.clone(),
                        weight: if n.removed {
                            levee_core::REMOVED
                        } else {
                            n.weight
                        },
                    })
                    .collect();
                let set = ReplicaSet::new(&regions, &specs)
                    .map_err(|e| err(line_of_key("regions"), "cluster", e.to_string()))?;
                let Some(me) = set.node_by_id(&node.id) else {
                    return Err(err(
                        line_of_key("id"),
                        "node.id",
                        format!("{:?} is not in the cluster.node list", node.id),
                    ));
                };
                if set.is_removed(me) {
                    return Err(err(
                        line_of_key("removed"),
                        "cluster.node.removed",
                        format!(
                            "this node ({:?}) is marked removed: a removed node does not run",
                            node.id
                        ),
                    ));
                }
                if set.region_name(set.region_of(me)) != node.region {
                    return Err(err(
                        line_of_key("region"),
                        "node.region",
                        format!(
                            "{:?} differs from the region the cluster.node list gives this node",
                            node.region
                        ),
                    ));
                }
                for n in &cluster.nodes {
                    if let Some(h) = &n.http
                        && !is_host_port(h)
                    {
                        return Err(err(
                            text.lines()
                                .position(|l| l.contains(h.as_str()) && l.contains("http"))
                                .map(|i| i + 1),
                            "cluster.node.http",
                            format!(
                                "{h:?} (node {:?}): expected host:port, such as \"10.0.0.2:8750\"",
                                n.id
                            ),
                        ));
                    }
                }
                if cluster.gossip_interval.as_millis() == 0 {
                    return Err(err(
                        line_of_key("gossip_interval"),
                        "cluster.gossip_interval",
                        "must be at least 1ms".into(),
                    ));
                }
                if let Some(v) = cluster.wire_version
                    && !(levee_proto::OLDEST_VERSION..=levee_proto::VERSION).contains(&v)
                {
                    return Err(err(
                        line_of_key("wire_version"),
                        "cluster.wire_version",
                        format!(
                            "{v}: this build sends protocol version {} (the default) or {} (while nodes of the previous build run)",
                            levee_proto::VERSION,
                            levee_proto::OLDEST_VERSION
                        ),
                    ));
                }
                if cluster.suspect_after <= cluster.gossip_interval {
                    return Err(err(
                        line_of_key("suspect_after"),
                        "cluster.suspect_after",
                        "must be longer than gossip_interval".into(),
                    ));
                }
                set
            }
        };
        let mut rules: Vec<Rule> = Vec::with_capacity(raw.rules.len());
        for (i, spanned) in raw.rules.iter().enumerate() {
            let span = table_extent(text, spanned.span().start);
            let spec = spanned.get_ref();
            let mut rule = spec.validate().map_err(|e| ConfigError {
                source_name: source_name.to_owned(),
                line: find_key_line(
                    text,
                    span.clone(),
                    e.field.split(['[', '.']).next().unwrap_or(""),
                )
                .or_else(|| Some(line_at(text, span.start))),
                field: if e.rule.is_empty() {
                    format!("rule[{i}].{}", e.field)
                } else {
                    format!("rule {:?}: {}", e.rule, e.field)
                },
                message: e.problem.clone(),
            })?;
            if rules.iter().any(|r| r.name == rule.name) {
                return Err(err(
                    find_key_line(text, span, "name"),
                    &format!("rule[{i}].name"),
                    format!("rule {:?} is defined twice", rule.name),
                ));
            }
            rule.bind(&replicas);
            rules.push(rule);
        }
        let mut notify = Vec::with_capacity(raw.notify.len());
        for (i, spanned) in raw.notify.iter().enumerate() {
            let span = table_extent(text, spanned.span().start);
            let n = spanned.get_ref();
            let at = |key: &str| {
                find_key_line(text, span.clone(), key).or_else(|| Some(line_at(text, span.start)))
            };
            if let Err(problem) = crate::notify::check_url(&n.url) {
                return Err(err(at("url"), &format!("notify[{i}].url"), problem));
            }
            if n.thresholds.is_empty() {
                return Err(err(
                    at("thresholds"),
                    &format!("notify[{i}].thresholds"),
                    "must hold at least one threshold".into(),
                ));
            }
            for (j, t) in n.thresholds.iter().enumerate() {
                if !(*t > 0.0 && *t <= 1.0) {
                    return Err(err(
                        at("thresholds"),
                        &format!("notify[{i}].thresholds[{j}]"),
                        format!("{t} is outside (0, 1]: a threshold is a fraction of the limit"),
                    ));
                }
            }
            if n.rules.as_ref().is_some_and(Vec::is_empty) {
                return Err(err(
                    at("rules"),
                    &format!("notify[{i}].rules"),
                    "must name at least one rule (omit it to watch every rule)".into(),
                ));
            }
            for (j, name) in n.rules.iter().flatten().enumerate() {
                if !rules.iter().any(|r| r.name == *name) {
                    return Err(err(
                        at("rules"),
                        &format!("notify[{i}].rules[{j}]"),
                        format!("unknown rule {name:?}"),
                    ));
                }
            }
            if n.timeout.as_millis() == 0 {
                return Err(err(
                    at("timeout"),
                    &format!("notify[{i}].timeout"),
                    "must be at least 1ms".into(),
                ));
            }
            if n.queue == 0 || n.queue > 1_000_000 {
                return Err(err(
                    at("queue"),
                    &format!("notify[{i}].queue"),
                    "must be from 1 to 1000000".into(),
                ));
            }
            notify.push(n.clone());
        }
        Ok(Config {
            node,
            cluster: raw.cluster,
            api,
            rules,
            replicas,
            notify,
            path: None,
            text: text.to_owned(),
        })
    }
}

/// A one-node cluster's configuration with `extra` lines in its `[cluster]` table (from line
/// 6), parsed: for the tests of settings of that table.
#[cfg(test)]
pub(crate) fn one_node_cluster(extra: &str) -> Result<Config, ConfigError> {
    let text = format!(
        "[node]\nid = \"eu-1\"\nregion = \"eu\"\n[cluster]\nregions = {{ eu = 1 }}\n{extra}\
         [[cluster.node]]\nid = \"eu-1\"\nregion = \"eu\"\naddr = \"127.0.0.1:9000\"\n"
    );
    Config::parse(&text, "t.toml")
}

#[cfg(test)]
mod tests;
