//! Operating a real node: configuration reloads (admin endpoint, SIGHUP, file change, a
//! Kubernetes ConfigMap symlink swap), bounded memory under a flood of keys, persistence of
//! quotas across a restart, graceful shutdown, and the `levee` command line.

use std::time::Duration;

use levee_blackbox::{Node, levee, metric, wait_until};
use serde_json::{Value, json};

const TOKEN: &str = "tok-123";

/// `{http}` is filled in by the harness; `limit = 3` is what the reload tests change.
const CONFIG: &str = r#"[node]
id = "n1"
region = "eu"
http = {http}

[api]
admin_token = "tok-123"

[[rule]]
name = "per-tenant"
algorithm = "fixed_window"
limit = 3
window = "1d"

[[rule]]
name = "steady"
algorithm = "fixed_window"
limit = 10
window = "1d"
"#;

/// Line 14 of this file holds an invalid value (a limit of 0).
const INVALID: &str = r#"[node]
id = "n1"
region = "eu"
http = {http}

[api]
admin_token = "tok-123"

[[rule]]
name = "per-tenant"
algorithm = "fixed_window"
window = "1d"
# a limit of zero can never allow anything
limit = 0
"#;

/// How long the node may take to notice a changed file (it polls every second). An upper
/// bound, not a timing figure: generous because a busy 2-core CI machine once took over 5 s.
const WATCH_WAIT: Duration = Duration::from_secs(15);

fn limit_of(node: &Node, rule: &str) -> Option<u64> {
    node.rule(rule).and_then(|r| r["limit"].as_u64())
}

fn reload_errors(node: &Node) -> f64 {
    metric(
        &node.metrics(),
        "levee_config_reloads_total",
        &[("result", "error")],
    )
    .unwrap_or(0.0)
}

/// Three checks allowed, the fourth denied: the limit of 3 is in force (on a fresh key).
#[track_caller]
fn assert_limit_in_force(node: &Node, key: &str, limit: u64) {
    for i in 0..limit {
        assert!(
            node.check("per-tenant", key, 1).allowed(),
            "check {i} of {limit} on {key}"
        );
    }
    assert!(
        !node.check("per-tenant", key, 1).allowed(),
        "check {limit} on {key} is over the limit"
    );
}

#[test]
fn admin_reload_applies_a_changed_rule() {
    let node = Node::start(CONFIG);
    assert_eq!(limit_of(&node, "per-tenant"), Some(3));
    assert!(node.check("steady", "acme", 4).allowed());
    node.write_config_unnoticed(&CONFIG.replace("limit = 3", "limit = 7"));
    let r = node.post_with_token("/admin/reload", Some(TOKEN));
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(limit_of(&node, "per-tenant"), Some(7));
    assert_limit_in_force(&node, "after-reload", 7);
    // A rule the reload did not change keeps its counts.
    assert_eq!(node.used("steady", "acme"), 4);
}

#[test]
fn admin_reload_of_an_invalid_file_reports_the_error_and_keeps_the_running_config() {
    let node = Node::start(CONFIG);
    let errors_before = reload_errors(&node);
    node.write_config(INVALID);
    let r = node.post_with_token("/admin/reload", Some(TOKEN));
    assert!(
        (400..500).contains(&r.status),
        "a refused reload is not a success: {r:?}"
    );
    assert!(r.json["error"].is_string(), "a JSON error: {}", r.body);
    let message = r.json["message"].as_str().expect("a message");
    assert!(
        message.contains("levee.toml:14:") && message.contains("limit"),
        "the message names the file, line and field: {message}"
    );
    // The old rule stays in force.
    assert_eq!(limit_of(&node, "per-tenant"), Some(3));
    assert_limit_in_force(&node, "still-3", 3);
    assert!(
        reload_errors(&node) > errors_before,
        "levee_config_reloads_total{{result=\"error\"}} counts the failure"
    );
    assert_eq!(node.get("/readyz").status, 200, "still ready");
    // Fixed, it loads.
    node.write_config(&CONFIG.replace("limit = 3", "limit = 5"));
    let r = node.post_with_token("/admin/reload", Some(TOKEN));
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(limit_of(&node, "per-tenant"), Some(5));
}

