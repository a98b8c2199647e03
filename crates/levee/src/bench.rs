//! `levee bench`: an open-loop HTTP load generator for Levee's decision endpoints.
//!
//! Requests are scheduled at the target rate whatever the server does; each connection sends
//! its next request at its scheduled time, or at once if the previous answer came late. The
//! latency of a request sent late because the previous answer came late is measured from its
//! *scheduled* time, so a stalled server shows up in the high percentiles instead of silently
//! slowing the generator down (coordinated omission, corrected as wrk2 does). A request whose
//! connection was free is measured from when it was sent: the generator's timer (tokio's, with
//! millisecond resolution) wakes up to a millisecond after the scheduled time, and that
//! lateness is the generator's, not the server's. Latencies go into an HDR histogram.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::{Args, ValueEnum};
use hdrhistogram::Histogram;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

/// Arguments of `levee bench`.
#[derive(Args, Clone)]
pub(crate) struct BenchArgs {
    /// The node's base URL.
    #[arg(long, default_value = "http://127.0.0.1:8750")]
    url: String,
    /// What to call.
    #[arg(long, value_enum, default_value_t = Endpoint::Check)]
    endpoint: Endpoint,
    /// The rule.
    #[arg(long, default_value = "api-per-tenant")]
    rule: String,
    /// Distinct keys.
    #[arg(long, default_value_t = 10_000)]
    keys: u64,
    /// How keys are drawn.
    #[arg(long, value_enum, default_value_t = Distribution::Uniform)]
    distribution: Distribution,
    /// Target requests per second (all connections together).
    #[arg(long, default_value_t = 10_000)]
    rate: u64,
    /// A rate schedule instead of --rate: `RATE:SECONDS,…`, e.g. `5000:5,20000:5`.
    #[arg(long)]
    schedule: Option<String>,
    /// How long to run (seconds), when no schedule is given.
    #[arg(long, default_value_t = 10)]
    duration: u64,
    /// Keep-alive connections.
    #[arg(long, default_value_t = 64)]
    connections: usize,
    /// Checks per request for `--endpoint batch`.
    #[arg(long, default_value_t = 100)]
    batch_size: usize,
    /// The header that carries the key for `--endpoint authz`.
    #[arg(long, default_value = "x-api-key")]
    key_header: String,
    /// Only keys the node owns in its region (what a client routing to owners sends it, so
    /// the node forwards nothing): the first `--keys` of `k0`, `k1`, … that the ring in the
    /// node's `GET /v1/cluster` places on the node itself.
    #[arg(long)]
    owned_only: bool,
    /// The key numbers drawn from, when `--owned-only` (filled before the run).
    #[arg(skip)]
    owned: Option<Arc<Vec<u64>>>,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Endpoint {
    /// `POST /v1/check`.
    Check,
    /// `POST /v1/check/batch`.
    Batch,
    /// `GET /v1/authz/{rule}`.
    Authz,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Distribution {
    /// Every key equally likely.
    Uniform,
    /// Zipf-like: key k with probability proportional to 1/(k+1).
    Zipf,
}

#[derive(Default)]
struct Counters {
    sent: AtomicU64,
    ok: AtomicU64,
    denied: AtomicU64,
    errors: AtomicU64,
    decisions: AtomicU64,
}

/// Runs the generator and prints a summary; exit 1 if nothing succeeded.
pub(crate) fn run(args: &BenchArgs) -> std::process::ExitCode {
    let mut args = args.clone();
    if args.owned_only {
        match owned_keys(&args) {
            Ok(keys) => args.owned = Some(Arc::new(keys)),
            Err(e) => {
                eprintln!("error: --owned-only: {e}");
                return std::process::ExitCode::from(2);
            }
        }
    }
    let args = &args;
    let phases = match phases(args) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("error: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    match runtime.block_on(bench(args.clone(), phases)) {
        Ok(ok) if ok > 0 => std::process::ExitCode::SUCCESS,
        Ok(_) => std::process::ExitCode::FAILURE,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::ExitCode::from(2)
        }
    }
}

fn phases(args: &BenchArgs) -> Result<Vec<(u64, Duration)>, String> {
    let Some(s) = &args.schedule else {
        if args.rate == 0 || args.duration == 0 {
            return Err("--rate and --duration must be at least 1".into());
        }
        return Ok(vec![(args.rate, Duration::from_secs(args.duration))]);
    };
    s.split(',')
        .map(|p| {
            let (r, d) = p
                .split_once(':')
                .ok_or_else(|| format!("--schedule: {p:?} is not RATE:SECONDS"))?;
            let r: u64 = r
                .trim()
                .parse()
                .map_err(|_| format!("--schedule: rate {r:?} is not a number"))?;
            let d: f64 = d
                .trim()
                .parse()
                .map_err(|_| format!("--schedule: seconds {d:?} is not a number"))?;
            if r == 0 || d <= 0.0 {
                return Err(format!(
                    "--schedule: {p:?} needs a positive rate and duration"
                ));
            }
            Ok((r, Duration::from_secs_f64(d)))
        })
        .collect()
}

/// The numbers of the first `args.keys` keys `k<n>` the node at `args.url` owns, placed on
/// the ring its `GET /v1/cluster` shows (as the node and levee-client place them: nothing is
/// asked per key, so the node's CPU is not spent on it).
fn owned_keys(args: &BenchArgs) -> Result<Vec<u64>, String> {
    let url = format!("{}/v1/cluster", args.url.trim_end_matches('/'));
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs(10)))
        .http_status_as_error(false)
        .build()
        .into();
    let mut resp = agent
        .get(&url)
        .call()
        .map_err(|e| format!("cannot reach {url}: {e}"))?;
    let status = resp.status().as_u16();
    let text = resp
        .body_mut()
        .read_to_string()
        .map_err(|e| format!("{url}: {e}"))?;
    if status != 200 {
        return Err(format!("{url} answered {status}: {text}"));
    }
    let me = serde_json::from_str::<serde_json::Value>(&text)
        .ok()
        .and_then(|v| v["node"]["id"].as_str().map(str::to_owned))
        .ok_or_else(|| format!("{url}: no node id in the answer"))?;
    let ring =
        levee_client::RegionRing::from_cluster_json(&text).map_err(|e| format!("{url}: {e}"))?;
    let want = args.keys.max(1);
    let owned: Vec<u64> = (0..want.saturating_mul(1024))
        .filter(|n| ring.owner(&format!("k{n}")) == Some(me.as_str()))
        .take(want as usize)
        .collect();
    if (owned.len() as u64) < want {
        return Err(format!(
            "{me} owns only {} keys of k0..k{}",
            owned.len(),
            want * 1024
        ));
    }
    eprintln!(
        "--owned-only: the first {want} keys {me} owns (of k0..k{})",
        owned.last().copied().unwrap_or(0)
    );
    Ok(owned)
}

