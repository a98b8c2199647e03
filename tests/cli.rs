//! The `levee` command as a user meets it: `levee cluster`'s refusals (a taken port, a
//! duplicate region, a port range past 65535) and how it ends when a node dies; and the log
//! lines of `levee serve` when stderr is not a terminal.

use std::fs::File;
use std::net::{TcpListener, UdpSocket};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use levee_blackbox::{free_port, levee, levee_binary, send_signal, text, wait_until};

/// `count` consecutive free ports for a cluster of this file (its own block of ports).
fn free_range(count: u16) -> u16 {
    levee_blackbox::free_port_range(20_000, count)
}

/// `levee cluster ARGS`, to its end (it exits by itself in these tests).
fn cluster(args: &[&str]) -> Output {
    levee()
        .arg("cluster")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run levee cluster")
}

#[test]
fn cluster_with_a_taken_http_port_names_the_port_and_node_and_starts_nothing() {
    let base = free_range(4);
    // Something else holds eu-2's HTTP port (TCP).
    let _holder = TcpListener::bind(("127.0.0.1", base + 2)).expect("hold the port");
    let dir = tempfile::tempdir().expect("a directory");
    let out = cluster(&[
        "--regions",
        "eu",
        "--base-port",
        &base.to_string(),
        "--dir",
        dir.path().to_str().expect("utf-8"),
    ]);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(
        out.status.code(),
        Some(1),
        "stdout:\n{stdout}\nstderr:\n{stderr}"
    );
    assert!(
        stderr.contains(&format!("port {}", base + 2)) && stderr.contains("eu-2"),
        "{stderr}"
    );
    assert!(
        !stdout.contains("try:"),
        "announced a cluster that failed:\n{stdout}"
    );
    assert!(!stderr.contains("kill:"), "{stderr}");
    assert_eq!(
        std::fs::read_dir(dir.path()).expect("read dir").count(),
        0,
        "files written before the check"
    );
}

#[test]
fn cluster_with_a_taken_quic_port_names_the_port_and_node() {
    let base = free_range(4);
    // Something holds eu-1's QUIC port (UDP) only: a TCP probe would not see it.
    let _holder = UdpSocket::bind(("127.0.0.1", base + 1)).expect("hold the port");
    let out = cluster(&["--regions", "eu", "--base-port", &base.to_string()]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!("port {}", base + 1))
            && stderr.contains("QUIC")
            && stderr.contains("eu-1"),
        "{stderr}"
    );
}

#[test]
fn cluster_refuses_a_region_named_twice() {
    let base = free_range(4);
    let out = cluster(&[
        "--regions",
        "eu,eu",
        "--nodes-per-region",
        "1",
        "--base-port",
        &base.to_string(),
    ]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("--regions") && stderr.contains("\"eu\" is given twice"),
        "{stderr}"
    );
}

#[test]
fn cluster_refuses_a_base_port_whose_range_passes_65535_before_writing_anything() {
    let dir = tempfile::tempdir().expect("a directory");
    let out = cluster(&[
        "--base-port",
        "65535",
        "--dir",
        dir.path().to_str().expect("utf-8"),
    ]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("--base-port 65535") && stderr.contains("65546"),
        "{stderr}"
    );
    assert_eq!(
        std::fs::read_dir(dir.path()).expect("read dir").count(),
        0,
        "certificates written before the check"
    );
}

/// A `levee cluster` process, stopped (SIGTERM, then SIGKILL) and reaped on drop.
struct Running {
    child: Child,
}

impl Drop for Running {
    fn drop(&mut self) {
        levee_blackbox::stop_child(&mut self.child, Duration::from_secs(20));
    }
}

#[test]
fn a_node_that_dies_stops_the_cluster_with_its_name_its_log_and_exit_1() {
    let base = free_range(4);
    let out_dir = tempfile::tempdir().expect("a directory");
    let (stdout_path, stderr_path) = (out_dir.path().join("stdout"), out_dir.path().join("stderr"));
    let rules = out_dir.path().join("rules.toml");
    std::fs::write(
        &rules,
        "[[rule]]\nname = \"daily\"\nalgorithm = \"quota\"\nlimit = 600\nperiod = \"day\"\n",
    )
    .expect("rules");
    let mut running = Running {
        child: Command::new(levee_binary())
            .args([
                "cluster",
                "--regions",
                "eu",
                "--base-port",
                &base.to_string(),
                "--config",
            ])
            .arg(&rules)
            .stdin(Stdio::null())
            .stdout(File::create(&stdout_path).expect("stdout"))
            .stderr(File::create(&stderr_path).expect("stderr"))
            .spawn()
            .expect("start levee cluster"),
    };
    let read = |p: &Path| std::fs::read_to_string(p).unwrap_or_default();
    assert!(
        wait_until(Duration::from_secs(60), || read(&stdout_path)
            .contains("try:")),
        "the cluster did not come up:\n{}\n{}",
        read(&stdout_path),
        read(&stderr_path)
    );
    // The check it suggests is of a rule the nodes run.
    let stdout = read(&stdout_path);
    assert!(
        stdout.contains(r#"-d '{"rule":"daily","key":"acme"}'"#),
        "{stdout}"
    );
    // The table gives every node's pid.
    let pid: u32 = stdout
        .lines()
        .find(|l| l.split_whitespace().nth(1) == Some("eu-2"))
        .and_then(|l| l.split_whitespace().nth(4))
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no pid for eu-2 in\n{stdout}"));
    assert!(send_signal(pid, "KILL"), "kill eu-2 ({pid})");
    assert!(
        wait_until(Duration::from_secs(30), || matches!(
            running.child.try_wait(),
            Ok(Some(_))
        )),
        "the cluster kept running without eu-2"
    );
    let status = running.child.wait().expect("status");
    let stderr = read(&stderr_path);
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("node eu-2") && stderr.contains("SIGKILL"),
        "does not say which node died and how:\n{stderr}"
    );
    // The tail of its log, read before the temporary directory went.
    assert!(
        stderr.contains("levee is serving"),
        "no log lines:\n{stderr}"
    );
    assert!(
        !stderr.contains("kill:") && !stderr.contains("No such process"),
        "{stderr}"
    );
    // eu-1 was stopped: its port is free again.
    assert!(
        wait_until(Duration::from_secs(10), || TcpListener::bind((
            "127.0.0.1",
            base
        ))
        .is_ok()),
        "eu-1 still holds its port"
    );
}