#[test]
fn sighup_reloads_the_configuration() {
    let node = Node::start(CONFIG);
    node.write_config_unnoticed(&CONFIG.replace("limit = 3", "limit = 7"));
    node.signal("HUP");
    assert!(
        wait_until(WATCH_WAIT, || limit_of(&node, "per-tenant") == Some(7)),
        "SIGHUP did not reload; stderr:\n{}",
        node.stderr()
    );
    assert_limit_in_force(&node, "after-hup", 7);
    // An invalid file on SIGHUP is refused and counted; the node keeps serving.
    let errors_before = reload_errors(&node);
    node.write_config(INVALID);
    node.signal("HUP");
    assert!(
        wait_until(WATCH_WAIT, || reload_errors(&node) > errors_before),
        "the failed reload is counted"
    );
    assert_eq!(limit_of(&node, "per-tenant"), Some(7));
    assert_eq!(node.get("/healthz").status, 200);
}

#[test]
fn a_changed_file_is_reloaded_without_a_signal() {
    let node = Node::start(CONFIG);
    node.write_config(&CONFIG.replace("limit = 3", "limit = 7"));
    assert!(
        wait_until(WATCH_WAIT, || limit_of(&node, "per-tenant") == Some(7)),
        "the changed file was not picked up; stderr:\n{}",
        node.stderr()
    );
    assert_limit_in_force(&node, "watched", 7);
    // A broken edit is refused and counted, and the last good configuration stays.
    let errors_before = reload_errors(&node);
    node.write_config(INVALID);
    assert!(
        wait_until(WATCH_WAIT, || reload_errors(&node) > errors_before),
        "the invalid file was not noticed; stderr:\n{}",
        node.stderr()
    );
    assert_eq!(limit_of(&node, "per-tenant"), Some(7));
    // And the next good edit is picked up again.
    node.write_config(&CONFIG.replace("limit = 3", "limit = 2"));
    assert!(
        wait_until(WATCH_WAIT, || limit_of(&node, "per-tenant") == Some(2)),
        "the fixed file was not picked up"
    );
}

fn last_reload_success(node: &Node) -> Option<f64> {
    metric(&node.metrics(), "levee_config_last_reload_success", &[])
}

/// A bad edit that is reverted to the running content leaves nothing to reload, and the file
/// is again the running configuration: `levee_config_last_reload_success` is back to 1.
#[test]
fn a_reverted_bad_edit_counts_as_a_successful_reload() {
    let node = Node::start(CONFIG);
    let errors_before = reload_errors(&node);
    node.write_config(INVALID);
    assert!(
        wait_until(WATCH_WAIT, || reload_errors(&node) > errors_before),
        "the invalid file was not noticed; stderr:\n{}",
        node.stderr()
    );
    assert_eq!(last_reload_success(&node), Some(0.0));
    node.write_config(CONFIG);
    assert!(
        wait_until(WATCH_WAIT, || last_reload_success(&node) == Some(1.0)),
        "levee_config_last_reload_success stayed 0 after the revert; stderr:\n{}",
        node.stderr()
    );
    assert_eq!(limit_of(&node, "per-tenant"), Some(3));
    assert_eq!(reload_errors(&node), errors_before + 1.0);
}

#[test]
fn an_atomic_configmap_symlink_swap_is_reloaded() {
    let mut node = Node::start_configmap(CONFIG);
    let link = std::fs::symlink_metadata(node.config_path()).expect("levee.toml");
    assert!(link.file_type().is_symlink(), "levee.toml is a symlink");
    assert_eq!(limit_of(&node, "per-tenant"), Some(3));
    node.swap_configmap(&CONFIG.replace("limit = 3", "limit = 7"));
    assert!(
        wait_until(WATCH_WAIT, || limit_of(&node, "per-tenant") == Some(7)),
        "the ConfigMap swap was not picked up; stderr:\n{}",
        node.stderr()
    );
    assert_limit_in_force(&node, "configmap-1", 7);
    // A second swap, to a file of exactly the same size.
    node.swap_configmap(&CONFIG.replace("limit = 3", "limit = 4"));
    assert!(
        wait_until(WATCH_WAIT, || limit_of(&node, "per-tenant") == Some(4)),
        "the second ConfigMap swap was not picked up; stderr:\n{}",
        node.stderr()
    );
    assert_limit_in_force(&node, "configmap-2", 4);
}

