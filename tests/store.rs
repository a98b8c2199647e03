//! The node's key store under attack and its snapshots on a damaged disk, against a real
//! `levee serve`: a flood of unique keys (dry-run and charged) does not reset a key near its
//! limit and stays within `max_keys`; a corrupt snapshot is moved aside and the node serves;
//! a `data_dir` that cannot hold snapshots fails `config check` and start-up; a final
//! snapshot that fails makes the process exit non-zero.

use std::process::Stdio;
use std::time::{Duration, Instant};

use levee_blackbox::{Node, levee, metric};

const MAX_KEYS: usize = 1_000;

/// A small store, a daily and a monthly quota (the victims' rules), and another rule.
const FLOODED: &str = r#"
[node]
max_keys = 1000

[[rule]]
name = "daily"
algorithm = "quota"
limit = 1000
period = "day"

[[rule]]
name = "monthly"
algorithm = "quota"
limit = 1000
period = "month"

[[rule]]
name = "other"
algorithm = "fixed_window"
limit = 10
window = "1d"
"#;

/// One batch of checks on unique keys `prefix-<from..from+n>`.
fn flood_batch(node: &Node, rule: &str, prefix: &str, from: usize, n: usize, dry_run: bool) {
    let mut body = String::with_capacity(n * 64);
    body.push_str(r#"{"checks":["#);
    for i in from..from + n {
        if i > from {
            body.push(',');
        }
        body.push_str(&format!(
            r#"{{"rule":"{rule}","key":"{prefix}-{i}","cost":1,"dry_run":{dry_run}}}"#
        ));
    }
    body.push_str("]}");
    let r = node.post_raw("/v1/check/batch", "application/json", body.as_bytes());
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json["results"].as_array().map(Vec::len), Some(n));
}

fn keys_held(node: &Node) -> f64 {
    metric(&node.metrics(), "levee_keys", &[]).expect("levee_keys")
}

/// The issue's attack: 20,000 dry-run checks dropped a daily key at 900 of 1,000 back to 0,
/// 10,000 charged checks on another rule reset a monthly quota charged 500. Now a flood of
/// 10 × `max_keys` unique keys of each kind evicts its own kind.
#[test]
fn a_flood_of_unique_keys_does_not_reset_a_key_near_its_limit() {
    let node = Node::start(FLOODED);
    assert!(node.check("daily", "victim", 900).allowed());
    assert!(node.check("monthly", "victim", 500).allowed());
    let floods: [(&str, &str, bool); 4] = [
        ("daily", "dry", true),      // dry runs on the victim's rule
        ("other", "real", false),    // charged checks on another rule
        ("daily", "charged", false), // charged checks on the victim's rule
        ("other", "read", true),     // dry runs on another rule
    ];
    for (rule, prefix, dry_run) in floods {
        for b in 0..10 {
            flood_batch(&node, rule, prefix, b * MAX_KEYS, MAX_KEYS, dry_run);
            let held = keys_held(&node);
            assert!(
                held <= MAX_KEYS as f64,
                "levee_keys {held} is over max_keys during the {prefix} flood"
            );
        }
        assert_eq!(
            node.used("daily", "victim"),
            900,
            "after the {prefix} flood"
        );
        assert_eq!(
            node.used("monthly", "victim"),
            500,
            "after the {prefix} flood"
        );
    }
    let m = node.metrics();
    let evicted = metric(&m, "levee_keys_evicted_total", &[]).unwrap_or(0.0);
    // 20,000 charged keys went through a store of 1,000 (the dry runs created none).
    assert!(
        evicted >= (20_000 - MAX_KEYS) as f64 && evicted <= 20_000.0,
        "levee_keys_evicted_total {evicted}"
    );
    // The victim is still limited where it was.
    let r = node.check("daily", "victim", 100);
    assert!(r.allowed());
    assert_eq!(r.u64("remaining"), 0);
    assert!(!node.check("daily", "victim", 1).allowed());
    // A new key after the flood is answered normally and counted.
    let r = node.check("daily", "newcomer", 7);
    assert!(r.allowed());
    assert_eq!(r.u64("remaining"), 1000 - 7);
    assert_eq!(node.used("daily", "newcomer"), 7);
    assert!(keys_held(&node) <= MAX_KEYS as f64);
}

/// Dry runs and checks of cost 0 create no key: the store stays empty.
#[test]
fn reads_create_no_key() {
    let node = Node::start(FLOODED);
    flood_batch(&node, "daily", "dry", 0, 500, true);
    let r = node.check("daily", "cost-zero", 0);
    assert!(r.allowed());
    assert_eq!(r.u64("remaining"), 1000);
    let r = node.post_json(
        "/v1/check",
        &serde_json::json!({"all": [{"rule": "daily", "key": "a"}, {"rule": "monthly", "key": "b"}], "dry_run": true}),
    );
    assert_eq!(r.status, 200, "{r:?}");
    let r = node.post_json(
        "/v1/refund",
        &serde_json::json!({"rule": "daily", "key": "never-charged", "cost": 3}),
    );
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(keys_held(&node), 0.0);
    assert_eq!(node.used("daily", "never-charged"), 0);
}

