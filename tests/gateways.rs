//! A real gateway in front of a real backend, both from Debian packages, asking a real node
//! through `/v1/authz/{rule}`: nginx with `auth_request`, and Caddy with `forward_auth`. A
//! client sees the backend's 200s until the limit, then the deny with the rate-limit headers
//! passed through.
//!
//! `.ci/run` installs `nginx` and `caddy` (`apt-get install nginx caddy`); the tests start
//! their own instances on free loopback ports in temporary directories and stop them when
//! done.
//!
//! Where a gateway is not installed its test is skipped, and says so on stderr
//! (`SKIPPED: nginx not found …`, printed past the test harness's capture); with
//! `LEVEE_REQUIRE_GATEWAYS=1` (as `.ci/run` sets it) a missing gateway fails the test instead.
//! `LEVEE_NGINX` and `LEVEE_CADDY` name the binaries to use (default: found on `PATH`, or in
//! `/usr/sbin`, which a non-root `PATH` may lack).

use std::io::Write as _;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use levee_blackbox::{Node, free_port, wait_until};

/// The gateway binary `name` (`nginx`, `caddy`): `LEVEE_<NAME>` if set, else the first on
/// `PATH`, else in `/usr/sbin` or `/usr/local/sbin`. `None` when it is missing and the test
/// should be skipped (after printing why); panics when it is missing and
/// `LEVEE_REQUIRE_GATEWAYS=1`.
fn gateway(name: &str) -> Option<PathBuf> {
    let var = format!("LEVEE_{}", name.to_uppercase());
    let (found, looked) = match std::env::var_os(&var) {
        Some(p) => {
            let p = PathBuf::from(p);
            let looked = format!("{} (from {var})", p.display());
            (p.is_file().then_some(p), looked)
        }
        None => {
            let mut dirs: Vec<PathBuf> = std::env::var_os("PATH")
                .map(|p| std::env::split_paths(&p).collect())
                .unwrap_or_default();
            dirs.extend(["/usr/sbin", "/usr/local/sbin"].map(PathBuf::from));
            let found = dirs.iter().map(|d| d.join(name)).find(|p| p.is_file());
            (found, "on PATH, /usr/sbin or /usr/local/sbin".to_owned())
        }
    };
    if found.is_some() {
        return found;
    }
    let why = format!(
        "{name} not found ({looked}); install it with `apt-get install {name}` (.ci/run does)"
    );
    if std::env::var_os("LEVEE_REQUIRE_GATEWAYS").is_some_and(|v| v == "1") {
        panic!("{why}; LEVEE_REQUIRE_GATEWAYS=1 requires it");
    }
    // Straight to the process's stderr: the test harness captures `eprintln!` of a test that
    // passes, and a skip must be seen.
    let _ = writeln!(
        std::io::stderr(),
        "SKIPPED: {why}; set LEVEE_REQUIRE_GATEWAYS=1 to make this a failure"
    );
    None
}

/// A process stopped (and reaped) when dropped.
struct Process {
    child: Child,
}

impl Process {
    fn spawn(name: &'static str, cmd: &mut Command) -> Process {
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot start {name} ({e}); install it with `apt-get install {name}` (as .ci/run does)")
            });
        Process { child }
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn rule_config(limit: u64) -> String {
    format!(
        "[[rule]]\nname = \"per-key\"\nalgorithm = \"fixed_window\"\nlimit = {limit}\nwindow = \"1h\"\nkey_from = \"header:x-api-key\"\n"
    )
}

struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

fn get(port: u16, key: &str) -> Option<Answer> {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(5)))
        .build()
        .into();
    let resp = agent
        .get(format!("http://127.0.0.1:{port}/"))
        .header("x-api-key", key)
        .call()
        .ok()?;
    let status = resp.status().as_u16();
    let headers = resp
        .headers()
        .iter()
        .map(|(k, v)| {
            (
                k.as_str().to_owned(),
                String::from_utf8_lossy(v.as_bytes()).into_owned(),
            )
        })
        .collect();
    let body = resp.into_body().read_to_string().ok()?;
    Some(Answer {
        status,
        headers,
        body,
    })
}

