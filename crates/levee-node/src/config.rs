//! Configuration: the TOML file a node runs from, its defaults and its validation.
//!
//! Every error names the line and the field (`levee.toml:12: rule "api": field `rate`: must
//! be at least 1`). A configuration is validated whole before anything uses it, so a reload
//! with a bad file changes nothing.

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use levee_core::{Consistency, HumanDuration, ReplicaSet, ReplicaSpec, Rule, RuleSpec};
use serde::{Deserialize, Serialize};

/// The configuration a node runs on when started without `--config`: one node on
/// `127.0.0.1:8750` with a few example rules.
pub const DEFAULT_CONFIG: &str = include_str!("../../../config/levee.toml");

/// A configuration error: where, which field, what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ConfigError {
    /// The file (or `<embedded>`).
    pub source_name: String,
    /// 1-based line, when known.
    pub line: Option<usize>,
    /// The field, as a path (`rule[2].rate`, `api.max_body`).
    pub field: String,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.line {
            Some(line) => write!(
                f,
                "{}:{}: {}: {}",
                self.source_name, line, self.field, self.message
            ),
            None => write!(f, "{}: {}: {}", self.source_name, self.field, self.message),
        }
    }
}

/// A size in bytes written as `"1MiB"`, `"512KiB"`, `"64KB"` or a plain number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct ByteSize(pub u64);

impl std::str::FromStr for ByteSize {
    type Err = String;

    fn from_str(s: &str) -> Result<ByteSize, String> {
        let t = s.trim();
        let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
        let (num, unit) = t.split_at(split);
        let n: u64 = num
            .parse()
            .map_err(|_| format!("{s:?} is not a size such as \"1MiB\" or \"65536\""))?;
        let mult: u64 = match unit.trim() {
            "" | "B" => 1,
            "KB" | "kB" => 1_000,
            "KiB" => 1 << 10,
            "MB" => 1_000_000,
            "MiB" => 1 << 20,
            "GB" => 1_000_000_000,
            "GiB" => 1 << 30,
            other => {
                return Err(format!(
                    "unknown size unit {other:?} (use B, KiB, MiB, GiB, KB, MB or GB)"
                ));
            }
        };
        n.checked_mul(mult)
            .map(ByteSize)
            .ok_or_else(|| format!("{s:?} is too large"))
    }
}

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.0;
        if b >= 1 << 20 && b % (1 << 20) == 0 {
            write!(f, "{}MiB", b >> 20)
        } else if b >= 1 << 10 && b % (1 << 10) == 0 {
            write!(f, "{}KiB", b >> 10)
        } else {
            write!(f, "{b}")
        }
    }
}

impl Serialize for ByteSize {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<ByteSize, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Int(u64),
            Str(String),
        }
        match Raw::deserialize(d)? {
            Raw::Int(n) => Ok(ByteSize(n)),
            Raw::Str(s) => s.parse().map_err(serde::de::Error::custom),
        }
    }
}

/// `[node]`: this node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NodeSection {
    /// Unique node id in the cluster.
    pub id: String,
    /// The region the node serves.
    pub region: String,
    /// The HTTP API's address.
    pub http: SocketAddr,
    /// QUIC address for peers; absent on a single node.
    pub gossip: Option<SocketAddr>,
    /// Where snapshots of counters go; absent: no persistence.
    pub data_dir: Option<PathBuf>,
    /// The most keys held in memory; idle keys are evicted first beyond it.
    pub max_keys: usize,
    /// How often counters are written to `data_dir`.
    pub snapshot_interval: HumanDuration,
    /// How long shutdown waits for in-flight requests.
    pub shutdown_grace: HumanDuration,
}

impl Default for NodeSection {
    fn default() -> NodeSection {
        NodeSection {
            id: "node-1".into(),
            region: "local".into(),
            http: SocketAddr::from(([127, 0, 0, 1], 8750)),
            gossip: None,
            data_dir: None,
            max_keys: 1_000_000,
            snapshot_interval: HumanDuration::from_millis(10_000),
            shutdown_grace: HumanDuration::from_millis(10_000),
        }
    }
}

/// `[api]`: the HTTP API.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ApiSection {
    /// Bearer token for `/admin/*` and `DELETE /v1/usage`; absent: no token required.
    pub admin_token: Option<String>,
    /// Largest request body.
    pub max_body: ByteSize,
    /// A request taking longer is answered `503`.
    pub request_timeout: HumanDuration,
    /// How many idempotency keys are remembered.
    pub idempotency_capacity: u64,
    /// Most checks in one batch or `all` call.
    pub max_batch: usize,
}

