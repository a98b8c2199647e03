//! A harness for black-box tests of the `levee` binary: it starts real `levee serve`
//! processes on free loopback ports, talks to them over real HTTP, and stops them on drop.
//!
//! A test gives [`Node::start`] a TOML configuration. The harness fills in `[node] http` with a
//! free port: write `http = {http}` where it belongs, or leave `http` out and the harness adds
//! it to the `[node]` table (creating the table if there is none). `{data_dir}` stands for a
//! directory inside the node's temporary directory.
//!
//! Every [`Node`] owns its temporary directory and its process: dropping it sends SIGTERM,
//! waits a little, kills the process if it is still there, and removes the directory.
//!
//! [`cluster`] starts a multi-region cluster of such processes (the cluster tests and the
//! chaos suite use it).

use std::fs::File;
use std::io::Write as _;
use std::net::{TcpListener, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::{Duration, Instant};

use serde_json::Value;
use tempfile::TempDir;

pub mod cluster;

/// How long a node may take to answer `/readyz` with 200.
const READY_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a node may take to exit after SIGTERM.
const STOP_TIMEOUT: Duration = Duration::from_secs(15);

/// The `levee` binary: `target/<profile>/levee` beside this test's executable, built if
/// need be (see [`find_levee_binary`]); panics if it cannot be had.
pub fn levee_binary() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| find_levee_binary().unwrap_or_else(|e| panic!("the levee binary: {e}")))
}

/// The `levee` binary beside the running executable: `target/<profile>/levee` (a test
/// executable lives in `target/<profile>/deps/`, a runner such as `levee-chaos` in
/// `target/<profile>/`). `LEVEE_BIN` overrides the path.
///
/// When run by cargo (`cargo test`, `cargo run`: `CARGO` is set), which does not build other
/// packages' binaries, or when the binary is missing, it first runs `cargo build -p levee
/// --bin levee` for the same profile into the same target directory, so a run never uses a
/// stale binary; that is a no-op when it is up to date.
pub fn find_levee_binary() -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os("LEVEE_BIN") {
        return Ok(PathBuf::from(p));
    }
    let exe = std::env::current_exe().map_err(|e| format!("the executable's path: {e}"))?;
    let mut profile_dir = exe
        .parent()
        .ok_or("the executable has no directory")?
        .to_owned();
    if profile_dir.file_name().is_some_and(|n| n == "deps") {
        profile_dir = profile_dir
            .parent()
            .ok_or("deps/ has no parent")?
            .to_owned();
    }
    let bin = profile_dir.join(format!("levee{}", std::env::consts::EXE_SUFFIX));
    let cargo = std::env::var_os("CARGO");
    if cargo.is_some() || !bin.exists() {
        build_levee(&profile_dir, cargo.unwrap_or_else(|| "cargo".into()))?;
        if !bin.exists() {
            return Err(format!(
                "cargo built levee but {} does not exist",
                bin.display()
            ));
        }
    }
    Ok(bin)
}

fn build_levee(profile_dir: &Path, cargo: std::ffi::OsString) -> Result<(), String> {
    let mut cmd = Command::new(cargo);
    cmd.args(["build", "--quiet", "-p", "levee", "--bin", "levee"]);
    match profile_dir.file_name().and_then(|n| n.to_str()) {
        Some("debug") | None => {}
        Some("release") => {
            cmd.arg("--release");
        }
        Some(other) => {
            cmd.args(["--profile", other]);
        }
    }
    if let Some(target_dir) = profile_dir.parent() {
        cmd.arg("--target-dir").arg(target_dir);
    }
    // Under `cargo test` this process carries the variables cargo sets for *this* package
    // (`CARGO_MANIFEST_DIR` …). Build scripts that track them (ring's does) would see them
    // change between this build and a plain `cargo build`, and rebuild half the tree every
    // time; the nested build gets the environment a shell would give it.
    for (name, _) in std::env::vars_os() {
        let Some(name) = name.to_str() else { continue };
        if matches!(
            name,
            "CARGO_MANIFEST_DIR"
                | "CARGO_MANIFEST_PATH"
                | "CARGO_CRATE_NAME"
                | "CARGO_PRIMARY_PACKAGE"
                | "CARGO_TARGET_TMPDIR"
                | "CARGO_BIN_NAME"
                | "OUT_DIR"
        ) || name.starts_with("CARGO_PKG_")
            || name.starts_with("CARGO_BIN_EXE_")
        {
            cmd.env_remove(name);
        }
    }
    let status = cmd
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .status()
        .map_err(|e| format!("cannot run cargo to build levee: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!(
            "`cargo build -p levee --bin levee` failed: {status}"
        ))
    }
}

