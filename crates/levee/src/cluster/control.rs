//! `levee cluster add | remove | restart`: changes to a running `levee cluster`, asked over
//! the Unix socket `control.sock` in its directory.
//!
//! The protocol is lines of text. The client sends one request line (`add <region>`,
//! `remove <node>`, `restart <node>`); the supervisor answers with lines `<kind> <text>`:
//! any number of `progress` lines while the change runs, then the lines of its outcome, all of
//! one kind — `ok`, `refused` (the request was refused, nothing was changed: the client exits
//! 2), `error` (the change failed, or the cluster stopped during it: exit 1) or `busy`
//! (another change runs: exit 1) — and it closes the connection. One change runs at a time; a
//! client that connects meanwhile is answered `busy` at once, not queued.
//!
//! The changes themselves are in [`super::change`]; the supervisor keeps watching for signals
//! and for nodes that exit while one runs.

use std::io::{BufRead as _, BufReader, Write as _};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::Subcommand;
use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _};
use tokio::net::{UnixListener, UnixStream};

use super::change::{self, Abort};
use super::{Cluster, Signals, Stop};

/// The socket's file name in the cluster's directory.
pub(super) const SOCKET: &str = "control.sock";
/// How long a client may take to send its request line.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// Changes to a running `levee cluster` (started in another terminal). Each waits until every
/// running node is ready and agrees on the new list, printing what it does; exit 0 when done,
/// 2 when refused (nothing changed), 1 on failure.
#[derive(Subcommand)]
pub(crate) enum ClusterCommand {
    /// Add a node to one of the running cluster's regions.
    ///
    /// Lays it out (the region's next id, the layout's next ports), issues its certificate,
    /// appends it to every node's list, reloads the running nodes (SIGHUP), starts it, and
    /// waits until every node is ready and agrees on the list.
    Add {
        /// The region (one of the cluster's; adding a region is not supported).
        #[arg(long)]
        region: String,
        /// The cluster's directory (its --dir; default: the one cluster running in a
        /// temporary directory).
        #[arg(long)]
        dir: Option<PathBuf>,
    },
    /// Remove a node from the running cluster.
    ///
    /// It leaves (POST /admin/leave: it hands every right it holds to the others), is stopped
    /// (SIGTERM), is marked removed in every node's list, and the others reload and agree on
    /// it. The last node of a region cannot be removed.
    Remove {
        /// The node id, e.g. eu-2.
        node: String,
        /// The cluster's directory (its --dir; default: the one cluster running in a
        /// temporary directory).
        #[arg(long)]
        dir: Option<PathBuf>,
    },
    /// Restart a node of the running cluster.
    ///
    /// SIGTERM, wait for it to exit, start it again on its configuration and data directory
    /// (its log is appended to), and wait until it is ready and every node agrees on the list.
    Restart {
        /// The node id, e.g. eu-1.
        node: String,
        /// The cluster's directory (its --dir; default: the one cluster running in a
        /// temporary directory).
        #[arg(long)]
        dir: Option<PathBuf>,
    },
}

/// A change, as one request line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Request {
    /// `add <region>`.
    Add(String),
    /// `remove <node>`.
    Remove(String),
    /// `restart <node>`.
    Restart(String),
}

impl Request {
    fn parse(line: &str) -> Result<Request, String> {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["add", region] => Ok(Request::Add((*region).to_owned())),
            ["remove", node] => Ok(Request::Remove((*node).to_owned())),
            ["restart", node] => Ok(Request::Restart((*node).to_owned())),
            _ => Err(format!(
                "not a request: {line:?} (add <region>, remove <node> or restart <node>)"
            )),
        }
    }
}

impl std::fmt::Display for Request {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Request::Add(region) => write!(f, "add {region}"),
            Request::Remove(node) => write!(f, "remove {node}"),
            Request::Restart(node) => write!(f, "restart {node}"),
        }
    }
}

/// The listening socket; its file is removed on drop.
pub(super) struct Control {
    listener: UnixListener,
    path: PathBuf,
}