impl Default for ApiSection {
    fn default() -> ApiSection {
        ApiSection {
            admin_token: None,
            max_body: ByteSize(1 << 20),
            request_timeout: HumanDuration::from_millis(5_000),
            idempotency_capacity: 100_000,
            max_batch: 1_000,
        }
    }
}

/// `[cluster.tls]`: mutual TLS between peers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsSection {
    /// The cluster CA certificate (PEM).
    pub ca: PathBuf,
    /// This node's certificate (PEM).
    pub cert: PathBuf,
    /// This node's private key (PEM).
    pub key: PathBuf,
}

/// `[[cluster.node]]`: one member of the agreed replica set.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterNode {
    /// The node's id.
    pub id: String,
    /// Its region.
    pub region: String,
    /// Where this node reaches it (point at a proxy to route the link through one).
    pub addr: SocketAddr,
    /// Its weight inside its region (default: the region's weight split evenly).
    #[serde(default)]
    pub weight: Option<u32>,
}

/// `[cluster]`: the multi-region cluster.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterSection {
    /// `strict` (default) or `optimistic`.
    #[serde(default)]
    pub mode: Consistency,
    /// How often deltas are sent.
    #[serde(default = "default_gossip_interval")]
    pub gossip_interval: HumanDuration,
    /// A region not heard from within this is unreachable.
    #[serde(default = "default_suspect_after")]
    pub suspect_after: HumanDuration,
    /// Tolerated clock skew between nodes.
    #[serde(default = "default_max_clock_skew")]
    pub max_clock_skew: HumanDuration,
    /// Region weights.
    pub regions: BTreeMap<String, u32>,
    /// Mutual TLS.
    pub tls: Option<TlsSection>,
    /// The agreed node list.
    #[serde(default, rename = "node")]
    pub nodes: Vec<ClusterNode>,
}