#[test]
fn a_flood_of_unique_keys_keeps_memory_bounded_and_spares_keys_in_use() {
    const MAX_KEYS: u64 = 10_000;
    const BATCHES: usize = 200;
    const PER_BATCH: usize = 1_000;
    let node = Node::start(
        r#"
[node]
max_keys = 10000

[[rule]]
name = "flood"
algorithm = "fixed_window"
limit = 100
window = "1d"
"#,
    );
    let hot: Vec<String> = (0..5).map(|i| format!("hot-{i}")).collect();
    for (i, k) in hot.iter().enumerate() {
        assert!(node.check("flood", k, 3 + i as u64).allowed());
    }
    let hot_used: Vec<u64> = hot.iter().map(|k| node.used("flood", k)).collect();
    assert_eq!(hot_used, [3, 4, 5, 6, 7]);
    let rss_before = node.rss_kib();
    // The hot keys are read (cost 0: no tokens) between flood batches, as live traffic would.
    let touch: Vec<Value> = hot
        .iter()
        .map(|k| json!({ "rule": "flood", "key": k, "cost": 0 }))
        .collect();
    let touch = json!({ "checks": touch });
    let mut peak_keys = 0.0_f64;
    for b in 0..BATCHES {
        let mut body = String::with_capacity(PER_BATCH * 48);
        body.push_str(r#"{"checks":["#);
        for i in 0..PER_BATCH {
            if i > 0 {
                body.push(',');
            }
            body.push_str(&format!(
                r#"{{"rule":"flood","key":"flood-{}"}}"#,
                b * PER_BATCH + i
            ));
        }
        body.push_str("]}");
        let r = node.post_raw("/v1/check/batch", "application/json", body.as_bytes());
        assert_eq!(r.status, 200, "batch {b}: {}", r.body);
        assert_eq!(r.json["results"].as_array().map(Vec::len), Some(PER_BATCH));
        let r = node.post_json("/v1/check/batch", &touch);
        assert_eq!(r.status, 200, "{r:?}");
        if b % 20 == 19 {
            let keys = metric(&node.metrics(), "levee_keys", &[]).expect("levee_keys");
            peak_keys = peak_keys.max(keys);
            assert!(
                keys <= MAX_KEYS as f64,
                "levee_keys {keys} is over max_keys after batch {b}"
            );
        }
    }
    let m = node.metrics();
    let keys = metric(&m, "levee_keys", &[]).expect("levee_keys");
    assert!(keys <= MAX_KEYS as f64, "levee_keys {keys} > {MAX_KEYS}");
    assert!(
        peak_keys >= (MAX_KEYS - 100) as f64,
        "the store filled up to about max_keys: peak {peak_keys}"
    );
    let rss_after = node.rss_kib();
    assert!(
        rss_after < 300 * 1024,
        "RSS {rss_after} KiB after the flood (before: {rss_before} KiB) is over 300 MiB"
    );
    for (k, used) in hot.iter().zip(&hot_used) {
        assert_eq!(
            node.used("flood", k),
            *used,
            "{k}, in use during the flood, kept its count"
        );
    }
}

#[test]
fn quota_usage_survives_a_restart() {
    let mut node = Node::start(
        r#"
[node]
id = "q1"
data_dir = {data_dir}

[[rule]]
name = "quota"
algorithm = "quota"
limit = 1000
period = "month"

[[rule]]
name = "daily"
algorithm = "quota"
limit = 50
period = "day"
"#,
    );
    assert!(node.check("quota", "acme", 7).allowed());
    assert!(node.check("quota", "acme", 5).allowed());
    assert!(node.check("quota", "a/b c", 3).allowed());
    assert!(node.check("daily", "acme", 50).allowed());
    assert!(!node.check("daily", "acme", 1).allowed());
    let before: Vec<Value> = [("quota", "acme"), ("quota", "a/b c"), ("daily", "acme")]
        .iter()
        .map(|(r, k)| node.usage(r, k))
        .collect();
    node.restart();
    assert!(
        std::fs::read_dir(node.data_dir()).is_ok_and(|mut d| d.next().is_some()),
        "data_dir holds a snapshot"
    );
    assert_eq!(node.used("quota", "acme"), 12, "stderr:\n{}", node.stderr());
    assert_eq!(node.used("quota", "a/b c"), 3);
    assert_eq!(node.used("daily", "acme"), 50);
    let after: Vec<Value> = [("quota", "acme"), ("quota", "a/b c"), ("daily", "acme")]
        .iter()
        .map(|(r, k)| node.usage(r, k))
        .collect();
    for (b, a) in before.iter().zip(&after) {
        assert_eq!(
            (&b["used"], &b["remaining"], &b["limit"], &b["regions"]),
            (&a["used"], &a["remaining"], &a["limit"], &a["regions"]),
            "{b} vs {a}"
        );
    }
    // And it goes on counting from there.
    let r = node.check("quota", "acme", 1);
    assert!(r.allowed());
    assert_eq!(r.u64("remaining"), 1000 - 13);
    assert!(
        !node.check("daily", "acme", 1).allowed(),
        "the daily quota is still spent"
    );
}

#[test]
fn sigterm_stops_the_node_with_exit_code_0() {
    let mut node = Node::start(CONFIG);
    // A keep-alive connection stays open in the client's pool while the node stops.
    assert!(node.check("per-tenant", "acme", 1).allowed());
    let status = node.stop();
    assert_eq!(status.code(), Some(0), "stderr:\n{}", node.stderr());
}

/// Levee turns transparent huge pages off for its own process (docs/configuration.md), so
/// its allocator does not hold tens of megabytes of 2 MiB pages on hosts where they are
/// `always`. Linux reports the process flag as `THP_enabled` in /proc/PID/status (since 5.0).
#[test]
#[cfg(target_os = "linux")]
fn the_node_runs_with_transparent_huge_pages_off() {
    let node = Node::start(CONFIG);
    let status = std::fs::read_to_string(format!("/proc/{}/status", node.pid()))
        .expect("the node's /proc status");
    let field = status
        .lines()
        .find_map(|l| l.strip_prefix("THP_enabled:"))
        .map(str::trim);
    assert_eq!(
        field,
        Some("0"),
        "THP_enabled in /proc/{}/status",
        node.pid()
    );
}

#[test]
fn config_check_accepts_a_valid_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("good.toml");
    std::fs::write(&path, CONFIG.replace("{http}", "\"127.0.0.1:8750\"")).expect("write");
    let out = levee()
        .args(["config", "check"])
        .arg(&path)
        .output()
        .expect("run levee");
    assert_eq!(
        out.status.code(),
        Some(0),
        "stdout: {}\nstderr: {}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn config_check_rejects_an_invalid_file_naming_file_line_and_field() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cases = [
        (INVALID.replace("{http}", "\"127.0.0.1:8750\""), 14, "limit"),
        (
            "[node]\nid = \"a\"\n\n[[rule]]\nname = \"x\"\nalgorithm = \"token_bucket\"\nrate = 0\nper = \"1s\"\n".to_owned(),
            7,
            "rate",
        ),
        ("[api]\nmax_body = \"1MiB\"\nbogus = 1\n".to_owned(), 3, "bogus"),
        (
            "[[rule]]\nname = \"x\"\nalgorithm = \"fixed_window\"\nlimit = \"ten\"\nwindow = \"1s\"\n".to_owned(),
            4,
            "limit",
        ),
    ];
    for (i, (text, line, field)) in cases.iter().enumerate() {
        let path = dir.path().join(format!("bad-{i}.toml"));
        std::fs::write(&path, text).expect("write");
        let out = levee()
            .args(["config", "check"])
            .arg(&path)
            .output()
            .expect("run levee");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "case {i}: stderr: {stderr}");
        let place = format!("{}:{line}:", path.display());
        assert!(
            stderr.contains(&place) && stderr.contains(field),
            "case {i}: stderr should name {place} and {field}: {stderr}"
        );
    }
    let missing = dir.path().join("missing.toml");
    let out = levee()
        .args(["config", "check"])
        .arg(&missing)
        .output()
        .expect("run levee");
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("missing.toml"));
}