/// A `levee` command (not a node): `levee config check …`, `levee check …`.
pub fn levee() -> Command {
    Command::new(levee_binary())
}

/// Runs `levee config check` on a file holding `text`: its exit code, and its stderr then
/// stdout.
pub fn config_check(text: &str) -> (Option<i32>, String) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = dir.path().join("levee.toml");
    std::fs::write(&path, text).expect("write the configuration");
    let out = levee()
        .args(["config", "check"])
        .arg(&path)
        .output()
        .expect("run levee config check");
    (
        out.status.code(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stderr),
            String::from_utf8_lossy(&out.stdout)
        ),
    )
}

/// Polls `cond` every 20 ms until it holds or `timeout` passes; returns whether it held.
pub fn wait_until(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// If the current window of `window_ms` (aligned to the Unix epoch, as the nodes' windows
/// are) ends within `margin_ms`, waits until the next one has begun: a test that counts in
/// one window must not see it roll over.
pub fn avoid_window_edge(window_ms: u64, margin_ms: u64) {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("the clock is after 1970")
        .as_millis() as u64;
    let left = window_ms - now % window_ms;
    if left < margin_ms {
        std::thread::sleep(Duration::from_millis(left + 100));
    }
}

/// A port on 127.0.0.1 that was free a moment ago.
pub fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    l.local_addr().expect("local address").port()
}

/// A base port, from `floor` up (below 32000, under the ephemeral range), from which `count`
/// consecutive ports are free for TCP and UDP on 127.0.0.1 a moment ago. Every call starts
/// from its own block (by process and call), so tests running at once do not pick the same
/// ports; give each test file its own `floor`.
pub fn free_port_range(floor: u16, count: u16) -> u16 {
    static CALLS: AtomicU16 = AtomicU16::new(0);
    let call = CALLS.fetch_add(1, Ordering::Relaxed);
    let start = floor + (std::process::id() % 500) as u16 * 16 + call * 400 % 4_000;
    let mut base = start;
    loop {
        let all_free = (base..base + count).all(|p| {
            TcpListener::bind(("127.0.0.1", p)).is_ok() && UdpSocket::bind(("127.0.0.1", p)).is_ok()
        });
        if all_free {
            return base;
        }
        base += count;
        assert!(base < 32_000, "no {count} free ports from {start}");
    }
}

/// Bytes (a process's output) as text, invalid UTF-8 replaced.
pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Percent-encodes one path segment (everything but unreserved characters).
pub fn encode_segment(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The value of a Prometheus sample `name{labels}` in exposition text, if present. The label
/// set must match exactly (in any order).
pub fn metric(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    samples(text)
        .into_iter()
        .find(|s| {
            s.name == name
                && s.labels.len() == labels.len()
                && labels
                    .iter()
                    .all(|(k, v)| s.labels.iter().any(|(k2, v2)| k2 == k && v2 == v))
        })
        .map(|s| s.value)
}

/// One sample of Prometheus text exposition.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// The metric name.
    pub name: String,
    /// Its labels, in the order written.
    pub labels: Vec<(String, String)>,
    /// Its value.
    pub value: f64,
}

/// Every sample of a Prometheus text exposition (comments skipped).
pub fn samples(text: &str) -> Vec<Sample> {
    let mut out = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (series, value) = match line.rsplit_once(' ') {
            Some(p) => p,
            None => continue,
        };
        let Ok(value) = value.parse::<f64>() else {
            continue;
        };
        let (name, labels) = match series.split_once('{') {
            None => (series.to_owned(), Vec::new()),
            Some((name, rest)) => (
                name.to_owned(),
                parse_labels(rest.strip_suffix('}').unwrap_or(rest)),
            ),
        };
        out.push(Sample {
            name,
            labels,
            value,
        });
    }
    out
}