impl Control {
    /// Listens on `dir/control.sock` (making `dir` if need be). A socket file left by a
    /// cluster that did not stop cleanly is replaced; one a running cluster answers on is an
    /// error (two clusters in one directory would overwrite each other's files).
    pub(super) fn bind(dir: &Path) -> Result<Control, String> {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let path = dir.join(SOCKET);
        if path.exists() {
            if std::os::unix::net::UnixStream::connect(&path).is_ok() {
                return Err(format!(
                    "a levee cluster is already running in {} (it answers on {}); stop it, or choose another --dir",
                    dir.display(),
                    path.display()
                ));
            }
            std::fs::remove_file(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        }
        let listener = UnixListener::bind(&path)
            .map_err(|e| format!("cannot listen on {}: {e}", path.display()))?;
        Ok(Control { listener, path })
    }

    /// The next client.
    pub(super) async fn accept(&self) -> std::io::Result<UnixStream> {
        self.listener.accept().await.map(|(s, _)| s)
    }
}

impl Drop for Control {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Where a change's lines go: the client (while it listens) and the supervisor's own output.
pub(super) struct Progress {
    write: tokio::net::unix::OwnedWriteHalf,
    /// The client went away: the change goes on, unheard.
    gone: bool,
}

impl Progress {
    /// A progress line, to the client and to the supervisor's output.
    pub(super) async fn line(&mut self, text: &str) {
        println!("levee cluster: {text}");
        self.send("progress", text).await;
    }

    async fn send(&mut self, kind: &str, text: &str) {
        if self.gone {
            return;
        }
        let mut out = String::new();
        for l in text.lines() {
            out.push_str(kind);
            out.push(' ');
            out.push_str(l);
            out.push('\n');
        }
        if self.write.write_all(out.as_bytes()).await.is_err() {
            self.gone = true;
        }
    }