/// Sends requests through the gateway until the limit, then one more, and checks what the
/// client sees. `allowed_headers`: whether the gateway passes the headers on allowed answers.
fn client_sees_the_limit(gateway: u16, limit: u64, allowed_headers: bool) {
    assert!(
        wait_until(Duration::from_secs(10), || get(gateway, "warm-up")
            .is_some_and(|a| a.status == 200)),
        "the gateway did not come up"
    );
    for i in 0..limit {
        let a = get(gateway, "tenant-a").expect("the gateway answers");
        assert_eq!(a.status, 200, "request {i} within the limit");
        assert!(
            a.body.contains("hello from the backend"),
            "the backend answered: {:?}",
            a.body
        );
        if allowed_headers {
            assert_eq!(
                a.header("x-ratelimit-limit"),
                Some(limit.to_string().as_str())
            );
            assert_eq!(
                a.header("x-ratelimit-remaining"),
                Some((limit - 1 - i).to_string().as_str())
            );
            assert_eq!(
                a.header("ratelimit-policy"),
                Some(format!("\"per-key\";q={limit};w=3600").as_str())
            );
        }
    }
    let denied = get(gateway, "tenant-a").expect("the gateway answers");
    assert_eq!(denied.status, 429, "past the limit: {:?}", denied.body);
    assert!(
        !denied.body.contains("hello from the backend"),
        "the backend was not reached"
    );
    assert_eq!(
        denied.header("x-ratelimit-limit"),
        Some(limit.to_string().as_str())
    );
    assert_eq!(denied.header("x-ratelimit-remaining"), Some("0"));
    let retry: u64 = denied
        .header("retry-after")
        .expect("Retry-After on the deny")
        .parse()
        .unwrap();
    assert!((1..=3600).contains(&retry), "Retry-After {retry}");
    assert!(
        denied
            .header("ratelimit")
            .is_some_and(|v| v.starts_with("\"per-key\";r=0;t="))
    );
    // Another tenant is not affected.
    assert_eq!(
        get(gateway, "tenant-b")
            .expect("the gateway answers")
            .status,
        200
    );
}

#[test]
fn nginx_auth_request_passes_requests_until_the_limit_then_the_deny_with_headers() {
    let Some(nginx) = gateway("nginx") else {
        return;
    };
    let limit = 4;
    let node = Node::start(&rule_config(limit));
    let dir = tempfile::tempdir().unwrap();
    let (backend, gateway) = (free_port(), free_port());
    let d = dir.path().display();
    let levee = node.port();
    // nginx's auth_request passes only 401 and 403 through, hence `deny_status=403`; the
    // gateway turns it back into a 429 and passes the rate-limit headers on.
    let headers = "add_header X-RateLimit-Limit $rl_limit always;\n\
        add_header X-RateLimit-Remaining $rl_remaining always;\n\
        add_header X-RateLimit-Reset $rl_reset always;\n\
        add_header RateLimit-Policy $rl_policy always;\n\
        add_header RateLimit $rl always;";
    let conf = format!(
        r#"worker_processes 1;
master_process off;
daemon off;
pid {d}/nginx.pid;
error_log {d}/error.log warn;
events {{ worker_connections 256; }}
http {{
  access_log off;
  client_body_temp_path {d}/body;
  proxy_temp_path {d}/proxy;
  fastcgi_temp_path {d}/fastcgi;
  uwsgi_temp_path {d}/uwsgi;
  scgi_temp_path {d}/scgi;
  server {{
    listen 127.0.0.1:{backend};
    location / {{ return 200 "hello from the backend\n"; }}
  }}
  server {{
    listen 127.0.0.1:{gateway};
    location / {{
      auth_request /_levee;
      auth_request_set $rl_limit $upstream_http_x_ratelimit_limit;
      auth_request_set $rl_remaining $upstream_http_x_ratelimit_remaining;
      auth_request_set $rl_reset $upstream_http_x_ratelimit_reset;
      auth_request_set $rl_policy $upstream_http_ratelimit_policy;
      auth_request_set $rl $upstream_http_ratelimit;
      auth_request_set $rl_retry $upstream_http_retry_after;
      {headers}
      error_page 403 = @ratelimited;
      proxy_pass http://127.0.0.1:{backend};
    }}
    location = /_levee {{
      internal;
      proxy_pass http://127.0.0.1:{levee}/v1/authz/per-key?deny_status=403;
      proxy_pass_request_body off;
      proxy_set_header Content-Length "";
    }}
    location @ratelimited {{
      {headers}
      add_header Retry-After $rl_retry always;
      default_type application/json;
      return 429 '{{"error":"rate_limited"}}';
    }}
  }}
}}
"#
    );
    let path = dir.path().join("nginx.conf");
    std::fs::write(&path, conf).unwrap();
    let _nginx = Process::spawn(
        "nginx",
        Command::new(&nginx)
            .arg("-c")
            .arg(&path)
            .arg("-p")
            .arg(dir.path()),
    );
    client_sees_the_limit(gateway, limit, true);
}