fn parse_labels(s: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut rest = s;
    while let Some((k, after)) = rest.split_once("=\"") {
        let mut value = String::new();
        let mut chars = after.char_indices();
        let mut end = after.len();
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => {
                    if let Some((_, n)) = chars.next() {
                        value.push(match n {
                            'n' => '\n',
                            other => other,
                        });
                    }
                }
                '"' => {
                    end = i + 1;
                    break;
                }
                c => value.push(c),
            }
        }
        out.push((k.trim_start_matches(',').trim().to_owned(), value));
        rest = &after[end..];
    }
    out
}

/// An HTTP answer.
#[derive(Debug, Clone)]
pub struct Reply {
    /// The status code.
    pub status: u16,
    /// Headers, names in lower case.
    pub headers: Vec<(String, String)>,
    /// The body as text.
    pub body: String,
    /// The body as JSON (`Null` if it is not JSON).
    pub json: Value,
}

impl Reply {
    /// Reads a whole answer (body up to 64 MiB).
    pub fn read(resp: ureq::http::Response<ureq::Body>) -> Result<Reply, ureq::Error> {
        let status = resp.status().as_u16();
        let headers = resp
            .headers()
            .iter()
            .map(|(k, v)| {
                (
                    k.as_str().to_ascii_lowercase(),
                    String::from_utf8_lossy(v.as_bytes()).into_owned(),
                )
            })
            .collect();
        let body = resp
            .into_body()
            .with_config()
            .limit(64 << 20)
            .read_to_string()?;
        let json = serde_json::from_str(&body).unwrap_or(Value::Null);
        Ok(Reply {
            status,
            headers,
            body,
            json,
        })
    }

    /// The first value of header `name` (any case).
    pub fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers
            .iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.as_str())
    }

    /// Header `name` parsed as an integer; panics if it is missing or not one.
    pub fn header_u64(&self, name: &str) -> u64 {
        let v = self
            .header(name)
            .unwrap_or_else(|| panic!("no {name} header in {self:?}"));
        v.parse()
            .unwrap_or_else(|_| panic!("{name}: {v:?} is not an integer"))
    }

    /// JSON field `field` as an integer; panics if it is missing or not one.
    pub fn u64(&self, field: &str) -> u64 {
        self.json[field]
            .as_u64()
            .unwrap_or_else(|| panic!("no integer {field:?} in {}", self.body))
    }

    /// JSON field `allowed`; panics if it is missing.
    pub fn allowed(&self) -> bool {
        self.json["allowed"]
            .as_bool()
            .unwrap_or_else(|| panic!("no boolean \"allowed\" in {}", self.body))
    }

    /// Asserts this is the JSON error `status`/`code` whose message contains `needle`.
    #[track_caller]
    pub fn assert_error(&self, status: u16, code: &str, needle: &str) {
        assert_eq!(self.status, status, "status of {self:?}");
        assert_eq!(
            self.header("content-type")
                .map(|v| v.starts_with("application/json")),
            Some(true),
            "an error is JSON: {self:?}"
        );
        assert_eq!(self.json["error"], code, "error code of {}", self.body);
        let message = self.json["message"]
            .as_str()
            .unwrap_or_else(|| panic!("no message in {}", self.body));
        assert!(
            message.contains(needle),
            "the message {message:?} should name {needle:?}"
        );
    }
}

/// How the configuration file is laid out on disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Layout {
    /// `<dir>/levee.toml`, a plain file.
    Plain,
    /// A Kubernetes ConfigMap mount: `levee.toml -> ..data/levee.toml`, `..data -> ..<version>`.
    ConfigMap,
}

/// A running `levee serve` process with its own temporary directory.
pub struct Node {
    child: Option<Child>,
    dir: TempDir,
    config_path: PathBuf,
    port: u16,
    layout: Layout,
    configmap_version: u32,
    agent: ureq::Agent,
}

impl Node {
    /// Starts a node on `config` (see the module docs for `{http}` and `{data_dir}`) and waits
    /// until `/readyz` answers 200.
    pub fn start(config: &str) -> Node {
        Node::start_with(config, Layout::Plain)
    }

    /// Like [`Node::start`], with the configuration mounted the way a Kubernetes ConfigMap is:
    /// `levee.toml -> ..data/levee.toml` and `..data -> ..2026_v1`.
    pub fn start_configmap(config: &str) -> Node {
        Node::start_with(config, Layout::ConfigMap)
    }

