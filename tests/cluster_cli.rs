//! `levee cluster add | remove | restart` against a running `levee cluster`: a node added to a
//! region joins the list every node agrees on and decides checks; removed, it is gone from
//! the others' lists and its ports are free; restarted, it answers again; bad requests are
//! refused naming what is wrong, and a directory where no cluster runs says so.

use std::fs::File;
use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use levee_blackbox::{levee, levee_binary, send_signal, text, wait_until};
use serde_json::Value;

/// `count` consecutive free ports for a cluster of this file (its own block of ports).
fn free_range(count: u16) -> u16 {
    levee_blackbox::free_port_range(24_000, count)
}

/// A `levee cluster` process in its own directory, stopped (SIGTERM, then SIGKILL) and reaped
/// on drop; SIGTERM stops its nodes.
struct Running {
    child: Child,
    dir: tempfile::TempDir,
    base: u16,
    /// Its stdout and stderr, in a directory of their own.
    out: tempfile::TempDir,
}

impl Running {
    /// `levee cluster --regions eu,us --nodes-per-region 1` on free ports, in a directory of
    /// its own; returns once it has announced itself.
    fn start() -> Running {
        let base = free_range(8);
        let dir = tempfile::tempdir().expect("a directory");
        let out = tempfile::tempdir().expect("a directory");
        let (stdout, stderr) = (out.path().join("stdout"), out.path().join("stderr"));
        let child = Command::new(levee_binary())
            .args(["cluster", "--regions", "eu,us", "--nodes-per-region", "1"])
            .args(["--base-port", &base.to_string(), "--dir"])
            .arg(dir.path())
            .stdin(Stdio::null())
            .stdout(File::create(&stdout).expect("stdout"))
            .stderr(File::create(&stderr).expect("stderr"))
            .spawn()
            .expect("start levee cluster");
        let running = Running {
            child,
            dir,
            base,
            out,
        };
        assert!(
            wait_until(Duration::from_secs(60), || running
                .stdout()
                .contains("try:")),
            "the cluster did not come up:\n{}\n{}",
            running.stdout(),
            read(&running.out.path().join("stderr"))
        );
        running
    }

    fn stdout(&self) -> String {
        read(&self.out.path().join("stdout"))
    }

    fn dir(&self) -> &str {
        self.dir.path().to_str().expect("utf-8")
    }

    /// `levee cluster ARGS --dir DIR`, to its end.
    fn ctl(&self, args: &[&str]) -> Output {
        levee()
            .arg("cluster")
            .args(args)
            .args(["--dir", self.dir()])
            .stdin(Stdio::null())
            .output()
            .expect("run levee cluster")
    }

    /// The HTTP port of the node at list position `k`.
    fn http(&self, k: u16) -> u16 {
        self.base + 2 * k
    }

    /// `GET /v1/cluster` of the node at position `k`.
    fn status(&self, k: u16) -> Value {
        let url = format!("http://127.0.0.1:{}/v1/cluster", self.http(k));
        let mut r = ureq::get(&url)
            .call()
            .unwrap_or_else(|e| panic!("GET {url}: {e}"));
        serde_json::from_str(&r.body_mut().read_to_string().expect("a body")).expect("JSON")
    }

    /// Whether `levee cluster` still runs.
    fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        levee_blackbox::stop_child(&mut self.child, Duration::from_secs(20));
    }
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_default()
}

/// Exit code, stdout and stderr, for the assertion messages.
fn outcome(out: &Output) -> (Option<i32>, String, String) {
    (out.status.code(), text(&out.stdout), text(&out.stderr))
}

/// Every one of `statuses` runs one list, sees it agreed and is not bounded by another.
fn agreed(statuses: &[&Value]) -> bool {
    statuses
        .iter()
        .all(|s| s["membership"]["agreed"] == true && s["membership"]["bounded"] == false)
        && statuses
            .windows(2)
            .all(|w| w[0]["membership"]["digest"] == w[1]["membership"]["digest"])
}

/// `id`'s state among the peers of a `/v1/cluster` answer, if listed.
fn peer_state(status: &Value, id: &str) -> Option<String> {
    status["peers"]
        .as_array()?
        .iter()
        .find(|p| p["id"] == id)
        .map(|p| p["state"].as_str().unwrap_or("?").to_owned())
}

