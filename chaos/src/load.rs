//! The load generator: one blocking HTTP client (one keep-alive connection) per stream, each
//! sending checks to one node on a fixed schedule, recording every decision as the client saw
//! it.
//!
//! The script tells the streams what each node is ([`Role`]): a stream sends nothing to a node
//! that is down, and tags what it sends to an impostor so that it is kept out of the
//! cluster's accounting. A check that got no decision while its node was being stopped or
//! started (its role changed while the request was in flight) is *excused*: the client could
//! not know; any other failure counts against the cluster.

use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::Serialize;

use crate::cluster::NODES;
use levee_blackbox::agent;
use levee_blackbox::cluster::decide;

/// What a node is, as far as the load generator is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Role {
    /// Not running (killed, stopped, restarting): no checks are sent.
    Down,
    /// A member of the cluster.
    Up,
    /// A process posing as the node with a foreign certificate: its decisions are recorded
    /// apart.
    Impostor,
}

impl Role {
    fn from_u8(v: u8) -> Role {
        match v {
            0 => Role::Down,
            2 => Role::Impostor,
            _ => Role::Up,
        }
    }

    fn as_u8(self) -> u8 {
        match self {
            Role::Down => 0,
            Role::Up => 1,
            Role::Impostor => 2,
        }
    }
}

/// Shared between the script and the streams.
#[derive(Debug)]
pub struct LoadControl {
    roles: [AtomicU8; NODES],
    changes: [AtomicU64; NODES],
    probe_on: AtomicBool,
    stop: AtomicBool,
    probe_admitted: AtomicU64,
}

impl Default for LoadControl {
    fn default() -> Self {
        LoadControl::new()
    }
}

impl LoadControl {
    /// Every node up, probes on.
    pub fn new() -> LoadControl {
        LoadControl {
            roles: std::array::from_fn(|_| AtomicU8::new(Role::Up.as_u8())),
            changes: Default::default(),
            probe_on: AtomicBool::new(true),
            stop: AtomicBool::new(false),
            probe_admitted: AtomicU64::new(0),
        }
    }

    /// Node `i`'s role.
    pub fn role(&self, i: usize) -> Role {
        Role::from_u8(self.roles[i].load(Ordering::SeqCst))
    }

    /// Changes node `i`'s role (before stopping it, after it is ready again).
    pub fn set_role(&self, i: usize, role: Role) {
        self.roles[i].store(role.as_u8(), Ordering::SeqCst);
        self.changes[i].fetch_add(1, Ordering::SeqCst);
    }

    fn changes(&self, i: usize) -> u64 {
        self.changes[i].load(Ordering::SeqCst)
    }

    /// Pauses or resumes the probe streams.
    pub fn set_probe(&self, on: bool) {
        self.probe_on.store(on, Ordering::SeqCst);
    }

    /// Whether the probe streams send.
    pub fn probe_on(&self) -> bool {
        self.probe_on.load(Ordering::SeqCst)
    }

    /// Ends every stream early.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
    }

    /// Counts a probe admission the script itself got from a member.
    pub fn count_probe_admission(&self) {
        self.probe_admitted.fetch_add(1, Ordering::SeqCst);
    }

    /// Probe checks the cluster's members admitted so far (as their clients saw it).
    pub fn probe_admitted(&self) -> u64 {
        self.probe_admitted.load(Ordering::SeqCst)
    }
}

/// Which key a check was for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Target {
    /// The overloaded key of the per-window rule, whose windows are checked.
    Main,
    /// The lightly used key of a day-long rule whose views are compared after heals.
    Probe,
}

/// What one check got.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// A decision.
    Decided {
        /// `allowed`.
        allowed: bool,
        /// `degraded`.
        degraded: bool,
        /// `reset_after_ms`.
        reset_after_ms: u64,
    },
    /// No decision: no answer, or not a 200 decision.
    Failed {
        /// Why.
        error: String,
        /// The node was being stopped or started while the check was in flight.
        excused: bool,
    },
}