#[test]
fn check_command_prints_a_readable_decision_and_exits_0_allowed_1_denied() {
    let node = Node::start(CONFIG);
    let run = |key: &str, cost: &str| {
        let out = levee()
            .args([
                "check",
                "--url",
                &node.url(),
                "--rule",
                "per-tenant",
                "--key",
                key,
                "--cost",
                cost,
            ])
            .output()
            .expect("run levee check");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, stdout, stderr) = run("acme", "2");
    assert_eq!(code, Some(0), "allowed: {stdout} {stderr}");
    let line = stdout.trim();
    assert_eq!(line.lines().count(), 1, "one line: {stdout}");
    assert!(line.to_lowercase().contains("allow"), "{line}");
    assert!(
        line.contains("per-tenant") && line.contains("acme"),
        "{line}"
    );
    assert!(
        line.contains('1') && line.contains('3'),
        "remaining 1 of 3: {line}"
    );
    assert_eq!(node.used("per-tenant", "acme"), 2);
    let (code, _, _) = run("acme", "1");
    assert_eq!(code, Some(0));
    let (code, stdout, stderr) = run("acme", "1");
    assert_eq!(code, Some(1), "denied: {stdout} {stderr}");
    let line = stdout.trim();
    assert!(line.to_lowercase().contains("denied"), "{line}");
    assert!(
        line.contains("per-tenant") && line.contains("acme"),
        "{line}"
    );
    assert_eq!(node.used("per-tenant", "acme"), 3);
    // An error is neither allowed nor denied.
    let out = levee()
        .args([
            "check",
            "--url",
            &node.url(),
            "--rule",
            "nope",
            "--key",
            "acme",
        ])
        .output()
        .expect("run levee check");
    assert!(!out.status.success());
    assert_ne!(out.status.code(), Some(1), "an error is not a denial");
    assert!(String::from_utf8_lossy(&out.stderr).contains("nope"));
}