    fn start_with(config: &str, layout: Layout) -> Node {
        let dir = tempfile::Builder::new()
            .prefix("levee-blackbox-")
            .tempdir()
            .expect("a temporary directory");
        let config_path = dir.path().join("levee.toml");
        let mut node = Node {
            child: None,
            dir,
            config_path,
            port: 0,
            layout,
            configmap_version: 0,
            agent: new_agent(),
        };
        // Another process may take the free port between the probe and the node's bind: retry.
        for attempt in 1..=5 {
            node.port = free_port();
            let text = node.render(config);
            match layout {
                Layout::Plain => write_file(&node.config_path, &text),
                Layout::ConfigMap => node.swap_configmap_rendered(&text),
            }
            match node.spawn() {
                Ok(()) => return node,
                Err(stderr) if attempt < 5 && stderr.contains("cannot listen") => continue,
                Err(stderr) => panic!("levee serve did not become ready:\n{stderr}"),
            }
        }
        unreachable!("the loop returns or panics")
    }

    /// Fills in `{http}` and `{data_dir}`.
    fn render(&self, template: &str) -> String {
        let http = format!("\"127.0.0.1:{}\"", self.port);
        let data_dir = toml_string(&self.data_dir());
        let mut text = template.to_owned();
        if !text.contains("{http}") {
            text = match text.lines().position(|l| l.trim() == "[node]") {
                Some(i) => {
                    let mut lines: Vec<&str> = text.lines().collect();
                    lines.insert(i + 1, "http = {http}");
                    lines.join("\n") + "\n"
                }
                None => format!("[node]\nhttp = {{http}}\n\n{text}"),
            };
        }
        text.replace("{http}", &http)
            .replace("{data_dir}", &data_dir)
    }