/// The host:port and path prefix of the URL.
fn target(url: &str) -> Result<(String, String), String> {
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| format!("--url {url:?}: only http:// URLs"))?;
    let (host, path) = rest.split_once('/').map_or((rest, ""), |(h, p)| (h, p));
    Ok((
        host.to_owned(),
        format!("/{}", path.trim_end_matches('/'))
            .trim_end_matches('/')
            .to_owned(),
    ))
}

async fn bench(args: BenchArgs, phases: Vec<(u64, Duration)>) -> Result<u64, String> {
    let (host, prefix) = target(&args.url)?;
    let conns = args.connections.max(1);
    let counters = Arc::new(Counters::default());
    let total: Duration = phases.iter().map(|p| p.1).sum();
    let start = Instant::now() + Duration::from_millis(200);
    let mut tasks = Vec::with_capacity(conns);
    for c in 0..conns {
        let stream = TcpStream::connect(&host)
            .await
            .map_err(|e| format!("cannot connect to {host}: {e}"))?;
        stream.set_nodelay(true).map_err(|e| e.to_string())?;
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| format!("HTTP handshake with {host}: {e}"))?;
        tokio::spawn(conn);
        let (args, phases, counters, host, prefix) = (
            args.clone(),
            phases.clone(),
            Arc::clone(&counters),
            host.clone(),
            prefix.clone(),
        );
        tasks.push(tokio::spawn(async move {
            connection(
                c, conns, sender, args, phases, start, counters, host, prefix,
            )
            .await
        }));
    }
    let progress = {
        let counters = Arc::clone(&counters);
        tokio::spawn(async move {
            let mut last = 0;
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            tick.tick().await;
            loop {
                tick.tick().await;
                let sent = counters.sent.load(Ordering::Relaxed);
                let elapsed = start.elapsed().as_secs_f64().min(total.as_secs_f64());
                eprintln!(
                    "  {elapsed:5.1}s / {:.0}s  sent {sent}  {:>8} req/s  errors {}",
                    total.as_secs_f64(),
                    sent - last,
                    counters.errors.load(Ordering::Relaxed)
                );
                last = sent;
            }
        })
    };
    let mut hist =
        Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).map_err(|e| e.to_string())?;
    for t in tasks {
        let h = t.await.map_err(|e| e.to_string())?;
        hist.add(&h).map_err(|e| e.to_string())?;
    }
    progress.abort();
    let elapsed = start.elapsed().as_secs_f64();
    let ok = counters.ok.load(Ordering::Relaxed);
    let denied = counters.denied.load(Ordering::Relaxed);
    let errors = counters.errors.load(Ordering::Relaxed);
    let decisions = counters.decisions.load(Ordering::Relaxed);
    let us = |q: f64| hist.value_at_quantile(q) as f64 / 1000.0;
    println!(
        "\n| endpoint | target req/s | achieved req/s | decisions/s | allowed | denied | errors | p50 ms | p90 ms | p99 ms | p99.9 ms | max ms |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
    let target: u64 = phases.iter().map(|p| p.0).max().unwrap_or(0);
    println!(
        "| {} | {target} | {:.0} | {:.0} | {} | {} | {errors} | {:.3} | {:.3} | {:.3} | {:.3} | {:.3} |",
        match args.endpoint {
            Endpoint::Check => "check",
            Endpoint::Batch => "batch",
            Endpoint::Authz => "authz",
        },
        (ok + denied) as f64 / elapsed,
        decisions as f64 / elapsed,
        ok,
        denied,
        us(0.5),
        us(0.9),
        us(0.99),
        us(0.999),
        hist.max() as f64 / 1000.0,
    );
    Ok(ok + denied)
}