/// Optimistic mode was removed (docs/accuracy.md): a configuration that names it is refused
/// with the field, its line and the replacement; `strict`, and no `mode` at all, are
/// accepted; any other value is refused naming the only mode.
#[test]
fn a_cluster_in_the_removed_optimistic_mode_is_refused_naming_the_replacement() {
    let config = |mode: &str| {
        format!(
            "[node]\nid = \"eu-1\"\nregion = \"eu\"\n\n[cluster]\n{mode}\nregions = {{ eu = 1, us = 1 }}\n\
             tls = {{ ca = \"ca.pem\", cert = \"eu-1.pem\", key = \"eu-1.key\" }}\n\n\
             [[cluster.node]]\nid = \"eu-1\"\nregion = \"eu\"\naddr = \"127.0.0.1:8751\"\n\n\
             [[cluster.node]]\nid = \"us-1\"\nregion = \"us\"\naddr = \"127.0.0.1:8753\"\n"
        )
    };
    let (code, out) = levee_blackbox::config_check(&config("mode = \"optimistic\""));
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains(":6: cluster.mode:"),
        "file, line and field: {out}"
    );
    assert!(
        out.contains("\"optimistic\" was removed") && out.contains("use mode = \"strict\""),
        "the reason and the replacement: {out}"
    );
    let (code, out) = levee_blackbox::config_check(&config("mode = \"eventual\""));
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains("cluster.mode") && out.contains("the only mode is \"strict\""),
        "{out}"
    );
    for accepted in ["mode = \"strict\"", ""] {
        let (code, out) = levee_blackbox::config_check(&config(accepted));
        assert_eq!(code, Some(0), "{accepted:?}: {out}");
    }
}