    /// Spawns the process and waits for readiness; on failure returns its stderr.
    fn spawn(&mut self) -> Result<(), String> {
        let stdout = File::create(self.dir.path().join("stdout.log")).expect("stdout.log");
        let stderr = File::create(self.dir.path().join("stderr.log")).expect("stderr.log");
        let child = Command::new(levee_binary())
            .arg("serve")
            .arg("--config")
            .arg(&self.config_path)
            .env("LEVEE_LOG", "info")
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(stderr)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", levee_binary().display()));
        self.child = Some(child);
        self.agent = new_agent();
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                self.child = None;
                return Err(format!(
                    "levee serve exited with {status} before it was ready; stderr:\n{}",
                    self.stderr()
                ));
            }
            if self.try_get("/readyz").is_some_and(|r| r.status == 200) {
                return Ok(());
            }
            if Instant::now() >= deadline {
                self.terminate();
                return Err(format!(
                    "levee serve did not answer /readyz with 200 within {READY_TIMEOUT:?}; stderr:\n{}",
                    self.stderr()
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The node's HTTP port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The process id; panics if the node is not running.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("the node is running").id()
    }

    /// The node's temporary directory.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The directory `{data_dir}` stands for.
    pub fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// The configuration path given to `levee serve --config`.
    pub fn config_path(&self) -> &Path {
        &self.config_path
    }

    /// What the node wrote to stderr so far.
    pub fn stderr(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("stderr.log")).unwrap_or_default()
    }

    /// Replaces the configuration file in place (rendered like the one the node started with).
    pub fn write_config(&self, config: &str) {
        assert_eq!(
            self.layout,
            Layout::Plain,
            "use swap_configmap for a ConfigMap"
        );
        write_file(&self.config_path, &self.render(config));
    }

    /// Replaces the configuration file in place but gives it back its old modification time,
    /// the way `cp -p` or `rsync -t` can: the node's file watcher, which looks at the file's
    /// metadata, does not notice, so only an explicit reload (SIGHUP, `/admin/reload`) applies
    /// it. The new text must be as long as the old one.
    pub fn write_config_unnoticed(&self, config: &str) {
        assert_eq!(
            self.layout,
            Layout::Plain,
            "use swap_configmap for a ConfigMap"
        );
        let text = self.render(config);
        let old = std::fs::metadata(&self.config_path).expect("the configuration's metadata");
        assert_eq!(
            old.len(),
            text.len() as u64,
            "write_config_unnoticed needs a text of the same length"
        );
        let mtime = old.modified().expect("mtime");
        // Same length: overwrite in place without truncating, so the size never changes.
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .truncate(false)
            .open(&self.config_path)
            .expect("open the configuration");
        f.write_all(text.as_bytes())
            .expect("write the configuration");
        f.set_modified(mtime)
            .expect("restore the modification time");
    }

    /// Publishes a new ConfigMap version the way the kubelet does: writes `..<version>/`, points
    /// a fresh `..data_tmp` symlink at it and renames it over `..data` (one atomic step).
    pub fn swap_configmap(&mut self, config: &str) {
        assert_eq!(
            self.layout,
            Layout::ConfigMap,
            "the node was not started with a ConfigMap"
        );
        let text = self.render(config);
        self.swap_configmap_rendered(&text);
    }

    fn swap_configmap_rendered(&mut self, text: &str) {
        self.configmap_version += 1;
        let root = self.dir.path();
        let version = format!("..2026_v{}", self.configmap_version);
        std::fs::create_dir(root.join(&version)).expect("create the ConfigMap version dir");
        write_file(&root.join(&version).join("levee.toml"), text);
        let tmp = root.join("..data_tmp");
        let _ = std::fs::remove_file(&tmp);
        std::os::unix::fs::symlink(&version, &tmp).expect("symlink ..data_tmp");
        std::fs::rename(&tmp, root.join("..data")).expect("rename ..data_tmp over ..data");
        let link = root.join("levee.toml");
        if std::fs::symlink_metadata(&link).is_err() {
            std::os::unix::fs::symlink("..data/levee.toml", &link).expect("symlink levee.toml");
        }
    }

    /// Sends a signal (`"TERM"`, `"HUP"` …) to the node with `kill(1)`.
    pub fn signal(&self, signal: &str) {
        let pid = self.pid();
        assert!(send_signal(pid, signal), "kill -{signal} {pid} failed");
    }

    /// SIGTERM, then waits (bounded) for the process to exit; returns its exit status.
    pub fn stop(&mut self) -> ExitStatus {
        let mut child = self.child.take().expect("the node is running");
        assert!(
            send_signal(child.id(), "TERM"),
            "kill -TERM {} failed",
            child.id()
        );
        let deadline = Instant::now() + STOP_TIMEOUT;
        loop {
            if let Some(status) = child.try_wait().expect("wait for levee") {
                return status;
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "levee did not exit within {STOP_TIMEOUT:?} of SIGTERM; stderr:\n{}",
                    self.stderr()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Stops the node (SIGTERM, wait for exit) and starts it again on the same configuration,
    /// port and data directory.
    pub fn restart(&mut self) {
        let status = self.stop();
        assert!(
            status.success(),
            "levee exited with {status} on SIGTERM; stderr:\n{}",
            self.stderr()
        );
        self.start_again();
    }

    /// Starts a stopped node again on the same configuration, port and data directory.
    pub fn start_again(&mut self) {
        assert!(self.child.is_none(), "the node is running");
        // The port was ours a moment ago; give the kernel a few tries to hand it back.
        let mut last = String::new();
        for _ in 0..5 {
            match self.spawn() {
                Ok(()) => return,
                Err(stderr) if stderr.contains("cannot listen") => {
                    last = stderr;
                    std::thread::sleep(Duration::from_millis(200));
                }
                Err(stderr) => panic!("levee did not restart:\n{stderr}"),
            }
        }
        panic!("levee did not restart:\n{last}");
    }

    /// The resident set size of the process in KiB (`VmRSS` of `/proc/<pid>/status`).
    pub fn rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid()))
            .expect("read /proc/<pid>/status");
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("VmRSS in /proc/<pid>/status")
    }

    fn terminate(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        send_signal(child.id(), "TERM");
        let deadline = Instant::now() + Duration::from_secs(3);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        let _ = child.wait();
    }

    // ---- HTTP ----

    /// Sends a request; `None` if the node could not be reached.
    pub fn try_request(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<&[u8]>,
    ) -> Option<Reply> {
        let mut req = ureq::http::Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.url()));
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let result = match body {
            Some(b) => self
                .agent
                .run(req.body(b.to_vec()).expect("a valid request")),
            None => self.agent.run(req.body(()).expect("a valid request")),
        };
        Reply::read(result.ok()?).ok()
    }

    /// Sends a request; panics (with the node's stderr) if the node could not be reached.
    pub fn request(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<&[u8]>,
    ) -> Reply {
        self.try_request(method, path, headers, body)
            .unwrap_or_else(|| {
                panic!(
                    "{method} {path}: no answer from the node; stderr:\n{}",
                    self.stderr()
                )
            })
    }

    fn try_get(&self, path: &str) -> Option<Reply> {
        self.try_request("GET", path, &[], None)
    }

    /// `GET path`.
    pub fn get(&self, path: &str) -> Reply {
        self.request("GET", path, &[], None)
    }

    /// `GET path` with extra headers.
    pub fn get_with(&self, path: &str, headers: &[(&str, &str)]) -> Reply {
        self.request("GET", path, headers, None)
    }

    /// `POST path` with a JSON body.
    pub fn post_json(&self, path: &str, body: &Value) -> Reply {
        self.post_raw(path, "application/json", body.to_string().as_bytes())
    }

    /// `POST path` with a JSON body and `Authorization: Bearer <token>`.
    pub fn post_json_with_token(&self, path: &str, body: &Value, token: &str) -> Reply {
        let auth = format!("Bearer {token}");
        self.request(
            "POST",
            path,
            &[
                ("content-type", "application/json"),
                ("authorization", &auth),
            ],
            Some(body.to_string().as_bytes()),
        )
    }

    /// `POST path` with any body and content type.
    pub fn post_raw(&self, path: &str, content_type: &str, body: &[u8]) -> Reply {
        self.request("POST", path, &[("content-type", content_type)], Some(body))
    }

    /// `POST path` (empty body), with `Authorization: Bearer <token>` when `token` is given.
    pub fn post_with_token(&self, path: &str, token: Option<&str>) -> Reply {
        let auth = token.map(|t| format!("Bearer {t}"));
        let headers: Vec<(&str, &str)> = auth
            .as_deref()
            .map(|a| vec![("authorization", a)])
            .unwrap_or_default();
        self.request("POST", path, &headers, Some(b""))
    }

    /// `DELETE path`, with `Authorization: Bearer <token>` when `token` is given.
    pub fn delete_with_token(&self, path: &str, token: Option<&str>) -> Reply {
        let auth = token.map(|t| format!("Bearer {t}"));
        let headers: Vec<(&str, &str)> = auth
            .as_deref()
            .map(|a| vec![("authorization", a)])
            .unwrap_or_default();
        self.request("DELETE", path, &headers, None)
    }

    /// `POST /v1/check` for one rule and key.
    pub fn check(&self, rule: &str, key: &str, cost: u64) -> Reply {
        let r = self.post_json(
            "/v1/check",
            &serde_json::json!({ "rule": rule, "key": key, "cost": cost }),
        );
        assert_eq!(r.status, 200, "a check is answered 200: {r:?}");
        r
    }

    /// `GET /v1/usage/{rule}/{key}` (the key URL-encoded); panics unless 200.
    pub fn usage(&self, rule: &str, key: &str) -> Value {
        let r = self.get(&format!(
            "/v1/usage/{}/{}",
            encode_segment(rule),
            encode_segment(key)
        ));
        assert_eq!(r.status, 200, "usage of {rule}/{key}: {r:?}");
        r.json
    }

    /// `used` of `GET /v1/usage/{rule}/{key}`.
    pub fn used(&self, rule: &str, key: &str) -> u64 {
        let u = self.usage(rule, key);
        u["used"]
            .as_u64()
            .unwrap_or_else(|| panic!("no integer used in {u}"))
    }

    /// The text of `GET /metrics`.
    pub fn metrics(&self) -> String {
        let r = self.get("/metrics");
        assert_eq!(r.status, 200, "/metrics: {r:?}");
        r.body
    }

    /// The rules of `GET /v1/rules`.
    pub fn rules(&self) -> Vec<Value> {
        let r = self.get("/v1/rules");
        assert_eq!(r.status, 200, "/v1/rules: {r:?}");
        r.json["rules"]
            .as_array()
            .unwrap_or_else(|| panic!("no rules array in {}", r.body))
            .clone()
    }

    /// The rule named `name` in `GET /v1/rules`.
    pub fn rule(&self, name: &str) -> Option<Value> {
        self.rules().into_iter().find(|r| r["name"] == name)
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.terminate();
    }
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node")
            .field("url", &self.url())
            .field("dir", &self.dir.path())
            .finish_non_exhaustive()
    }
}