#[test]
fn caddy_forward_auth_passes_requests_until_the_limit_then_the_deny_with_headers() {
    let Some(caddy) = gateway("caddy") else {
        return;
    };
    let limit = 3;
    let node = Node::start(&rule_config(limit));
    let dir = tempfile::tempdir().unwrap();
    let (backend, gateway) = (free_port(), free_port());
    let levee = node.port();
    // On a deny, forward_auth returns Levee's answer (status, headers, body) to the client.
    let caddyfile = format!(
        "{{\n\tadmin off\n\tauto_https off\n}}\n\
         http://:{backend} {{\n\tbind 127.0.0.1\n\trespond \"hello from the backend\" 200\n}}\n\
         http://:{gateway} {{\n\tbind 127.0.0.1\n\tforward_auth 127.0.0.1:{levee} {{\n\t\turi /v1/authz/per-key\n\t\tcopy_headers X-RateLimit-Limit X-RateLimit-Remaining\n\t}}\n\treverse_proxy 127.0.0.1:{backend}\n}}\n"
    );
    let path = dir.path().join("Caddyfile");
    std::fs::write(&path, caddyfile).unwrap();
    let home = dir.path().join("home");
    let _caddy = Process::spawn(
        "caddy",
        Command::new(&caddy)
            .args(["run", "--adapter", "caddyfile", "--config"])
            .arg(&path)
            .env("HOME", &home)
            .env("XDG_DATA_HOME", &home)
            .env("XDG_CONFIG_HOME", &home),
    );
    client_sees_the_limit(gateway, limit, false);
}

/// Runs one gateway test of this file in a child process of this test executable with its
/// gateway pointed at a path that does not exist; returns its exit success and its output.
fn run_without(test: &str, var: &str, require: bool) -> (bool, String) {
    let mut cmd = Command::new(std::env::current_exe().expect("this test executable"));
    cmd.args([test, "--exact", "--test-threads=1"])
        .env(var, "/nonexistent/levee-test/gateway")
        .env_remove("LEVEE_REQUIRE_GATEWAYS");
    if require {
        cmd.env("LEVEE_REQUIRE_GATEWAYS", "1");
    }
    let out = cmd.output().expect("run the test executable");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[test]
fn a_missing_gateway_is_reported_as_skipped_and_fails_when_required() {
    for (name, var, test) in [
        (
            "nginx",
            "LEVEE_NGINX",
            "nginx_auth_request_passes_requests_until_the_limit_then_the_deny_with_headers",
        ),
        (
            "caddy",
            "LEVEE_CADDY",
            "caddy_forward_auth_passes_requests_until_the_limit_then_the_deny_with_headers",
        ),
    ] {
        let (ok, out) = run_without(test, var, false);
        assert!(
            ok,
            "a missing {name} failed the test instead of skipping it:\n{out}"
        );
        assert!(
            out.contains(&format!("SKIPPED: {name} not found")),
            "the skip of {test} is silent:\n{out}"
        );
        assert!(out.contains("1 passed"), "{test} did not run:\n{out}");
        let (ok, out) = run_without(test, var, true);
        assert!(
            !ok,
            "LEVEE_REQUIRE_GATEWAYS=1 let a missing {name} pass:\n{out}"
        );
        assert!(out.contains(&format!("{name} not found")), "{out}");
    }
}

/// When each request of the comparison is sent, in ms from the start: two bursts of eight,
/// 5 ms apart, the second 2,750 ms after the first — half an emission interval (500 ms at
/// 2 r/s) away from every boundary nginx and Levee decide on, so that scheduling jitter of up
/// to about 250 ms cannot change a decision.
fn shaping_schedule() -> Vec<u64> {
    (0..8)
        .map(|i| i * 5)
        .chain((0..8).map(|i| 2_750 + i * 5))
        .collect()
}

/// A decision of the comparison: refused, or admitted after `k` emission intervals (0: at
/// once). A wait is compared in whole intervals, rounded up, because both sides measure it
/// from their own clock; nginx and Levee agree on it exactly (levee-core's
/// `tests/leaky_bucket.rs`) when they see the same times.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Shaped {
    Now,
    After(u64),
    Refused,
}