    /// The outcome, and the end of the answer.
    async fn finish(mut self, kind: &str, text: &str) {
        self.send(kind, text).await;
        let _ = self.write.shutdown().await;
    }
}

/// What happened while a change ran.
enum Event {
    Done(Result<String, Abort>),
    Signal(&'static str),
}

/// Serves one client: reads its request and runs the change, while still reacting to
/// signals (the cluster stops; the client is told) and answering other clients `busy`.
/// `Some` when the cluster must stop.
pub(super) async fn serve(
    conn: std::io::Result<UnixStream>,
    cluster: &mut Cluster,
    signals: &mut Signals,
    control: &Control,
) -> Option<Stop> {
    let (read, write) = conn.ok()?.into_split();
    let mut out = Progress { write, gone: false };
    let mut reader = tokio::io::BufReader::new(read);
    let mut line = String::new();
    tokio::select! {
        reason = signals.recv() => return Some(Stop::Signal(reason)),
        read = tokio::time::timeout(REQUEST_TIMEOUT, reader.read_line(&mut line)) => {
            // Nothing said (a client probing whether the cluster runs) is no request.
            if !matches!(read, Ok(Ok(n)) if n > 0) || line.trim().is_empty() {
                return None;
            }
        }
    }
    let request = match Request::parse(line.trim()) {
        Ok(r) => r,
        Err(e) => {
            out.finish("refused", &e).await;
            return None;
        }
    };
    println!("levee cluster: {request}");
    let event = {
        let change = change::run(&request, cluster, &mut out);
        tokio::pin!(change);
        loop {
            tokio::select! {
                done = &mut change => break Event::Done(done),
                reason = signals.recv() => break Event::Signal(reason),
                conn = control.accept() => {
                    if let Ok(conn) = conn {
                        tokio::spawn(busy(conn, request.to_string()));
                    }
                }
            }
        }
    };
    let (kind, text, stop) = match event {
        Event::Done(Ok(done)) => ("ok", done, None),
        Event::Done(Err(Abort::Refused(why))) => ("refused", why, None),
        Event::Done(Err(Abort::Failed(why))) => ("error", why, None),
        Event::Done(Err(Abort::Died(why))) => (
            "error",
            format!("{why}\nthe cluster is stopping (a node that exits stops it)"),
            Some(Stop::Failed(why)),
        ),
        Event::Signal(reason) => (
            "error",
            format!("the cluster is stopping ({reason}); `{request}` was not finished"),
            Some(Stop::Signal(reason)),
        ),
    };
    if stop.is_none() {
        println!("levee cluster: {request}: {kind}: {text}");
    }
    out.finish(kind, &text).await;
    stop
}

/// Answers a client that came while a change runs.
async fn busy(conn: UnixStream, running: String) {
    let (read, write) = conn.into_split();
    // Its request is read first: a connection closed before the client wrote would fail its
    // write instead of showing it the answer.
    let mut line = String::new();
    let mut reader = tokio::io::BufReader::new(read);
    let _ = tokio::time::timeout(REQUEST_TIMEOUT, reader.read_line(&mut line)).await;
    Progress { write, gone: false }
        .finish(
            "busy",
            &format!(
                "busy: `{running}` is running (one change at a time); try again once it is done"
            ),
        )
        .await;
}

// ---- the client ----

/// `levee cluster add | remove | restart`: sends the request to the cluster running in its
/// directory and prints the answer as it comes.
pub(crate) fn client(command: &ClusterCommand) -> ExitCode {
    let (request, dir) = match command {
        ClusterCommand::Add { region, dir } => (Request::Add(region.clone()), dir),
        ClusterCommand::Remove { node, dir } => (Request::Remove(node.clone()), dir),
        ClusterCommand::Restart { node, dir } => (Request::Restart(node.clone()), dir),
    };
    // A name with spaces would not fit the request line, nor name a region or node.
    let name = match &request {
        Request::Add(n) | Request::Remove(n) | Request::Restart(n) => n,
    };
    if name.is_empty() || name.chars().any(char::is_whitespace) {
        eprintln!("error: {name:?} is not a region or node name");
        return ExitCode::from(2);
    }
    let dir = match dir {
        Some(d) => d.clone(),
        None => match find_running() {
            Ok(d) => d,
            Err((code, e)) => {
                eprintln!("error: {e}");
                return ExitCode::from(code);
            }
        },
    };
    let path = dir.join(SOCKET);
    if !path.exists() {
        eprintln!(
            "error: no levee cluster is running in {} (no {})",
            dir.display(),
            path.display()
        );
        return ExitCode::FAILURE;
    }
    let mut stream = match std::os::unix::net::UnixStream::connect(&path) {
        Ok(s) => s,
        Err(e) => {
            eprintln!(
                "error: no levee cluster is running in {} ({} is left from one that did not stop cleanly: {e})",
                dir.display(),
                path.display()
            );
            return ExitCode::FAILURE;
        }
    };
    // Should the write fail, the answer may still say why (the supervisor answered first).
    let sent = writeln!(stream, "{request}");
    let mut outcome: Option<(String, Vec<String>)> = None;
    for line in BufReader::new(stream).lines() {
        let Ok(line) = line else { break };
        let (kind, text) = line.split_once(' ').unwrap_or((line.as_str(), ""));
        if kind == "progress" {
            println!("{text}");
            let _ = std::io::stdout().flush();
            continue;
        }
        match &mut outcome {
            Some((k, lines)) if k == kind => lines.push(text.to_owned()),
            _ => outcome = Some((kind.to_owned(), vec![text.to_owned()])),
        }
    }
    match outcome {
        Some((kind, lines)) if kind == "ok" => {
            println!("{}", lines.join("\n"));
            ExitCode::SUCCESS
        }
        Some((kind, lines)) => {
            eprintln!("error: {}", lines.join("\n"));
            if kind == "refused" {
                ExitCode::from(2)
            } else {
                ExitCode::FAILURE
            }
        }
        None => {
            let sent = sent.err().map(|e| format!(" (sending the request: {e})"));
            eprintln!(
                "error: the cluster in {} closed the connection without an answer{} (did it stop?)",
                dir.display(),
                sent.unwrap_or_default()
            );
            ExitCode::FAILURE
        }
    }
}

/// The directory of the one cluster running in a temporary directory (`levee cluster`
/// without `--dir`): an error (and exit code) if there is none, or more than one.
fn find_running() -> Result<PathBuf, (u8, String)> {
    let tmp = std::env::temp_dir();
    let mut running: Vec<PathBuf> = std::fs::read_dir(&tmp)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .filter(|e| {
                    e.file_name()
                        .to_string_lossy()
                        .starts_with("levee-cluster-")
                })
                .map(|e| e.path())
                .filter(|d| std::os::unix::net::UnixStream::connect(d.join(SOCKET)).is_ok())
                .collect()
        })
        .unwrap_or_default();
    running.sort();
    match running.len() {
        1 => Ok(running.remove(0)),
        0 => Err((
            1,
            format!(
                "no levee cluster is running in {}/levee-cluster-* (for one started with --dir DIR, give --dir DIR)",
                tmp.display()
            ),
        )),
        _ => Err((
            2,
            format!(
                "{} levee clusters are running ({}); say which with --dir",
                running.len(),
                running
                    .iter()
                    .map(|d| d.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_read_back_as_written() {
        for r in [
            Request::Add("eu".into()),
            Request::Remove("eu-2".into()),
            Request::Restart("us-1".into()),
        ] {
            assert_eq!(Request::parse(&r.to_string()), Ok(r));
        }
        assert!(Request::parse("add").is_err());
        assert!(Request::parse("add eu us").is_err());
        assert!(Request::parse("drop eu-1").is_err());
    }
}