fn new_agent() -> ureq::Agent {
    agent(Duration::from_secs(30))
}

/// A keep-alive HTTP client whose requests give up after `timeout`; a 4xx or 5xx is an
/// answer, not an error.
pub fn agent(timeout: Duration) -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(timeout))
        .build()
        .into()
}

/// One HTTP exchange (a `body` is sent as JSON); `Err` if there was no answer.
pub fn http(
    agent: &ureq::Agent,
    method: &str,
    url: &str,
    body: Option<&str>,
) -> Result<Reply, String> {
    let mut req = ureq::http::Request::builder().method(method).uri(url);
    let result = match body {
        Some(b) => {
            req = req.header("content-type", "application/json");
            agent.run(req.body(b.as_bytes().to_vec()).map_err(|e| e.to_string())?)
        }
        None => agent.run(req.body(()).map_err(|e| e.to_string())?),
    };
    let resp = result.map_err(|e| e.to_string())?;
    Reply::read(resp).map_err(|e| e.to_string())
}

/// `kill -<signal> <pid>`; whether it was delivered. After `"STOP"`, whether every thread of
/// the process is stopped within 5 s (`/proc`), not merely the signal queued: a test that
/// freezes a node and then acts on the others relies on the frozen node seeing none of it. (A
/// leave posted right after `kill -STOP` returned was once acknowledged by the node meant to
/// be frozen, on a busy 2-vCPU CI machine.)
pub fn send_signal(pid: u32, signal: &str) -> bool {
    let sent = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    sent && (signal != "STOP" || wait_until(Duration::from_secs(5), || all_threads_stopped(pid)))
}

