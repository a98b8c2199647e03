//! Load and accounting: client streams at steady rates, and what they got, attributed to
//! windows.
//!
//! ## Attributing a decision to a window
//!
//! The server decides by its own clock, at some instant between the moment the client sent
//! the request and the moment it received the answer; client and server read the same machine
//! clock (`SystemTime`, ms since the Unix epoch). An allowed `fixed_window` decision answers
//! `reset_after_ms = end of its window − now`, so its window ends at `now + reset_after_ms`
//! with `now` in `[sent_ms, received_ms]`: the window's end is the one multiple of the window
//! length in `[sent_ms + reset_after_ms, received_ms + reset_after_ms]`. That names the window
//! of every admission whose round trip is shorter than a window, including requests sent in
//! one window and answered in the next. An admission whose interval holds two window ends (a
//! round trip longer than a window) is *straddling*: it is left out of the per-window counts
//! and counted separately; one whose interval holds none contradicts the clock and is counted
//! as *unattributable* (the tests require none). Where the client's own clock already puts the
//! whole round trip inside one window, the two attributions must agree (*disagreements*: none).
//! Denials only show that demand exceeded the limit; they are attributed by the client's clock
//! alone (round trip inside one window) and straddling ones are counted separately.

use super::*;

// ---------------------------------------------------------------------------------------------
// Load and accounting
// ---------------------------------------------------------------------------------------------

/// One client stream: checks sent to `node` at a steady `per_second`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Demand {
    pub(crate) node: usize,
    pub(crate) per_second: f64,
}

/// What one check got.
#[derive(Debug, Clone)]
pub(crate) enum Answer {
    Decided {
        allowed: bool,
        degraded: bool,
        reset_after_ms: u64,
    },
    /// No answer, or not a 200 decision.
    Failed(String),
}

/// One check as the client saw it.
#[derive(Debug, Clone)]
pub(crate) struct Sample {
    pub(crate) node: usize,
    pub(crate) sent_ms: u64,
    pub(crate) received_ms: u64,
    pub(crate) answer: Answer,
}

impl Sample {
    pub(crate) fn allowed(&self) -> bool {
        matches!(self.answer, Answer::Decided { allowed: true, .. })
    }
}

pub(crate) fn decide(agent: &ureq::Agent, url: &str, body: &str) -> Answer {
    match decide_check(agent, url, body) {
        Ok(d) => Answer::Decided {
            allowed: d.allowed,
            degraded: d.degraded,
            reset_after_ms: d.reset_after_ms,
        },
        Err(e) => Answer::Failed(e),
    }
}

/// How long a check may wait for its answer before its stream sends late: each stream spreads
/// its schedule over enough threads ("lanes") that a lane has this long per check, so the
/// demand the servers see is the schedule even while some answers are slow (a slow answer
/// delays only its own lane, and only once it takes longer than this).
pub(crate) const LANE_PATIENCE_MS: f64 = 400.0;

/// Runs every stream of `demand` from `start_ms` for `duration_ms`, each sending
/// `per_second × duration` checks on a fixed schedule (streams are phase-shifted so they do not
/// fire together). A stream's checks go round-robin over its lanes (see [`LANE_PATIENCE_MS`]),
/// which share one connection pool. Returns every sample.
pub(crate) fn run_load(
    c: &LocalClusterHandle,
    rule: &str,
    key: &str,
    demand: &[Demand],
    start_ms: u64,
    duration_ms: u64,
) -> Vec<Sample> {
    let urls: Vec<String> = demand.iter().map(|d| c.url(d.node, "/v1/check")).collect();
    run_load_at(&urls, rule, key, demand, start_ms, duration_ms)
}