fn default_gossip_interval() -> HumanDuration {
    HumanDuration::from_millis(20)
}
fn default_suspect_after() -> HumanDuration {
    HumanDuration::from_millis(1_000)
}
fn default_max_clock_skew() -> HumanDuration {
    HumanDuration::from_millis(500)
}

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
    /// Where it was read from (`None`: the embedded default).
    pub path: Option<PathBuf>,
    /// The text it was parsed from.
    pub text: String,
}

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
                toml_error(text, source_name, e.inner(), &path)
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
        let api = raw.api;
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
        let replicas = match &raw.cluster {
            None => ReplicaSet::single(&node.id, &node.region),
            Some(cluster) => {
                let regions: Vec<(String, u32)> = cluster
                    .regions
                    .iter()
                    .map(|(k, v)| (k.clone(), *v))
                    .collect();
                let specs: Vec<ReplicaSpec> = cluster
                    .nodes
                    .iter()
                    .map(|n| ReplicaSpec {
                        id: n.id.clone(),
                        region: n.region.clone(),
                        weight: n.weight,
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
                if cluster.gossip_interval.as_millis() == 0 {
                    return Err(err(
                        line_of_key("gossip_interval"),
                        "cluster.gossip_interval",
                        "must be at least 1ms".into(),
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
                field: format!("rule[{i}].{}", e.field),
                message: e.to_string(),
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
        Ok(Config {
            node,
            cluster: raw.cluster,
            api,
            rules,
            replicas,
            path: None,
            text: text.to_owned(),
        })
    }
}

/// Turns a TOML or serde error into a `ConfigError` with the line of its span.
fn toml_error(text: &str, source_name: &str, e: &toml::de::Error, path: &str) -> ConfigError {
    let field = if path.is_empty() || path == "." {
        "config".to_owned()
    } else {
        normalize_path(path)
    };
    ConfigError {
        source_name: source_name.to_owned(),
        line: e.span().map(|s| line_at(text, s.start)),
        field,
        message: e.message().trim().to_owned(),
    }
}

/// `rule[1].rate` rather than serde_path_to_error's `rule[1].rate` / `rule.rate` forms.
fn normalize_path(path: &str) -> String {
    path.replace("?.", "").replace('?', "")
}

/// From the start of a table to the next table header (or the end): where its keys are.
fn table_extent(text: &str, start: usize) -> std::ops::Range<usize> {
    let start = start.min(text.len());
    let first_line_end = text[start..]
        .find('\n')
        .map_or(text.len(), |i| start + i + 1);
    let mut offset = first_line_end;
    for line in text[first_line_end..].split_inclusive('\n') {
        if line.trim_start().starts_with('[') {
            return start..offset;
        }
        offset += line.len();
    }
    start..text.len()
}

fn line_at(text: &str, offset: usize) -> usize {
    text[..offset.min(text.len())]
        .bytes()
        .filter(|&b| b == b'\n')
        .count()
        + 1
}

/// The line inside `range` where `key = …` is written, if any.
fn find_key_line(text: &str, range: std::ops::Range<usize>, key: &str) -> Option<usize> {
    if key.is_empty() {
        return None;
    }
    let start = range.start.min(text.len());
    let end = range.end.min(text.len());
    let mut offset = start;
    for line in text[start..end].split_inclusive('\n') {
        let t = line.trim_start();
        if let Some(rest) = t.strip_prefix(key)
            && rest.trim_start().starts_with('=')
        {
            return Some(line_at(text, offset));
        }
        offset += line.len();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_embedded_configuration_is_valid() {
        let c = Config::embedded();
        assert_eq!(c.node.http, SocketAddr::from(([127, 0, 0, 1], 8750)));
        assert!(c.rules.len() >= 3);
    }

    #[test]
    fn an_invalid_rule_names_its_line_and_field() {
        let text = "[node]\nid = \"a\"\n\n[[rule]]\nname = \"x\"\nalgorithm = \"token_bucket\"\nrate = 0\nper = \"1s\"\n";
        let e = Config::parse(text, "t.toml").unwrap_err();
        assert_eq!(e.line, Some(7));
        assert_eq!(e.field, "rule[0].rate");
        assert!(e.to_string().starts_with("t.toml:7: rule[0].rate:"), "{e}");
    }

    #[test]
    fn an_unknown_field_names_its_line() {
        let text = "[api]\nmax_body = \"1MiB\"\nbogus = 1\n";
        let e = Config::parse(text, "t.toml").unwrap_err();
        assert_eq!(e.line, Some(3), "{e}");
        assert!(e.message.contains("bogus"), "{e}");
    }

    #[test]
    fn a_mistyped_field_names_its_path() {
        let text = "[[rule]]\nname = \"x\"\nalgorithm = \"fixed_window\"\nlimit = \"ten\"\nwindow = \"1s\"\n";
        let e = Config::parse(text, "t.toml").unwrap_err();
        assert_eq!(e.line, Some(4), "{e}");
        assert!(e.field.contains("limit"), "{e}");
    }

    #[test]
    fn a_bad_duration_is_reported() {
        let text =
            "[[rule]]\nname = \"x\"\nalgorithm = \"fixed_window\"\nlimit = 5\nwindow = \"soon\"\n";
        let e = Config::parse(text, "t.toml").unwrap_err();
        assert_eq!(e.line, Some(5), "{e}");
        assert!(e.message.contains("invalid duration"), "{e}");
    }

    #[test]
    fn duplicate_rule_names_are_refused() {
        let rule =
            "[[rule]]\nname = \"x\"\nalgorithm = \"fixed_window\"\nlimit = 5\nwindow = \"1s\"\n";
        let e = Config::parse(&format!("{rule}{rule}"), "t.toml").unwrap_err();
        assert_eq!(e.field, "rule[1].name");
        assert_eq!(e.line, Some(7));
    }

    #[test]
    fn byte_sizes_parse() {
        assert_eq!("1MiB".parse::<ByteSize>(), Ok(ByteSize(1 << 20)));
        assert_eq!("64KB".parse::<ByteSize>(), Ok(ByteSize(64_000)));
        assert_eq!("123".parse::<ByteSize>(), Ok(ByteSize(123)));
        assert!("1 parsec".parse::<ByteSize>().is_err());
    }

    #[test]
    fn a_cluster_must_list_this_node() {
        let text = "[node]\nid = \"eu-9\"\nregion = \"eu\"\n[cluster]\nregions = { eu = 1 }\n[[cluster.node]]\nid = \"eu-1\"\nregion = \"eu\"\naddr = \"127.0.0.1:9000\"\n";
        let e = Config::parse(text, "t.toml").unwrap_err();
        assert_eq!(e.field, "node.id");
    }
}
