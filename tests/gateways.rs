//! A real gateway in front of a real backend, both from Debian packages, asking a real node
//! through `/v1/authz/{rule}`: nginx with `auth_request`, and Caddy with `forward_auth`. A
//! client sees the backend's 200s until the limit, then the deny with the rate-limit headers
//! passed through.
//!
//! `.ci/run` installs `nginx` and `caddy` (`apt-get install nginx caddy`); the tests start
//! their own instances on free loopback ports in temporary directories and stop them when
//! done.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use levee_blackbox::{Node, free_port, wait_until};

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
        Command::new(nginx_binary())
            .arg("-c")
            .arg(&path)
            .arg("-p")
            .arg(dir.path()),
    );
    client_sees_the_limit(gateway, limit, true);
}

#[test]
fn caddy_forward_auth_passes_requests_until_the_limit_then_the_deny_with_headers() {
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
        Command::new("caddy")
            .args(["run", "--adapter", "caddyfile", "--config"])
            .arg(&path)
            .env("HOME", &home)
            .env("XDG_DATA_HOME", &home)
            .env("XDG_CONFIG_HOME", &home),
    );
    client_sees_the_limit(gateway, limit, false);
}

/// nginx is in /usr/sbin, which a non-root PATH may lack.
fn nginx_binary() -> &'static str {
    if Path::new("/usr/sbin/nginx").exists() {
        "/usr/sbin/nginx"
    } else {
        "nginx"
    }
}