/// [`run_load`] with every stream's URL given (`urls[i]` for `demand[i]`), so that it can
/// run on a thread of its own while the test changes the cluster.
pub(crate) fn run_load_at(
    urls: &[String],
    rule: &str,
    key: &str,
    demand: &[Demand],
    start_ms: u64,
    duration_ms: u64,
) -> Vec<Sample> {
    let body = json!({ "rule": rule, "key": key }).to_string();
    let streams = demand.len() as f64;
    std::thread::scope(|s| {
        let mut threads = Vec::new();
        for (i, d) in demand.iter().enumerate() {
            let url = urls[i].clone();
            let agent = new_agent();
            let interval = 1_000.0 / d.per_second;
            let n = (d.per_second * duration_ms as f64 / 1_000.0).round() as u64;
            let phase = i as f64 / streams;
            let lanes = ((LANE_PATIENCE_MS / interval).ceil() as u64).clamp(1, n.max(1));
            for lane in 0..lanes {
                let (url, body, agent, node) = (url.clone(), body.as_str(), agent.clone(), d.node);
                threads.push(s.spawn(move || {
                    let mut out = Vec::new();
                    for k in (lane..n).step_by(lanes as usize) {
                        sleep_until_ms(start_ms as f64 + (phase + k as f64) * interval);
                        let sent_ms = now_ms();
                        let answer = decide(&agent, &url, body);
                        out.push(Sample {
                            node,
                            sent_ms,
                            received_ms: now_ms(),
                            answer,
                        });
                    }
                    out
                }));
            }
        }
        threads
            .into_iter()
            .flat_map(|t| t.join().expect("a load thread panicked"))
            .collect()
    })
}

/// Checks sent one after another to `url` until `stop` is set.
pub(crate) fn load_until(node: usize, url: &str, body: &str, stop: &AtomicBool) -> Vec<Sample> {
    let agent = new_agent();
    let mut out = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        let sent_ms = now_ms();
        let answer = decide(&agent, url, body);
        out.push(Sample {
            node,
            sent_ms,
            received_ms: now_ms(),
            answer,
        });
        std::thread::sleep(Duration::from_millis(1));
    }
    out
}

/// Counts in one window.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Tally {
    /// Checks sent in the window (by the client's clock): the demand a central counter sees.
    pub(crate) sent: u64,
    /// Admissions decided in the window.
    pub(crate) admitted: u64,
    /// Denials decided in the window.
    pub(crate) denied: u64,
    /// The longest a check sent in the window waited for its answer, in ms.
    pub(crate) slowest_ms: u64,
}

/// Admissions and denials per window (see the module docs).
#[derive(Debug, Default)]
pub(crate) struct Accounting {
    pub(crate) window_ms: u64,
    pub(crate) windows: BTreeMap<u64, Tally>,
    pub(crate) admitted_straddling: u64,
    pub(crate) denied_straddling: u64,
    pub(crate) unattributable: u64,
    pub(crate) disagreements: u64,
    pub(crate) failed: Vec<String>,
}

pub(crate) fn account(samples: &[Sample], window_ms: u64) -> Accounting {
    let mut a = Accounting {
        window_ms,
        ..Accounting::default()
    };
    for s in samples {
        let sent_in = a.windows.entry(s.sent_ms / window_ms).or_default();
        sent_in.sent += 1;
        sent_in.slowest_ms = sent_in.slowest_ms.max(s.received_ms - s.sent_ms);
        let same_window = s.sent_ms / window_ms == s.received_ms / window_ms;
        match &s.answer {
            Answer::Failed(e) => a.failed.push(e.clone()),
            Answer::Decided {
                allowed: true,
                reset_after_ms,
                ..
            } => {
                // The window ends at `decided_at + reset_after_ms`, decided_at in [sent, received].
                match attribute(
                    s.sent_ms as i64,
                    s.received_ms as i64,
                    *reset_after_ms,
                    window_ms,
                ) {
                    Attribution::Unattributable => a.unattributable += 1,
                    Attribution::Straddling => a.admitted_straddling += 1,
                    Attribution::Window(w) => {
                        let w = w as u64;
                        if same_window && s.sent_ms / window_ms != w {
                            a.disagreements += 1;
                        }
                        a.windows.entry(w).or_default().admitted += 1;
                    }
                }
            }
            Answer::Decided { allowed: false, .. } => {
                if same_window {
                    a.windows.entry(s.sent_ms / window_ms).or_default().denied += 1;
                } else {
                    a.denied_straddling += 1;
                }
            }
        }
    }
    a
}

impl Accounting {
    pub(crate) fn tally(&self, w: u64) -> Tally {
        self.windows.get(&w).copied().unwrap_or_default()
    }