#[test]
fn a_node_added_to_a_running_cluster_joins_its_list_and_decides_then_leaves_when_removed() {
    let mut c = Running::start();
    let (eu1, us1, eu2) = (0, 1, 2);

    let out = c.ctl(&["add", "--region", "eu"]);
    let (code, stdout, stderr) = outcome(&out);
    assert_eq!(code, Some(0), "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(
        stdout.contains(&format!(
            "laid out eu-2 (http 127.0.0.1:{}, quic 127.0.0.1:{})",
            c.http(eu2),
            c.http(eu2) + 1
        )) && stdout.contains("started eu-2 (pid ")
            && stdout.contains("agreed: digest ")
            && stdout.contains("on 3 nodes"),
        "{stdout}"
    );
    // The new node runs the list the others run, agreed.
    let (a, b, new) = (c.status(eu1), c.status(us1), c.status(eu2));
    assert_eq!(new["node"]["id"], "eu-2", "{new}");
    assert!(agreed(&[&a, &b, &new]), "{a}\n{b}\n{new}");
    assert_eq!(peer_state(&a, "eu-2").as_deref(), Some("active"), "{a}");
    // It decides checks of the rules every node runs.
    let rule = &levee_node::Config::embedded().rules[0].name;
    let r = ureq::post(&format!("http://127.0.0.1:{}/v1/check", c.http(eu2)))
        .header("content-type", "application/json")
        .send(format!(r#"{{"rule":"{rule}","key":"acme"}}"#))
        .expect("a check on eu-2");
    assert_eq!(r.status().as_u16(), 200);

    let out = c.ctl(&["remove", "eu-2"]);
    let (code, stdout, stderr) = outcome(&out);
    assert_eq!(code, Some(0), "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(
        stdout.contains("eu-2 left: handed over ")
            && stdout.contains("stopped eu-2 (exit status: 0)")
            && stdout.contains("on 2 nodes"),
        "{stdout}"
    );
    let (a, b) = (c.status(eu1), c.status(us1));
    assert!(agreed(&[&a, &b]), "{a}\n{b}");
    assert_ne!(
        a["membership"]["digest"], new["membership"]["digest"],
        "the list did not change"
    );
    for s in [&a, &b] {
        let state = peer_state(s, "eu-2");
        assert!(
            state.is_none() || state.as_deref() == Some("gone"),
            "eu-2 is {state:?}: {s}"
        );
    }
    assert!(
        read(&c.dir.path().join("eu-1.toml")).contains("id = \"eu-2\"\nregion = \"eu\"\naddr")
            && read(&c.dir.path().join("eu-1.toml")).contains("removed = true"),
        "eu-2 is not marked removed in eu-1's file"
    );
    // Its ports are free again; the cluster runs on.
    assert!(
        wait_until(Duration::from_secs(10), || TcpListener::bind((
            "127.0.0.1",
            c.http(eu2)
        ))
        .is_ok()),
        "eu-2 still holds its port"
    );
    assert!(
        c.is_running(),
        "the cluster stopped with eu-2:\n{}",
        c.stdout()
    );

    // A node restarted answers again, on the same list.
    let out = c.ctl(&["restart", "us-1"]);
    let (code, stdout, stderr) = outcome(&out);
    assert_eq!(code, Some(0), "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(
        stdout.contains("stopped us-1") && stdout.contains("us-1 restarted (pid "),
        "{stdout}"
    );
    let (a2, b2) = (c.status(eu1), c.status(us1));
    assert!(agreed(&[&a2, &b2]), "{a2}\n{b2}");
    assert_eq!(a2["membership"]["digest"], a["membership"]["digest"]);
    assert!(
        c.is_running(),
        "the cluster stopped with us-1:\n{}",
        c.stdout()
    );

    // Stopped, it removes its socket.
    assert!(send_signal(c.child.id(), "TERM"));
    assert!(wait_until(Duration::from_secs(30), || !c.is_running()));
    assert_eq!(c.child.wait().expect("status").code(), Some(0));
    assert!(!c.dir.path().join("control.sock").exists());
}

#[test]
fn bad_requests_are_refused_with_exit_2_naming_what_is_wrong_and_change_nothing() {
    let mut c = Running::start();
    let before = read(&c.dir.path().join("eu-1.toml"));

    let out = c.ctl(&["add", "--region", "xx"]);
    let (code, stdout, stderr) = outcome(&out);
    assert_eq!(code, Some(2), "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(
        stderr.contains("region \"xx\" is not one of this cluster's regions (eu, us)"),
        "{stderr}"
    );

    let out = c.ctl(&["remove", "nope"]);
    let (code, stdout, stderr) = outcome(&out);
    assert_eq!(code, Some(2), "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(
        stderr.contains("no node \"nope\" in this cluster (its nodes: eu-1, us-1)"),
        "{stderr}"
    );

    let out = c.ctl(&["remove", "eu-1"]);
    let (code, stdout, stderr) = outcome(&out);
    assert_eq!(code, Some(2), "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(
        stderr.contains("eu-1 is the last node of region eu"),
        "{stderr}"
    );

    // clap's own usage errors exit 2 as well.
    let out = c.ctl(&["add"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));

    assert_eq!(read(&c.dir.path().join("eu-1.toml")), before);
    assert!(c.is_running(), "{}", c.stdout());
    assert!(agreed(&[&c.status(0), &c.status(1)]));
}

#[test]
fn a_change_where_no_cluster_runs_says_so_with_exit_1() {
    let dir = tempfile::tempdir().expect("a directory");
    let d = dir.path().to_str().expect("utf-8");
    let out = levee()
        .args(["cluster", "add", "--region", "eu", "--dir", d])
        .output()
        .expect("run levee cluster add");
    let (code, stdout, stderr) = outcome(&out);
    assert_eq!(code, Some(1), "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(
        stderr.contains(&format!(
            "no levee cluster is running in {d} (no {d}/control.sock)"
        )),
        "{stderr}"
    );

    // A socket left by a cluster that did not stop cleanly: nothing answers on it.
    drop(std::os::unix::net::UnixListener::bind(dir.path().join("control.sock")).expect("bind"));
    let out = levee()
        .args(["cluster", "remove", "eu-2", "--dir", d])
        .output()
        .expect("run levee cluster remove");
    let (code, stdout, stderr) = outcome(&out);
    assert_eq!(code, Some(1), "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(
        stderr.contains(&format!("no levee cluster is running in {d}")),
        "{stderr}"
    );
}