#[allow(clippy::too_many_arguments)]
async fn connection(
    c: usize,
    conns: usize,
    mut sender: hyper::client::conn::http1::SendRequest<Full<Bytes>>,
    args: BenchArgs,
    phases: Vec<(u64, Duration)>,
    start: Instant,
    counters: Arc<Counters>,
    host: String,
    prefix: String,
) -> Histogram<u64> {
    let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).expect("valid bounds");
    let mut rng = 0x9e37_79b9_7f4a_7c15u64 ^ (c as u64).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    let mut phase_start = start;
    for (rate, len) in phases {
        // This connection's share of the rate, as a fixed interval between sends.
        let interval = Duration::from_secs_f64(conns as f64 / rate as f64);
        let mut due = phase_start + interval.mul_f64(c as f64 / conns as f64);
        let end = phase_start + len;
        while due < end {
            // Latency counts from the scheduled time when the send is late because this
            // connection was still waiting for an answer (coordinated omission corrected: a
            // slow answer delays the next send, and that delay is counted, not hidden). When the
            // connection was free and the send waited on the generator's own timer, which
            // wakes up to a millisecond late, it counts from the send.
            let late_by_answer = Instant::now() >= due;
            if !late_by_answer {
                tokio::time::sleep_until(due.into()).await;
            }
            let from = if late_by_answer { due } else { Instant::now() };
            let req = request(&args, &host, &prefix, &mut rng);
            counters.sent.fetch_add(1, Ordering::Relaxed);
            match sender.send_request(req).await {
                Ok(resp) => {
                    let status = resp.status().as_u16();
                    let body = resp
                        .into_body()
                        .collect()
                        .await
                        .map(|b| b.to_bytes())
                        .unwrap_or_default();
                    let n = if args.endpoint == Endpoint::Batch {
                        args.batch_size as u64
                    } else {
                        1
                    };
                    match status {
                        200 if args.endpoint == Endpoint::Check
                            && contains(&body, b"\"allowed\":false") =>
                        {
                            counters.denied.fetch_add(1, Ordering::Relaxed);
                        }
                        200 => {
                            counters.ok.fetch_add(1, Ordering::Relaxed);
                        }
                        429 | 403 if args.endpoint == Endpoint::Authz => {
                            counters.denied.fetch_add(1, Ordering::Relaxed);
                        }
                        _ => {
                            counters.errors.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    if status == 200 || status == 429 || status == 403 {
                        counters.decisions.fetch_add(n, Ordering::Relaxed);
                    }
                }
                Err(_) => {
                    counters.errors.fetch_add(1, Ordering::Relaxed);
                    return hist;
                }
            }
            let latency = Instant::now().saturating_duration_since(from);
            let _ = hist.record((latency.as_micros() as u64).max(1));
            due += interval;
        }
        phase_start = end;
    }
    hist
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

fn next_key(args: &BenchArgs, rng: &mut u64) -> u64 {
    let i = next_index(args, rng);
    match &args.owned {
        Some(owned) => owned[(i as usize).min(owned.len() - 1)],
        None => i,
    }
}

fn next_index(args: &BenchArgs, rng: &mut u64) -> u64 {
    *rng ^= *rng << 13;
    *rng ^= *rng >> 7;
    *rng ^= *rng << 17;
    let keys = args.keys.max(1);
    match args.distribution {
        Distribution::Uniform => *rng % keys,
        Distribution::Zipf => {
            // Inverse of the harmonic CDF, approximately: k = keys^u − 1.
            let u = (*rng >> 11) as f64 / (1u64 << 53) as f64;
            ((keys as f64).powf(u) - 1.0)
                .floor()
                .clamp(0.0, (keys - 1) as f64) as u64
        }
    }
}

fn request(args: &BenchArgs, host: &str, prefix: &str, rng: &mut u64) -> Request<Full<Bytes>> {
    let builder = Request::builder().header("host", host);
    match args.endpoint {
        Endpoint::Check => {
            let body = format!(
                "{{\"rule\":\"{}\",\"key\":\"k{}\"}}",
                args.rule,
                next_key(args, rng)
            );
            builder
                .method("POST")
                .uri(format!("{prefix}/v1/check"))
                .header("content-type", "application/json")
                .body(Full::new(Bytes::from(body)))
        }
        Endpoint::Batch => {
            let mut body = String::from("{\"checks\":[");
            for i in 0..args.batch_size {
                if i > 0 {
                    body.push(',');
                }
                body.push_str(&format!(
                    "{{\"rule\":\"{}\",\"key\":\"k{}\"}}",
                    args.rule,
                    next_key(args, rng)
                ));
            }
            body.push_str("]}");
            builder
                .method("POST")
                .uri(format!("{prefix}/v1/check/batch"))
                .header("content-type", "application/json")
                .body(Full::new(Bytes::from(body)))
        }
        Endpoint::Authz => builder
            .method("GET")
            .uri(format!("{prefix}/v1/authz/{}", args.rule))
            .header(
                args.key_header.as_str(),
                format!("k{}", next_key(args, rng)),
            )
            .body(Full::new(Bytes::new())),
    }
    .expect("a valid request")
}