    /// A table of the windows `first..first + n` for the test's output.
    pub(crate) fn table(&self, first: u64, n: u64, limit: u64) -> String {
        let mut out = format!(
            "window (x{} ms)  sent  admitted  denied  admitted/limit  slowest answer\n",
            self.window_ms
        );
        for w in first..first + n {
            let t = self.tally(w);
            out.push_str(&format!(
                "{w:>15}  {:>4}  {:>8}  {:>6}  {:>13.1}%  {:>11} ms\n",
                t.sent,
                t.admitted,
                t.denied,
                100.0 * t.admitted as f64 / limit as f64,
                t.slowest_ms
            ));
        }
        out.push_str(&format!(
            "straddling admissions {}, straddling denials {}, unattributable {}, disagreements {}, failed {}",
            self.admitted_straddling,
            self.denied_straddling,
            self.unattributable,
            self.disagreements,
            self.failed.len()
        ));
        out
    }

    /// Asserts that no window of `first..first + n` admitted more than `limit`; `context` (a
    /// table, who admitted what) goes into the failure's message.
    #[track_caller]
    pub(crate) fn assert_within(&self, first: u64, n: u64, limit: u64, context: &str) {
        for w in first..first + n {
            let t = self.tally(w);
            assert!(
                t.admitted <= limit,
                "window {w} admitted {} > the limit {limit}:\n{}\n{context}",
                t.admitted,
                self.table(first, n, limit)
            );
        }
    }