const PERSISTED: &str = r#"
[node]
id = "s1"
data_dir = {data_dir}

[[rule]]
name = "monthly"
algorithm = "quota"
limit = 1000
period = "month"
"#;

/// Files in `data_dir` named `snapshot.bin.corrupt-<digits>`.
fn moved_aside(node: &Node) -> Vec<String> {
    std::fs::read_dir(node.data_dir())
        .expect("data_dir")
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| {
            n.strip_prefix("snapshot.bin.corrupt-")
                .is_some_and(|t| !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()))
        })
        .collect()
}

#[test]
fn an_edited_snapshot_is_moved_aside_and_the_node_serves_from_empty() {
    let mut node = Node::start(PERSISTED);
    assert!(node.check("monthly", "acme", 300).allowed());
    let status = node.stop();
    assert!(status.success(), "stderr:\n{}", node.stderr());
    let path = node.data_dir().join("snapshot.bin");
    let mut bytes = std::fs::read(&path).expect("a snapshot");
    // The counter's last byte: an edit that still decodes.
    let last = bytes.len() - 1;
    bytes[last] ^= 0x01;
    std::fs::write(&path, &bytes).expect("written");
    node.start_again();
    let aside = moved_aside(&node);
    assert_eq!(aside.len(), 1, "moved aside: {aside:?}");
    assert_eq!(
        std::fs::read(node.data_dir().join(&aside[0])).expect("the moved file"),
        bytes
    );
    assert_eq!(
        node.used("monthly", "acme"),
        0,
        "nothing was loaded from it"
    );
    assert!(node.check("monthly", "acme", 1).allowed());
    assert_eq!(
        metric(&node.metrics(), "levee_snapshot_corrupt_total", &[]),
        Some(1.0)
    );
    let stderr = node.stderr();
    assert!(
        stderr.contains("moved aside") && stderr.contains(&aside[0]) && stderr.contains("EMPTY"),
        "the log says what happened and where the file went:\n{stderr}"
    );
    // The next snapshot is good again.
    node.restart();
    assert_eq!(node.used("monthly", "acme"), 1);
}

/// A path under a regular file can never be a directory, even for root.
fn impossible_data_dir(dir: &std::path::Path) -> std::path::PathBuf {
    let file = dir.join("a-file");
    std::fs::write(&file, b"not a directory").expect("written");
    file.join("data")
}

#[test]
fn a_data_dir_that_cannot_hold_snapshots_fails_config_check_and_start_up() {
    let tmp = tempfile::tempdir().expect("a temporary directory");
    let data_dir = impossible_data_dir(tmp.path());
    let config = tmp.path().join("levee.toml");
    std::fs::write(
        &config,
        format!(
            "[node]\nhttp = \"127.0.0.1:{}\"\ndata_dir = {:?}\n\n[[rule]]\nname = \"r\"\nalgorithm = \"quota\"\nlimit = 5\nperiod = \"day\"\n",
            levee_blackbox::free_port(),
            data_dir.display().to_string()
        ),
    )
    .expect("written");
    let out = levee()
        .args(["config", "check"])
        .arg(&config)
        .output()
        .expect("levee config check");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "config check passed:\n{stderr}");
    assert!(
        stderr.contains("node.data_dir") && stderr.contains(&data_dir.display().to_string()),
        "the error names the setting and the path:\n{stderr}"
    );
    let mut child = levee()
        .args(["serve", "--config"])
        .arg(&config)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("levee serve");
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("levee serve kept running on a data_dir it cannot write");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let out = child.wait_with_output().expect("output");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!status.success(), "levee serve exited 0:\n{stderr}");
    assert!(
        stderr.contains("node.data_dir") && stderr.contains(&data_dir.display().to_string()),
        "the error names the setting and the path:\n{stderr}"
    );
}

#[test]
fn a_failed_final_snapshot_makes_the_process_exit_non_zero() {
    let mut node = Node::start(PERSISTED);
    assert!(node.check("monthly", "acme", 3).allowed());
    // The data directory becomes a regular file: the final snapshot cannot be written.
    let data_dir = node.data_dir();
    if data_dir.exists() {
        std::fs::remove_dir_all(&data_dir).expect("removed");
    }
    std::fs::write(&data_dir, b"in the way").expect("written");
    let status = node.stop();
    let stderr = node.stderr();
    assert!(!status.success(), "exited {status}:\n{stderr}");
    assert!(
        stderr.contains("final snapshot failed"),
        "the error says so:\n{stderr}"
    );
}