/// A configuration of one rule, serving HTTP on a free port, in `dir`: its path and port.
fn small_config(dir: &Path) -> (std::path::PathBuf, u16) {
    let config = dir.join("levee.toml");
    let port = free_port();
    std::fs::write(
        &config,
        format!(
            "[node]\nhttp = \"127.0.0.1:{port}\"\n\n[[rule]]\nname = \"r\"\nalgorithm = \"fixed_window\"\nlimit = 5\nwindow = \"1m\"\n"
        ),
    )
    .expect("config");
    (config, port)
}

/// Starts `levee serve` with stderr to a file (not a terminal), waits for its first lines,
/// stops it, and returns what it wrote.
fn serve_log(extra: &[&str]) -> String {
    let dir = tempfile::tempdir().expect("a directory");
    let (config, _) = small_config(dir.path());
    serve_log_with(&config, extra, &[])
}

/// [`serve_log`] of `levee serve --config CONFIG EXTRA` with `env` set.
fn serve_log_with(config: &Path, extra: &[&str], env: &[(&str, &str)]) -> String {
    let dir = tempfile::tempdir().expect("a directory");
    let log = dir.path().join("stderr.log");
    let child = Command::new(levee_binary())
        .arg("serve")
        .arg("--config")
        .arg(config)
        .args(extra)
        .envs(env.iter().copied())
        .env("LEVEE_LOG", "info")
        .env_remove("NO_COLOR")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(File::create(&log).expect("log"))
        .spawn()
        .expect("start levee serve");
    let mut running = Running { child };
    let read = || std::fs::read_to_string(&log).unwrap_or_default();
    let up = wait_until(Duration::from_secs(20), || read().contains("serving"));
    send_signal(running.child.id(), "TERM");
    let _ = wait_until(Duration::from_secs(20), || {
        matches!(running.child.try_wait(), Ok(Some(_)))
    });
    drop(running);
    let text = read();
    assert!(up, "levee serve did not log that it serves:\n{text}");
    text
}

#[test]
fn human_logs_carry_no_colour_codes_when_stderr_is_not_a_terminal() {
    let log = serve_log(&[]);
    assert!(
        !log.contains('\u{1b}'),
        "ANSI escape codes in a log file:\n{log:?}"
    );
    assert!(log.contains("INFO"), "{log}");
}

#[test]
fn json_logs_are_one_object_per_line_without_colour_codes() {
    let log = serve_log(&["--log-format", "json"]);
    assert!(
        !log.contains('\u{1b}'),
        "ANSI escape codes in a log file:\n{log:?}"
    );
    let lines: Vec<&str> = log.lines().filter(|l| !l.is_empty()).collect();
    assert!(!lines.is_empty());
    for line in &lines {
        let v: serde_json::Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("not a JSON object ({e}): {line}"));
        assert!(v["level"].is_string() && v["message"].is_string(), "{line}");
    }
    assert!(
        lines.iter().any(|l| l.contains("\"levee is serving\"")),
        "{log}"
    );
}

/// A bad `LEVEE_BACKGROUND_THREADS` stops `levee serve` before it binds anything, naming the
/// variable and what it must be; a good one serves.
#[test]
fn serve_refuses_a_bad_background_thread_count_and_binds_nothing() {
    let dir = tempfile::tempdir().expect("a directory");
    let (config, port) = small_config(dir.path());
    for bad in ["0", "two", "-1", "100000"] {
        let out = levee()
            .args(["serve", "--config"])
            .arg(&config)
            .env("LEVEE_BACKGROUND_THREADS", bad)
            .stdin(Stdio::null())
            .output()
            .expect("run levee serve");
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{bad:?}: {err}");
        assert!(
            err.contains("LEVEE_BACKGROUND_THREADS: must be an integer from 1 to 1024")
                && err.contains(&format!("{bad:?}")),
            "{bad:?}: {err}"
        );
        assert!(
            TcpListener::bind(("127.0.0.1", port)).is_ok(),
            "{bad:?}: the port was taken"
        );
    }
    let log = serve_log_with(&config, &[], &[("LEVEE_BACKGROUND_THREADS", "1")]);
    assert!(log.contains("serving"), "{log}");
}