    /// Asserts that every check was answered and every admission was attributed consistently.
    #[track_caller]
    pub(crate) fn assert_clean(&self) {
        assert!(
            self.failed.is_empty(),
            "{} checks got no decision, e.g. {:?}",
            self.failed.len(),
            self.failed.first()
        );
        assert_eq!(
            self.unattributable, 0,
            "admissions whose reset_after_ms names no window they could have been decided in"
        );
        assert_eq!(
            self.disagreements, 0,
            "admissions whose reset_after_ms contradicts the window the client saw them in"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Load in the background, and what a node says of its peers
// ---------------------------------------------------------------------------------------------

/// `rule`/`key` overloaded from every node of `c`, two streams of 100 checks a second each,
/// for `windows` windows of `PER_SECOND_LIMIT` a second from the next window's start: asserts
/// that every check was answered and attributed, that every window really was overloaded (else
/// the bound proves nothing) and that none admitted more than the limit. Prints the windows'
/// table under `what`; returns the samples.
pub(crate) fn overload_every_node(
    c: &LocalClusterHandle,
    rule: &str,
    key: &str,
    windows: u64,
    what: &str,
) -> Vec<Sample> {
    let demand: Vec<Demand> = (0..c.len())
        .flat_map(|node| {
            [Demand {
                node,
                per_second: 100.0,
            }; 2]
        })
        .collect();
    let (samples, a, first) = run_windows(
        c,
        rule,
        key,
        &demand,
        windows,
        &format!("{what}, limit {PER_SECOND_LIMIT} per window"),
    );
    a.assert_within(first, windows, PER_SECOND_LIMIT, "");
    for w in first..first + windows {
        let t = a.tally(w);
        assert!(
            t.denied > 0 && t.sent > 2 * PER_SECOND_LIMIT,
            "window {w} was not overloaded: {t:?}"
        );
    }
    samples
}

/// `demand` on `rule`/`key` for `windows` one-second windows from the next window's start:
/// prints the windows' table under `what` and asserts every check was answered and
/// attributed. Returns the samples, their accounting and the first window.
pub(crate) fn run_windows(
    c: &LocalClusterHandle,
    rule: &str,
    key: &str,
    demand: &[Demand],
    windows: u64,
    what: &str,
) -> (Vec<Sample>, Accounting, u64) {
    let start = next_window_start(SECOND_MS);
    let samples = run_load(c, rule, key, demand, start, windows * SECOND_MS);
    let a = account(&samples, SECOND_MS);
    let first = start / SECOND_MS;
    eprintln!("{what}:\n{}", a.table(first, windows, PER_SECOND_LIMIT));
    a.assert_clean();
    (samples, a, first)
}

/// One stream of `per_second` checks at each node of `nodes`: their URLs and demand.
pub(crate) fn streams(
    c: &LocalClusterHandle,
    nodes: &[usize],
    per_second: f64,
) -> (Vec<String>, Vec<Demand>) {
    let demand = nodes
        .iter()
        .map(|&node| Demand { node, per_second })
        .collect();
    (
        nodes.iter().map(|&n| c.url(n, "/v1/check")).collect(),
        demand,
    )
}

/// `per_second` checks of `rule`/`key` at each node of `nodes` from `from_ms` to `until_ms`
/// (nothing if that is already past), on a thread of its own.
pub(crate) fn load_in_background(
    c: &LocalClusterHandle,
    nodes: &[usize],
    (rule, key): (&'static str, &'static str),
    per_second: f64,
    from_ms: u64,
    until_ms: u64,
) -> std::thread::JoinHandle<Vec<Sample>> {
    let (urls, demand) = streams(c, nodes, per_second);
    std::thread::spawn(move || {
        run_load_at(
            &urls,
            rule,
            key,
            &demand,
            from_ms,
            until_ms.saturating_sub(from_ms),
        )
    })
}

/// Waits for the last load of `loads` to end; it stays in `loads`, done.
pub(crate) fn finish_load(loads: &mut Vec<std::thread::JoinHandle<Vec<Sample>>>) {
    if let Some(last) = loads.pop() {
        let samples = last.join().expect("a load thread panicked");
        loads.push(std::thread::spawn(move || samples));
    }
}

/// Waits for every load of `loads` and accounts its samples in `per-second` windows from the
/// one starting at `start_ms`: the samples, the accounting, the first window and its table of
/// `windows` windows.
pub(crate) fn finish_loads(
    loads: Vec<std::thread::JoinHandle<Vec<Sample>>>,
    start_ms: u64,
    windows: u64,
) -> (Vec<Sample>, Accounting, u64, String) {
    let samples: Vec<Sample> = loads
        .into_iter()
        .flat_map(|l| l.join().expect("a load thread panicked"))
        .collect();
    let a = account(&samples, SECOND_MS);
    let first = start_ms / SECOND_MS;
    let table = a.table(first, windows, PER_SECOND_LIMIT);
    (samples, a, first, table)
}

/// Admissions per window and node (by the client's clock), for a failing test's output.
pub(crate) fn admitted_by_node(
    c: &LocalClusterHandle,
    samples: &[Sample],
    window_ms: u64,
) -> String {
    let mut windows: BTreeMap<u64, BTreeMap<usize, u64>> = BTreeMap::new();
    for s in samples.iter().filter(|s| s.allowed()) {
        *windows
            .entry(s.sent_ms / window_ms)
            .or_default()
            .entry(s.node)
            .or_default() += 1;
    }
    windows
        .iter()
        .map(|(w, nodes)| {
            let row: Vec<String> = nodes
                .iter()
                .map(|(n, k)| format!("{} {k}", c.id(*n)))
                .collect();
            format!("{w}: {}\n", row.join(", "))
        })
        .collect()
}

/// [`load_in_background`] from `from_ms`, one window at a time, until `until_ms` (ms; read
/// at the start of every window) is reached.
pub(crate) fn load_windows_in_background(
    c: &LocalClusterHandle,
    nodes: &[usize],
    (rule, key): (&'static str, &'static str),
    per_second: f64,
    from_ms: u64,
    until_ms: std::sync::Arc<AtomicU64>,
) -> std::thread::JoinHandle<Vec<Sample>> {
    let (urls, demand) = streams(c, nodes, per_second);
    std::thread::spawn(move || {
        let mut samples = Vec::new();
        let mut at = from_ms;
        while at < until_ms.load(Ordering::Relaxed) {
            samples.extend(run_load_at(&urls, rule, key, &demand, at, SECOND_MS));
            at += SECOND_MS;
        }
        samples
    })
}

/// The peers of node `i`'s `/v1/cluster` with their `state`.
pub(crate) fn peer_states(c: &LocalClusterHandle, i: usize) -> Vec<(String, String)> {
    c.status(i)["peers"]
        .as_array()
        .map(|peers| {
            peers
                .iter()
                .map(|p| {
                    (
                        p["id"].as_str().unwrap_or("?").to_owned(),
                        p["state"].as_str().unwrap_or("?").to_owned(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Every `name` sample of node `i`'s `/metrics`, summed (0 if there is none).
pub(crate) fn metric_sum(c: &LocalClusterHandle, i: usize, name: &str) -> f64 {
    levee_blackbox::samples(&c.metrics(i))
        .iter()
        .filter(|s| s.name == name)
        .map(|s| s.value)
        .sum()
}