/// Whether every thread of process `pid` is stopped by a signal (state `T` in
/// `/proc/<pid>/task/<tid>/stat`, the field after the parenthesised command name).
fn all_threads_stopped(pid: u32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    tasks.flatten().all(|t| {
        std::fs::read_to_string(t.path().join("stat")).is_ok_and(|stat| {
            stat.rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().next())
                == Some("T")
        })
    })
}

/// Stops `child` if it still runs (SIGTERM, then SIGKILL after `grace`) and reaps it; a child
/// that exited already is only reaped, never signalled.
pub fn stop_child(child: &mut Child, grace: Duration) {
    if matches!(child.try_wait(), Ok(None)) {
        send_signal(child.id(), "TERM");
        let stopped = wait_until(grace, || matches!(child.try_wait(), Ok(Some(_))));
        if !stopped {
            let _ = child.kill();
        }
    }
    let _ = child.wait();
}

fn write_file(path: &Path, text: &str) {
    let mut f = File::create(path).unwrap_or_else(|e| panic!("create {}: {e}", path.display()));
    f.write_all(text.as_bytes())
        .unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
}

/// A path as a TOML basic string.
fn toml_string(p: &Path) -> String {
    let s = p.display().to_string();
    format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_a_sample_by_its_exact_label_set() {
        let text = "# HELP x\nlevee_transport_connections_total{peer=\"eu-2\",direction=\"outbound\"} 3\n\
                    levee_transport_connections_total{direction=\"inbound\",peer=\"eu-2\"} 1\nplain 7\n";
        let name = "levee_transport_connections_total";
        assert_eq!(
            metric(text, name, &[("direction", "outbound"), ("peer", "eu-2")]),
            Some(3.0)
        );
        assert_eq!(
            metric(text, name, &[("peer", "eu-2"), ("direction", "inbound")]),
            Some(1.0)
        );
        assert_eq!(metric(text, name, &[("peer", "eu-2")]), None);
        assert_eq!(metric(text, "plain", &[]), Some(7.0));
    }

    #[test]
    fn encodes_reserved_bytes() {
        assert_eq!(encode_segment("a b/ü"), "a%20b%2F%C3%BC");
    }
}