#[test]
fn leaky_bucket_decides_as_nginx_limit_req_burst_delay_on_the_same_requests() {
    let Some(nginx) = gateway("nginx") else {
        return;
    };
    // nginx `limit_req zone=… burst=5 delay=2` at 2r/s, and the same figures in Levee.
    let (rate, burst, delay, interval_ms) = (2u64, 5u64, 2u64, 500u64);
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display();
    std::fs::create_dir_all(dir.path().join("www")).unwrap();
    std::fs::write(dir.path().join("www/index.html"), "ok\n").unwrap();
    let port = free_port();
    // Delays are logged one level below refusals: `info` with `limit_req_log_level notice`.
    let conf = format!(
        r#"worker_processes 1;
master_process off;
daemon off;
pid {d}/nginx.pid;
error_log {d}/error.log info;
events {{ worker_connections 256; }}
http {{
  access_log off;
  client_body_temp_path {d}/body;
  proxy_temp_path {d}/proxy;
  fastcgi_temp_path {d}/fastcgi;
  uwsgi_temp_path {d}/uwsgi;
  scgi_temp_path {d}/scgi;
  limit_req_zone $http_x_api_key zone=shape:1m rate={rate}r/s;
  limit_req_log_level notice;
  limit_req_status 429;
  server {{
    listen 127.0.0.1:{port};
    location / {{
      limit_req zone=shape burst={burst} delay={delay};
      root {d}/www;
    }}
  }}
}}
"#
    );
    let path = dir.path().join("nginx.conf");
    std::fs::write(&path, conf).unwrap();
    let _nginx = Process::spawn(
        "nginx",
        Command::new(&nginx)
            .arg("-c")
            .arg(&path)
            .arg("-p")
            .arg(dir.path()),
    );
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(10)))
        .build()
        .into();
    let url = format!("http://127.0.0.1:{port}/index.html");
    assert!(
        wait_until(Duration::from_secs(10), || agent
            .get(&url)
            .header("x-api-key", "warm-up")
            .call()
            .is_ok_and(|r| r.status() == 200)),
        "nginx did not come up"
    );

    // nginx: every request on its own connection, at its time; a delayed one is held.
    let start = std::time::Instant::now();
    let senders: Vec<_> = shaping_schedule()
        .into_iter()
        .map(|at| {
            let (agent, url) = (agent.clone(), url.clone());
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(at).saturating_sub(start.elapsed()));
                let r = agent.get(&url).header("x-api-key", "acme").call().unwrap();
                r.status().as_u16()
            })
        })
        .collect();
    let statuses: Vec<u16> = senders.into_iter().map(|s| s.join().unwrap()).collect();
    let log = std::fs::read_to_string(dir.path().join("error.log")).unwrap();
    // "delaying request, excess: 2.995, by zone "shape"": the wait is (excess − delay) / rate.
    let mut theirs: Vec<Shaped> = log
        .lines()
        .filter_map(|l| l.split("delaying request, excess: ").nth(1))
        .map(|rest| {
            let excess: f64 = rest.split(',').next().unwrap().parse().unwrap();
            let wait_ms = (excess - delay as f64) * 1000.0 / rate as f64;
            Shaped::After((wait_ms / interval_ms as f64).ceil() as u64)
        })
        .collect();
    let passed = statuses.iter().filter(|&&s| s == 200).count();
    assert_eq!(
        passed + statuses.iter().filter(|&&s| s == 429).count(),
        statuses.len(),
        "nginx answered 200 or 429: {statuses:?}"
    );
    theirs.extend(std::iter::repeat_n(Shaped::Now, passed - theirs.len()));
    theirs.extend(std::iter::repeat_n(
        Shaped::Refused,
        statuses.len() - passed,
    ));

    // Levee: the same requests at the same times.
    let node = Node::start(&format!(
        "[[rule]]\nname = \"shape\"\nalgorithm = \"leaky_bucket\"\nrate = {rate}\nper = \"1s\"\nburst = {burst}\ndelay = {delay}\n"
    ));
    let start = std::time::Instant::now();
    let mut ours: Vec<Shaped> = shaping_schedule()
        .into_iter()
        .map(|at| {
            std::thread::sleep(Duration::from_millis(at).saturating_sub(start.elapsed()));
            let r = node.check("shape", "acme", 1);
            match (r.allowed(), r.u64("delay_ms")) {
                (false, _) => Shaped::Refused,
                (true, 0) => Shaped::Now,
                (true, ms) => Shaped::After(ms.div_ceil(interval_ms)),
            }
        })
        .collect();
    theirs.sort();
    ours.sort();
    assert_eq!(ours, theirs, "nginx log:\n{log}");
    // What the schedule makes of it: per burst, the first at once (with `delay` more), then
    // waits of one, two, three intervals, the rest refused.
    assert_eq!(ours.iter().filter(|s| **s == Shaped::Refused).count(), 5);
}