/// One check as the client saw it. Times are ms since the Unix epoch by the machine's clock,
/// which the nodes read too (plus their test-only offsets).
#[derive(Debug, Clone)]
pub struct Decision {
    /// The node the check was sent to.
    pub node: usize,
    /// The key.
    pub target: Target,
    /// When the request was sent.
    pub sent_ms: u64,
    /// When the answer (or the failure) came.
    pub received_ms: u64,
    /// Sent to an impostor, not to the cluster.
    pub impostor: bool,
    /// The answer.
    pub outcome: Outcome,
}

impl Decision {
    /// Whether the check was admitted.
    pub fn allowed(&self) -> bool {
        matches!(self.outcome, Outcome::Decided { allowed: true, .. })
    }

    /// Whether the decision was made under a conservative cap.
    pub fn degraded(&self) -> bool {
        matches!(self.outcome, Outcome::Decided { degraded: true, .. })
    }
}

/// One client stream.
#[derive(Debug, Clone)]
pub struct Stream {
    /// The node it sends to.
    pub node: usize,
    /// The key.
    pub target: Target,
    /// Checks per second.
    pub per_second: f64,
    /// `POST` URL (`…/v1/check`).
    pub url: String,
    /// The JSON body.
    pub body: String,
    /// Where in its interval the stream fires, in `[0, 1)`, so streams do not fire together.
    pub phase: f64,
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or(Duration::ZERO)
        .as_millis() as u64
}

fn now_ms_f64() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or(Duration::ZERO)
        .as_secs_f64()
        * 1_000.0
}

/// Sleeps until the wall clock reads `due_ms`, waking at least every 50 ms to look at
/// `stop` (if given); returns false if it was set.
pub fn sleep_until_ms(due_ms: f64, stop: Option<&AtomicBool>) -> bool {
    loop {
        if stop.is_some_and(|s| s.load(Ordering::SeqCst)) {
            return false;
        }
        let now = now_ms_f64();
        if now >= due_ms {
            return true;
        }
        std::thread::sleep(Duration::from_secs_f64(
            ((due_ms - now) / 1_000.0).min(0.05),
        ));
    }
}

/// Runs `stream` from `start_ms` for `duration_ms` (or until stopped): `per_second ×
/// duration` slots on a fixed schedule; a slot whose node is down, or a probe slot while
/// probes are paused, is skipped. A stream that falls behind catches up by sending at once.
pub fn run_stream(
    stream: &Stream,
    control: &LoadControl,
    start_ms: u64,
    duration_ms: u64,
) -> Vec<Decision> {
    let agent = agent(Duration::from_secs(3));
    let interval = 1_000.0 / stream.per_second;
    let n = (stream.per_second * duration_ms as f64 / 1_000.0).round() as u64;
    let mut out = Vec::with_capacity(n as usize);
    for k in 0..n {
        let due = start_ms as f64 + (stream.phase + k as f64) * interval;
        if !sleep_until_ms(due, Some(&control.stop)) {
            break;
        }
        let role = control.role(stream.node);
        if role == Role::Down || (stream.target == Target::Probe && !control.probe_on()) {
            continue;
        }
        let changes = control.changes(stream.node);
        let sent_ms = now_ms();
        let reply = decide(&agent, &stream.url, &stream.body);
        let received_ms = now_ms();
        let excused = control.changes(stream.node) != changes;
        let outcome = match reply {
            Ok(d) => Outcome::Decided {
                allowed: d.allowed,
                degraded: d.degraded,
                reset_after_ms: d.reset_after_ms,
            },
            Err(error) => Outcome::Failed { error, excused },
        };
        let impostor = role == Role::Impostor;
        let d = Decision {
            node: stream.node,
            target: stream.target,
            sent_ms,
            received_ms,
            impostor,
            outcome,
        };
        if d.allowed() && !impostor && stream.target == Target::Probe {
            control.probe_admitted.fetch_add(1, Ordering::SeqCst);
        }
        out.push(d);
    }
    out
}
