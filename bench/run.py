#!/usr/bin/env python3
"""Levee's benchmark suite: figures 1 to 7 of BENCHMARKS.md in one command.

    bench/run.sh            # full pass, ~7 minutes (plus the release build if stale)
    bench/run.sh --quick    # ~2 minutes, fewer and shorter runs
    bench/run.sh --help

Run from the repository root. Dependency-free (Python 3.11 standard library). It installs the
anchors from Debian packages if they are missing (nginx, wrk, redis-server), starts them and
Levee on free loopback ports, alternates Levee and each anchor in short runs (A B A B ...),
reports the median of the pairwise ratios with the absolute figures beside them, prints ONE
markdown table, and stops everything it started on exit (normal exit, error, Ctrl-C, SIGTERM).

Every ratio reads "above 1: Levee is better": throughput Levee / anchor (figures 1, 2), cost
anchor / Levee (figure 4's ns per decision, and the "CPU/decision" beside figures 1 and 2's
ratios: the servers' utime + stime per decision), latency anchor p99 / Levee p99 (figure 5).
See docs/benchmarks.md for how to read the table.
"""

from __future__ import annotations

import argparse
import atexit
import datetime as dt
import http.client
import json
import os
import re
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BENCH = REPO / "bench"
T0 = time.monotonic()

# ---------------------------------------------------------------------------------------------
# Output


def log(msg: str) -> None:
    el = time.monotonic() - T0
    print(f"[{int(el // 60):02d}:{el % 60:04.1f}] {msg}", file=sys.stderr, flush=True)


def load1() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def fmt_int(x: float | None) -> str:
    return "—" if x is None else f"{x:,.0f}"


def fmt_ms(us: float | None) -> str:
    return "—" if us is None else f"{us / 1000:.2f}"


def median(xs: list[float]) -> float | None:
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


# ---------------------------------------------------------------------------------------------
# Processes: everything started goes through here, and is stopped on exit by its pid.

PROCS: list[tuple[str, subprocess.Popen]] = []
WORK: Path | None = None
KEEP_WORK = False


def start(name: str, cmd: list[str], log_path: Path, **kw) -> subprocess.Popen:
    if C.pin and name != "perf":
        # `--pin`: every server on core 0 (children and threads inherit it).
        cmd = ["taskset", "-c", "0"] + cmd
    f = open(log_path, "wb")
    p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=f, stderr=subprocess.STDOUT, **kw)
    PROCS.append((name, p))
    return p


def stop(p: subprocess.Popen, sig: int = signal.SIGTERM, wait: float = 5.0) -> None:
    if p.poll() is not None:
        return
    try:
        p.send_signal(sig)
        p.wait(timeout=wait)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
    except ProcessLookupError:
        pass


def cleanup() -> None:
    for name, p in reversed(PROCS):
        if p.poll() is None:
            # nginx: SIGTERM to the master stops its workers too.
            stop(p)
    PROCS.clear()
    if WORK is not None and not KEEP_WORK:
        shutil.rmtree(WORK, ignore_errors=True)


def on_signal(signum, _frame):
    raise SystemExit(128 + signum)


def run(cmd: list[str], timeout: float, **kw) -> subprocess.CompletedProcess:
    """Runs a bounded command; its output is captured."""
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)


def free_port(udp_too: bool = False) -> int:
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if not udp_too:
            return port
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as u:
                u.bind(("127.0.0.1", port))
            return port
        except OSError:
            continue


def wait_http(port: int, path: str, timeout: float = 30.0, want: int = 200) -> None:
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            c.request("GET", path)
            r = c.getresponse()
            r.read()
            c.close()
            if r.status == want:
                return
            last = r.status
        except OSError as e:
            last = e
        time.sleep(0.1)
    raise RuntimeError(f"127.0.0.1:{port}{path} not answering {want} after {timeout}s ({last})")


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for {pid}")


CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (all its threads), in seconds."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def metrics(port: int) -> dict[str, float]:
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request("GET", "/metrics")
    text = c.getresponse().read().decode()
    c.close()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name, _, value = line.rpartition(" ")
        try:
            out[name] = float(value)
        except ValueError:
            pass
    return out


def metric_sum(m: dict[str, float], prefix: str) -> float:
    return sum(v for k, v in m.items() if k == prefix or k.startswith(prefix + "{"))


# ---------------------------------------------------------------------------------------------
# Tools


def ensure_tools() -> None:
    need = {"nginx": "nginx", "wrk": "wrk", "redis-server": "redis-server",
            "redis-benchmark": "redis-tools", "redis-cli": "redis-tools"}
    missing = sorted({pkg for exe, pkg in need.items()
                      if shutil.which(exe) is None and not Path("/usr/sbin", exe).exists()})
    if not missing:
        return
    sudo = [] if os.geteuid() == 0 else ["sudo", "-n"]
    log(f"installing {' '.join(missing)} with apt-get")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    subprocess.run(sudo + ["apt-get", "update", "-qq"], check=True, env=env, timeout=300)
    subprocess.run(sudo + ["apt-get", "install", "-y", "-qq", "--no-install-recommends"] + missing,
                   check=True, env=env, timeout=600)


def which(exe: str) -> str:
    p = shutil.which(exe) or (f"/usr/sbin/{exe}" if Path("/usr/sbin", exe).exists() else None)
    if p is None:
        raise RuntimeError(f"{exe} not found")
    return p


def target_dir() -> Path:
    if os.environ.get("CARGO_TARGET_DIR"):
        return Path(os.environ["CARGO_TARGET_DIR"]).resolve()
    r = run(["cargo", "metadata", "--format-version", "1", "--no-deps"], timeout=120, cwd=REPO)
    return Path(json.loads(r.stdout)["target_directory"])


# ---------------------------------------------------------------------------------------------
# Servers


LEVEE_RULES = """
# Mostly allowed: far above what one key sees (10,000 keys share the load).
[[rule]]
name = "allow"
algorithm = "token_bucket"
rate = 1000000
per = "1s"
burst = 1000000
key_from = "header:x-key"

# Near its limit at figure 9's load (each key asked about once a second): a bucket of 2
# refilling 2 a second, so that every decision leaves it further from full than a node's
# quiet margin and every write is sent (docs/replication.md), as for a key used near its
# limit (`--fig9-rule tight`).
[[rule]]
name = "tight"
algorithm = "token_bucket"
rate = 2
per = "1s"
burst = 2
key_from = "header:x-key"

# Mostly denied: one request per key per minute.
[[rule]]
name = "deny"
algorithm = "token_bucket"
rate = 1
per = "1m"
burst = 1
key_from = "header:x-key"
"""


def start_levee_single(levee: str, work: Path, name: str = "levee",
                       http_threads: int | None = None) -> tuple[subprocess.Popen, int]:
    """A single node; `http_threads` sets LEVEE_WORKER_THREADS (None: Levee's default, one
    per core)."""
    port = free_port()
    cfg = work / f"{name}.toml"
    cfg.write_text(f"""# Generated by bench/run.py: one node, no persistence.
[node]
id = "bench-1"
region = "local"
http = "127.0.0.1:{port}"
max_keys = 4000000
{LEVEE_RULES}""")
    env = dict(os.environ, LEVEE_LOG="warn")
    if http_threads is not None:
        env["LEVEE_WORKER_THREADS"] = str(http_threads)
    p = start(name, [levee, "serve", "--config", str(cfg)], work / f"{name}.log", env=env)
    wait_http(port, "/readyz")
    return p, port


NGINX_CONF = """# Generated by bench/run.py.
daemon off;
master_process on;
worker_processes 1;
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;
events {{ worker_connections 4096; }}
http {{
  access_log off;
  keepalive_requests 100000000;
  keepalive_timeout 300s;
  client_body_temp_path {dir}/body;
  proxy_temp_path {dir}/proxy;
  fastcgi_temp_path {dir}/fastcgi;
  uwsgi_temp_path {dir}/uwsgi;
  scgi_temp_path {dir}/scgi;
  # The same two limits as Levee's rules, keyed by the same header.
  limit_req_zone $http_x_key zone=k:64m rate=1000000r/s;
  limit_req_zone $http_x_key zone=k_low:64m rate=1r/m;
  limit_req_status 429;
  server {{
    listen 127.0.0.1:{port} backlog=4096;
    # Mostly allowed. empty_gif, not `return`: `return` answers before limit_req runs.
    location /allow {{ limit_req zone=k burst=1000000 nodelay; empty_gif; }}
    # Mostly denied.
    location /deny {{ limit_req zone=k_low nodelay; empty_gif; }}
    # The same limit under Levee's path, for `levee bench --endpoint authz` (figure 5).
    location = /v1/authz/allow {{ limit_req zone=k burst=1000000 nodelay; empty_gif; }}
  }}
}}
"""


def start_nginx(work: Path) -> tuple[subprocess.Popen, int]:
    d = work / "nginx"
    d.mkdir()
    d.chmod(0o755)
    port = free_port()
    conf = d / "nginx.conf"
    conf.write_text(NGINX_CONF.format(dir=d, port=port))
    nginx = which("nginx")
    # -e: the start-up error log too, so that nginx never touches /var/log (non-root runs).
    r = run([nginx, "-t", "-q", "-e", str(d / "error.log"), "-p", str(d), "-c", str(conf)],
            timeout=30)
    if r.returncode != 0:
        raise RuntimeError(f"nginx -t: {r.stderr}")
    p = start("nginx", [nginx, "-e", str(d / "error.log"), "-p", str(d), "-c", str(conf)],
              d / "out.log")
    wait_http(port, "/allow")
    return p, port


def start_redis(work: Path, anchor_script: Path) -> tuple[subprocess.Popen, int, str]:
    d = work / "redis"
    d.mkdir()
    port = free_port()
    p = start("redis", [which("redis-server"), "--port", str(port), "--bind", "127.0.0.1",
                        "--save", "", "--appendonly", "no", "--protected-mode", "no",
                        "--dir", str(d), "--daemonize", "no"], d / "redis.log")
    cli = which("redis-cli")
    for _ in range(100):
        if run([cli, "-p", str(port), "PING"], timeout=5).stdout.strip() == "PONG":
            break
        time.sleep(0.1)
    else:
        raise RuntimeError("redis-server did not start")
    script = anchor_script.read_text()
    sha = run([cli, "-p", str(port), "SCRIPT", "LOAD", script], timeout=10).stdout.strip()
    if not re.fullmatch(r"[0-9a-f]{40}", sha):
        raise RuntimeError(f"SCRIPT LOAD failed: {sha!r}")
    probe = run([cli, "-p", str(port), "EVALSHA", sha, "1", "probe", "1000000", "1000000", "1",
                 "60"], timeout=10).stdout.split()
    if not probe or probe[0] != "1":
        raise RuntimeError(f"the anchor script did not allow a first request: {probe}")
    run([cli, "-p", str(port), "DEL", "probe"], timeout=10)
    return p, port, sha


# ---------------------------------------------------------------------------------------------
# Load generators


class Cfg:
    quick: bool
    pairs: int
    secs: float
    threads: int
    conns: int
    keys: int
    fig9_rate: int
    fig9_topology: str
    fig9_rule: str
    fig9_warm: int
    http_threads: int | None
    pin: bool = False


C = Cfg()


def generator(cmd: list[str]) -> list[str]:
    """A load generator's command: on core 1 with `--pin` (the servers are on core 0)."""
    return (["taskset", "-c", "1"] + cmd) if C.pin else cmd


def process_tree(pid: int) -> list[int]:
    """A process and its children (nginx: the master and its worker)."""
    out = [pid]
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            out += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            pass
    return out


def cpu_of(pids: list[int]) -> float:
    return sum(cpu_seconds(p) for p in pids)


def wrk(url: str, secs: float | None = None, pids: list[int] | None = None) -> dict:
    """One wrk run; with `pids`, also the server's CPU time per request (utime + stime)."""
    secs = C.secs if secs is None else secs
    c0 = cpu_of(pids) if pids else 0.0
    cmd = [which("wrk"), f"-t{C.threads}", f"-c{C.conns}", f"-d{secs:g}s", "--timeout", "5s",
           "-s", str(BENCH / "wrk_keys.lua"), url, "--", str(C.keys), "x-key"]
    r = run(generator(cmd), timeout=secs + 30)
    c1 = cpu_of(pids) if pids else 0.0
    m = re.search(r"^WRKJSON (\{.*\})$", r.stdout, re.M)
    if not m:
        raise RuntimeError(f"wrk {url}: no result\n{r.stdout}\n{r.stderr}")
    j = json.loads(m.group(1))
    j["rps"] = j["requests"] / (j["duration_us"] / 1e6)
    j["denied_frac"] = j["status"] / max(1, j["requests"])
    j["other_errors"] = j["connect"] + j["read"] + j["write"] + j["timeout"]
    j["cpu_us"] = (c1 - c0) / max(1, j["requests"]) * 1e6 if pids else None
    return j


REDIS_BENCH_N: dict[int, int] = {}


def redis_bench(port: int, sha: str, pipeline: int, pid: int) -> dict:
    """One redis-benchmark run sized to last about C.secs (from the previous run's rate)."""
    n = REDIS_BENCH_N.get(pipeline, 20_000 * max(1, pipeline // 4))
    cmd = [which("redis-benchmark"), "-p", str(port), "-c", str(C.conns), "-n", str(n),
           "-r", str(C.keys), "-P", str(pipeline), "--csv",
           "EVALSHA", sha, "1", "rl:__rand_int__", "1000000", "1000000", "1", "60"]
    t = time.monotonic()
    c0 = cpu_seconds(pid)
    r = run(generator(cmd), timeout=120)
    c1 = cpu_seconds(pid)
    wall = time.monotonic() - t
    rows = [ln for ln in r.stdout.splitlines() if ln.startswith('"EVALSHA')]
    if not rows:
        raise RuntimeError(f"redis-benchmark: no result\n{r.stdout}\n{r.stderr}")
    f = [x.strip('"') for x in rows[-1].split('","')]
    rps = float(f[1])
    REDIS_BENCH_N[pipeline] = max(10_000, int(rps * C.secs))
    return {"rps": rps, "p50_us": float(f[4]) * 1000, "p99_us": float(f[6]) * 1000, "wall": wall,
            "n": n, "cpu_us": (c1 - c0) / n * 1e6}


def levee_bench(levee: str, port: int, args: list[str], secs: float,
                pids: list[int] | None = None) -> dict:
    """One `levee bench` run; with `pids`, also the server's CPU per decision; always the
    generator's own CPU (cores), from the children's rusage."""
    cmd = [levee, "bench", "--url", f"http://127.0.0.1:{port}", "--duration", f"{int(secs)}",
           "--keys", str(C.keys)] + args
    g0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    each0 = [cpu_seconds(p) for p in pids or []]
    t = time.monotonic()
    r = run(generator(cmd), timeout=secs * 3 + 60)
    wall = time.monotonic() - t
    each = [cpu_seconds(p) - c for p, c in zip(pids or [], each0)]
    g1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    row = None
    for line in r.stdout.splitlines():
        if line.startswith("| ") and not line.startswith("| endpoint"):
            row = [c.strip() for c in line.strip().strip("|").split("|")]
    if row is None:
        raise RuntimeError(f"levee bench: no result\n{r.stdout}\n{r.stderr}")
    keys = ["endpoint", "target", "rps", "dps", "allowed", "denied", "errors", "p50", "p90",
            "p99", "p999", "max"]
    d = dict(zip(keys, row))
    out = {k: float(d[k]) for k in keys[1:]}
    for k in ("p50", "p90", "p99", "p999", "max"):
        out[k + "_us"] = out.pop(k) * 1000
    per_request = out["dps"] / out["rps"] if out["rps"] else 0.0
    decisions = (out["allowed"] + out["denied"]) * per_request
    out["cpu_us"] = sum(each) / decisions * 1e6 if pids and decisions else None
    # Each server process's part, in the order of `pids` (a cluster's nodes).
    out["cpu_us_each"] = [c / decisions * 1e6 for c in each] if pids and decisions else []
    out["gen_cores"] = (g1.ru_utime + g1.ru_stime - g0.ru_utime - g0.ru_stime) / wall
    return out


# ---------------------------------------------------------------------------------------------
# The table

ROWS: list[dict] = []
NOTES: list[str] = []


def row(fig: str, what: str, levee: str, anchor: str, ratio: float | str | None, target: str,
        meets: bool | None, load: float, ratio_fmt: str = "{:.2f}") -> None:
    ROWS.append({
        "fig": fig, "what": what, "levee": levee, "anchor": anchor,
        "ratio": ratio if isinstance(ratio, str) else
                 ("—" if ratio is None else ratio_fmt.format(ratio)),
        "target": target, "meets": "—" if meets is None else ("**yes**" if meets else "no"),
        "load": f"{load:.1f}",
    })


def table() -> str:
    out = ["| fig | measurement | Levee | anchor | Levee/anchor (median of pairs) | target "
           "| met | load |",
           "|---|---|---|---|---|---|---|---|"]
    for r in ROWS:
        out.append(f"| {r['fig']} | {r['what']} | {r['levee']} | {r['anchor']} | {r['ratio']} "
                   f"| {r['target']} | {r['meets']} | {r['load']} |")
    return "\n".join(out)


def lat(p50: float, p99: float) -> str:
    return f"p50 {fmt_ms(p50)} / p99 {fmt_ms(p99)} ms"


# ---------------------------------------------------------------------------------------------
# Figures


def cpu_cell(xs: list[dict]) -> str:
    c = median([x["cpu_us"] for x in xs])
    return "" if c is None else f"; server CPU {c:.1f} µs/decision"


def ratio_cell(r: float | None, cpu_r: float | None) -> str:
    if r is None:
        return "—"
    return f"{r:.2f}" + ("" if cpu_r is None else f" (CPU/decision: {cpu_r:.2f})")


def fig1(levee_port: int, levee_pid: int, nginx_port: int, nginx_pid: int) -> float | None:
    """HTTP decisions/s, Levee /v1/authz vs nginx limit_req; returns Levee's allowed req/s."""
    saturating = None
    lp, np_ = [levee_pid], process_tree(nginx_pid)
    for case in ("allow", "deny"):
        ld = load1()
        lurl = f"http://127.0.0.1:{levee_port}/v1/authz/{case}"
        nurl = f"http://127.0.0.1:{nginx_port}/{case}"
        log(f"fig 1 ({case}): warm-up, then {C.pairs} × (Levee, nginx) of {C.secs:g}s; load {ld}")
        wrk(lurl, 1)
        wrk(nurl, 1)
        L, N, ratios, cpu_ratios = [], [], [], []
        for i in range(C.pairs):
            a = wrk(lurl, pids=lp)
            b = wrk(nurl, pids=np_)
            L.append(a)
            N.append(b)
            ratios.append(a["rps"] / b["rps"])
            cpu_ratios.append(b["cpu_us"] / a["cpu_us"] if a["cpu_us"] else None)
            log(f"  pair {i + 1}: Levee {a['rps']:,.0f} req/s ({a['denied_frac']:.0%} denied, "
                f"{a['cpu_us']:.1f} µs CPU/req)  nginx {b['rps']:,.0f} req/s "
                f"({b['denied_frac']:.0%} denied, {b['cpu_us']:.1f} µs CPU/req)  "
                f"ratio {ratios[-1]:.2f}")
        errs = sum(x["other_errors"] for x in L + N)
        if errs:
            NOTES.append(f"Figure 1 ({case}): {errs} socket errors or timeouts in wrk runs.")
        r = median(ratios)
        lr, nr = median([x["rps"] for x in L]), median([x["rps"] for x in N])
        ldf, ndf = median([x["denied_frac"] for x in L]), median([x["denied_frac"] for x in N])
        label = "mostly allowed" if case == "allow" else "mostly denied"
        row("1", f"`GET /v1/authz` req/s, {label} (wrk -t{C.threads} -c{C.conns}, "
                 f"{C.keys:,} keys; Levee {ldf:.0%} / nginx {ndf:.0%} denied)",
            f"{fmt_int(lr)} req/s; "
            f"{lat(median([x['p50_us'] for x in L]), median([x['p99_us'] for x in L]))}"
            f"{cpu_cell(L)}",
            f"nginx `limit_req` {fmt_int(nr)} req/s; "
            f"{lat(median([x['p50_us'] for x in N]), median([x['p99_us'] for x in N]))}"
            f"{cpu_cell(N)}",
            ratio_cell(r, median(cpu_ratios)), "≥ 1.0", None if r is None else r >= 1.0, ld)
        if case == "allow":
            saturating = lr
    return saturating


def fig2(levee_port: int, levee_pid: int, redis_port: int, redis_pid: int, sha: str) -> None:
    ld = load1()
    lurl = f"http://127.0.0.1:{levee_port}/v1/authz/allow"
    log(f"fig 2: {C.pairs} × (Levee, Redis EVALSHA, Redis EVALSHA -P 16) of ~{C.secs:g}s; "
        f"load {ld}")
    redis_bench(redis_port, sha, 1, redis_pid)   # warm-up, sizes the next runs
    redis_bench(redis_port, sha, 16, redis_pid)
    L, R1, R16 = [], [], []
    for i in range(C.pairs):
        a = wrk(lurl, pids=[levee_pid])
        b = redis_bench(redis_port, sha, 1, redis_pid)
        c = redis_bench(redis_port, sha, 16, redis_pid)
        L.append(a)
        R1.append(b)
        R16.append(c)
        log(f"  round {i + 1}: Levee {a['rps']:,.0f} ({a['cpu_us']:.1f} µs CPU)  Redis "
            f"{b['rps']:,.0f} ({b['cpu_us']:.1f} µs)  Redis -P16 {c['rps']:,.0f} "
            f"({c['cpu_us']:.1f} µs) decisions/s")
    lr = median([x["rps"] for x in L])
    levee_cell = (f"{fmt_int(lr)} decisions/s (`/v1/authz`, wrk -c{C.conns}); "
                  f"{lat(median([x['p50_us'] for x in L]), median([x['p99_us'] for x in L]))}"
                  f"{cpu_cell(L)}")
    for R, what, target, goal in ((R1, "unpipelined", "≥ 2.0", 2.0),
                                  (R16, "`-P 16`", "—", None)):
        r = median([a["rps"] / b["rps"] for a, b in zip(L, R)])
        cr = median([b["cpu_us"] / a["cpu_us"] for a, b in zip(L, R) if a["cpu_us"]])
        row("2", f"decisions/s vs Redis + Lua `EVALSHA`, {what} (redis-benchmark -c{C.conns} "
                 f"-r {C.keys})",
            levee_cell,
            f"{fmt_int(median([x['rps'] for x in R]))} decisions/s; "
            f"{lat(median([x['p50_us'] for x in R]), median([x['p99_us'] for x in R]))}"
            f"{cpu_cell(R)}",
            ratio_cell(r, cr), target, None if goal is None or r is None else r >= goal, ld)


def fig3(levee: str, levee_port: int, levee_pid: int) -> None:
    ld = load1()
    runs = 1 if C.quick else 2
    secs = max(2, int(C.secs))
    log(f"fig 3: /v1/check/batch, 100 and 1,000 checks a request, {runs} × {secs}s each; load {ld}")
    for size, conns in ((100, 16), (1000, 4)):
        # The generator is open-loop and sends every scheduled request, however late: asked
        # for far more than the node can do, a run lasts (asked / achieved) × its duration.
        # So a 1 s probe first, then runs asked for 50 % more than the probe achieved
        # (doubled if a run got everything it asked for): saturated, with bounded durations.
        common = ["--endpoint", "batch", "--batch-size", str(size), "--rule", "allow",
                  "--connections", str(conns)]
        probe = levee_bench(levee, levee_port, common + ["--rate", str(1_200_000 // size)], 1)
        ask = max(conns, int(probe["rps"] * 1.5))
        res = []
        for _ in range(runs):
            x = levee_bench(levee, levee_port, common + ["--rate", str(ask)], secs, [levee_pid])
            x["saturated"] = x["rps"] < 0.95 * ask
            res.append(x)
            log(f"  batch {size}: {x['dps']:,.0f} decisions/s ({x['rps']:,.0f} of {ask:,} req/s "
                f"asked, errors {x['errors']:.0f}); server {x['cpu_us']:.2f} µs CPU/decision; "
                f"generator {x['gen_cores']:.2f} cores")
            if not x["saturated"]:
                ask *= 2
        dps = median([x["dps"] for x in res])
        cpu = median([x["cpu_us"] for x in res])
        gen = median([x["gen_cores"] for x in res])
        saturated = any(x["saturated"] for x in res)
        row("3", f"`POST /v1/check/batch` decisions/s, {size:,} checks a request "
                 f"(levee bench, {conns} connections, asked for more than it can do)",
            f"{fmt_int(dps)} decisions/s ({fmt_int(median([x['rps'] for x in res]))} req/s"
            f"{'' if saturated else '; NOT saturated: the generator was the limit'}); "
            f"server CPU {cpu:.2f} µs/decision (= {1e6 / cpu * os.cpu_count():,.0f}/s on "
            f"{os.cpu_count()} dedicated cores); generator used {gen:.2f} cores",
            "—", None, "≥ 1,000,000", dps is not None and dps >= 1_000_000, ld)


UNITS = {"ps": 1e-3, "ns": 1.0, "µs": 1e3, "us": 1e3, "ms": 1e6, "s": 1e9}


def fig4() -> None:
    ld = load1()
    passes = 1 if C.quick else 3
    log(f"fig 4: cargo bench -p levee-core --bench decision, {passes} pass(es); load {ld}")
    flt = "token_bucket_dashmap|governor_keyed$"
    t = time.monotonic()
    # Built once; every pass runs the same executable, even if the tree changes meanwhile.
    r = run(["cargo", "bench", "-p", "levee-core", "--bench", "decision", "--no-run",
             "--message-format=json"], timeout=1800, cwd=REPO)
    exe = None
    for line in r.stdout.splitlines():
        try:
            j = json.loads(line)
        except ValueError:
            continue
        if (j.get("reason") == "compiler-artifact" and j.get("target", {}).get("name")
                == "decision" and j.get("executable")):
            exe = j["executable"]
    if r.returncode != 0 or exe is None:
        raise RuntimeError(f"cargo bench --no-run failed\n{r.stderr[-3000:]}")
    log(f"  built the criterion bench in {time.monotonic() - t:.0f}s: {exe}")
    if WORK is not None:  # a private copy, as for levee
        shutil.copy2(exe, WORK / "decision-bench")
        exe = str(WORK / "decision-bench")
    results: dict[str, list[float]] = {}
    for i in range(passes):
        cmd = [exe, "--bench", "--noplot", "--warm-up-time", "0.5", "--measurement-time",
               "1" if C.quick else "1.5", flt]
        r = run(cmd, timeout=900, cwd=REPO / "crates" / "levee-core")
        found = re.findall(r"^(\S+)\s+time:\s+\[(\S+) (\S+) (\S+) (\S+) (\S+) (\S+)\]",
                           r.stdout, re.M)
        if r.returncode != 0 or not found:
            raise RuntimeError(f"cargo bench failed\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
        for name, *v in found:
            results.setdefault(name, []).append(float(v[2]) * UNITS[v[3]])
        log("  pass %d: %s" % (i + 1, ", ".join(f"{k.split('/')[-1]}"
                                                 f"{' (2 thr)' if '2_threads' in k else ''} "
                                                 f"{v[-1]:.1f} ns" for k, v in results.items())))
    g1 = "decide_10k_keys_1_thread/"
    g2 = "decide_10k_keys_2_threads/"

    def ratio(levee_key: str, anchor_key: str) -> tuple[float | None, float | None, float | None]:
        lv, an = results.get(levee_key, []), results.get(anchor_key, [])
        rs = [a / l for l, a in zip(lv, an)]
        return median(lv), median(an), median(rs)

    for what, lk, ak in (
        ("1 thread, token bucket, single node", g1 + "levee_token_bucket_dashmap",
         g1 + "governor_keyed"),
        ("1 thread, token bucket, 3 regions × 2 nodes (strict)",
         g1 + "levee_token_bucket_dashmap_3_regions", g1 + "governor_keyed"),
        ("2 threads, one shared map, token bucket, single node",
         g2 + "levee_token_bucket_dashmap", g2 + "governor_keyed"),
    ):
        lv, an, r = ratio(lk, ak)
        row("4", f"in-process ns per decision, 10,000 keys, {what} (criterion, DashMap)",
            f"{lv:.1f} ns" if lv else "—", f"`governor` keyed {an:.1f} ns" if an else "—",
            r, "—", None, ld)


def fig5(levee: str, levee_port: int, nginx_port: int, saturating: float) -> None:
    ld = load1()
    secs = 3 if C.quick else 4
    reps = 1 if C.quick else 3
    log(f"fig 5: open-loop latency at 25/50/80 % of {saturating:,.0f} req/s, {reps} × (Levee, "
        f"nginx) with the same generator, {secs}s each; load {ld}")
    for pct in (25, 50, 80):
        rate = max(100, int(saturating * pct / 100))
        args = ["--endpoint", "authz", "--rule", "allow", "--key-header", "x-key", "--rate",
                str(rate), "--connections", str(C.conns)]
        A, B = [], []
        for _ in range(reps):
            A.append(levee_bench(levee, levee_port, args, secs))
            B.append(levee_bench(levee, nginx_port, args, secs))
            a, b = A[-1], B[-1]
            log(f"  {pct}%: Levee {a['rps']:,.0f} req/s, p50/p99/p99.9 {fmt_ms(a['p50_us'])}/"
                f"{fmt_ms(a['p99_us'])}/{fmt_ms(a['p999_us'])} ms; nginx {b['rps']:,.0f} req/s, "
                f"{fmt_ms(b['p50_us'])}/{fmt_ms(b['p99_us'])}/{fmt_ms(b['p999_us'])} ms")

        def cell(xs: list[dict]) -> str:
            m = {k: median([x[k] for x in xs]) for k in ("p50_us", "p99_us", "p999_us", "rps")}
            return (f"p50 {fmt_ms(m['p50_us'])} / p99 {fmt_ms(m['p99_us'])} / p99.9 "
                    f"{fmt_ms(m['p999_us'])} ms ({fmt_int(m['rps'])} req/s achieved)")

        p99 = median([x["p99_us"] for x in A])
        r = median([b["p99_us"] / a["p99_us"] for a, b in zip(A, B) if a["p99_us"]])
        row("5", f"latency, open loop at {pct} % of saturation = {rate:,} req/s (`levee bench "
                 f"--endpoint authz`, {C.conns} connections, CO corrected; ratio = nginx p99 / "
                 f"Levee p99)",
            cell(A), "nginx " + cell(B), r,
            "p99 < 1 ms" if pct == 50 else "—",
            (p99 is not None and p99 < 1000) if pct == 50 else None, ld)


def write_cluster(levee: str, work: Path, name: str, max_keys: int,
                  regions: tuple[str, ...] = ("eu", "us", "ap"), per_region: int = 1,
                  local_first: bool = False, topology: str = "mesh") -> list[dict]:
    """`regions` of `per_region` nodes each (three regions of one by default), as `levee
    cluster` lays them out (mutual TLS, strict mode, 20 ms gossip), without snapshots and with
    room for the keys; `local_first` sets `cluster.local_first`, `topology`
    `cluster.gossip_topology`."""
    d = work / name
    certs = d / "certs"
    certs.mkdir(parents=True)
    run([levee, "certs", "init", "--out", str(certs)], timeout=30, check=True)
    nodes = []
    for region in regions:
        for i in range(1, per_region + 1):
            nid = f"{region}-{i}"
            run([levee, "certs", "issue", "--ca", str(certs), "--node", nid, "--out",
                 str(certs)], timeout=30, check=True)
            nodes.append({"id": nid, "region": region, "http": free_port(),
                          "gossip": free_port(udp_too=True)})
    for n in nodes:
        text = f"""# Generated by bench/run.py (the layout of `levee cluster`).
[node]
id = "{n['id']}"
region = "{n['region']}"
http = "127.0.0.1:{n['http']}"
gossip = "127.0.0.1:{n['gossip']}"
max_keys = {max_keys}

[cluster]
mode = "strict"
{"local_first = true" if local_first else ""}
gossip_interval = "20ms"
suspect_after = "1s"
gossip_topology = "{topology}"
regions = {{ {", ".join(f"{r} = 1" for r in regions)} }}
tls = {{ ca = "{certs}/ca.pem", cert = "{certs}/{n['id']}.pem", key = "{certs}/{n['id']}.key" }}
"""
        for o in nodes:
            text += (f"\n[[cluster.node]]\nid = \"{o['id']}\"\nregion = \"{o['region']}\"\n"
                     f"addr = \"127.0.0.1:{o['gossip']}\"\nhttp = \"127.0.0.1:{o['http']}\"\n")
        text += LEVEE_RULES
        n["config"] = d / f"{n['id']}.toml"
        n["config"].write_text(text)
    return nodes


def start_cluster(levee: str, work: Path, name: str, max_keys: int,
                  regions: tuple[str, ...] = ("eu", "us", "ap"), per_region: int = 1,
                  env: dict | None = None, local_first: bool = False,
                  topology: str = "mesh") -> list[dict]:
    nodes = write_cluster(levee, work, name, max_keys, regions, per_region, local_first,
                          topology)
    for n in nodes:
        n["proc"] = start(n["id"], [levee, "serve", "--config", str(n["config"])],
                          work / name / f"{n['id']}.log",
                          env=dict(os.environ, LEVEE_LOG="warn", **(env or {})))
    for n in nodes:
        wait_http(n["http"], "/readyz", timeout=30)
    # Every node must see every other before anything is measured.
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        m = metrics(nodes[0]["http"])
        peers = {k for k in m if k.startswith("levee_transport_bytes_received_total{")}
        if len(peers) >= len(nodes) - 1:
            break
        time.sleep(0.2)
    return nodes


def stop_cluster(nodes: list[dict]) -> None:
    for n in nodes:
        stop(n["proc"])


def batch_body(keys: list[str]) -> bytes:
    return ('{"checks":[' + ",".join(f'{{"rule":"allow","key":"{k}"}}' for k in keys)
            + "]}").encode()


def post(conn: http.client.HTTPConnection, body: bytes) -> None:
    conn.request("POST", "/v1/check/batch", body, {"content-type": "application/json"})
    r = conn.getresponse()
    data = r.read()
    if r.status != 200:
        raise RuntimeError(f"/v1/check/batch: {r.status} {data[:200]!r}")


def fill(port: int, start_i: int, end_i: int, deadline: float, conns: int = 2) -> int:
    """Puts keys m<start_i> .. m<end_i - 1> in the node, 1,000 checks a request, until
    `deadline` (time.monotonic()); returns how many keys past start_i were sent."""
    chunks = list(range(end_i - 1000, start_i - 1, -1000))  # popped from the end: ascending
    lock = threading.Lock()
    errors: list[BaseException] = []
    sent = [0]

    def worker():
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        while time.monotonic() < deadline:
            with lock:
                if not chunks or errors:
                    break
                s = chunks.pop()
            try:
                post(c, batch_body([f"m{i}" for i in range(s, min(s + 1000, end_i))]))
                with lock:
                    sent[0] += min(1000, end_i - s)
            except BaseException as e:  # noqa: BLE001 - reported below
                with lock:
                    errors.append(e)
                break
        c.close()

    ts = [threading.Thread(target=worker) for _ in range(conns)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    if errors:
        raise errors[0]
    return sent[0]


# Seconds figure 9 warms a `local_first` cluster up at least (its rights follow its demand
# within a few seconds), whatever `--fig9-warm` asks below it.
LOCAL_FIRST_WARM = 12


def fig9(levee: str, work: Path) -> None:
    """CPU per decision summed over every process of a cluster, against the single node in the
    same run (issue #18): `levee bench --endpoint authz` at a fixed rate below saturation to
    the first node, keys drawn uniformly. Clusters with two nodes a region run twice: with
    every key (about half are forwarded to their owner) and with only the keys the node owns
    (`--owned-only`: a caller routing to owners, as levee-client does). The single node is
    measured first and last; the ratios are against the mean of the two."""
    ld = load1()
    rate, secs, runs = C.fig9_rate, (2 if C.quick else 4), (1 if C.quick else 2)
    env = {} if C.http_threads is None else {"LEVEE_WORKER_THREADS": str(C.http_threads)}
    args = ["--endpoint", "authz", "--rule", C.fig9_rule, "--key-header", "x-key",
            "--rate", str(rate), "--connections", "32"]
    log(f"fig 9: cluster CPU per decision at {rate:,} req/s; load {ld}")

    def measure(port: int, pids: list[int], extra: list[str], warm: int = 1) -> dict:
        # Warm-up: keys exist, rights settled.
        levee_bench(levee, port, args + extra, max(warm, C.fig9_warm))
        xs = [levee_bench(levee, port, args + extra, secs, pids) for _ in range(runs)]
        each = [median([x["cpu_us_each"][i] for x in xs]) for i in range(len(pids))]
        return {"cpu_us": median([x["cpu_us"] for x in xs]), "each": each,
                "p99_us": median([x["p99_us"] for x in xs]),
                "rps": median([x["rps"] for x in xs])}

    def single() -> dict:
        proc, port = start_levee_single(levee, work, f"levee-fig9-{len(singles)}",
                                        http_threads=C.http_threads)
        try:
            return measure(port, [proc.pid], [])
        finally:
            stop(proc)

    singles: list[dict] = []
    singles.append(single())
    layouts = [("1 region × 2 nodes", ("eu",), 2), ("2 regions × 1 node", ("eu", "us"), 1),
               ("3 regions × 2 nodes", ("eu", "us", "ap"), 2)]
    measured = []
    for label, regions, per in layouts:
        nodes = start_cluster(levee, work, f"fig9-{len(regions)}x{per}", 1_000_000,
                              regions, per, env, topology=C.fig9_topology)
        try:
            pids = [n["proc"].pid for n in nodes]
            port = nodes[0]["http"]
            measured.append((label, "any node", measure(port, pids, []), per > 1))
            if per > 1:
                measured.append((label, "owners", measure(port, pids, ["--owned-only"]), True))
        finally:
            stop_cluster(nodes)
        if per > 1:
            # `cluster.local_first`: the first node decides what it holds rights for and
            # forwards the rest. Its rights follow its demand within a few seconds (each key
            # is asked about once a second here): a longer warm-up.
            nodes = start_cluster(levee, work, f"fig9-{len(regions)}x{per}-lf", 1_000_000,
                                  regions, per, env, local_first=True,
                                  topology=C.fig9_topology)
            try:
                pids = [n["proc"].pid for n in nodes]
                measured.append((label, "any node, local_first",
                                 measure(nodes[0]["http"], pids, [], warm=LOCAL_FIRST_WARM),
                                 True))
            finally:
                stop_cluster(nodes)
    singles.append(single())
    base_cpu = sum(x["cpu_us"] for x in singles) / len(singles)
    base_p99 = sum(x["p99_us"] for x in singles) / len(singles)
    anchor = (f"single node {base_cpu:.1f} µs/decision, p99 {fmt_ms(base_p99)} ms (first "
              f"{singles[0]['cpu_us']:.1f}, last {singles[-1]['cpu_us']:.1f} µs)")
    for label, sent_to, m, targeted in measured:
        r = m["cpu_us"] / base_cpu if base_cpu else None
        limit = 1.1 if sent_to == "owners" else 1.3
        what = {"owners": "the caller sends each key to its owner (`--owned-only`)",
                "any node": "the caller sends every key to the first node",
                "any node, local_first": "the caller sends every key to the first node, "
                                         "`cluster.local_first = true` (after a "
                                         f"{max(LOCAL_FIRST_WARM, C.fig9_warm)} s warm-up)",
                }[sent_to]
        if C.fig9_topology != "mesh":
            label = f"{label}, `gossip_topology = \"{C.fig9_topology}\"`"
        if C.fig9_rule != "allow":
            label = f"{label}, rule `{C.fig9_rule}`"
        row("9", f"CPU per decision summed over every node's process, {label}; {what} "
                 f"(`levee bench --endpoint authz`, {rate:,} req/s, 32 connections, "
                 f"{C.keys:,} keys)",
            f"{m['cpu_us']:.1f} µs/decision (node by node, the one called first: "
            f"{' + '.join(f'{c:.1f}' for c in m['each'])}); p99 {fmt_ms(m['p99_us'])} ms "
            f"({fmt_int(m['rps'])} req/s achieved)", anchor, r,
            f"≤ {limit}" if targeted else "—",
            (r is not None and r <= limit) if targeted else None, ld)


def fig6(levee: str, work: Path) -> None:
    ld = load1()
    sizes = [100_000] if C.quick else [100_000, 1_000_000]
    budget = 60.0 if C.quick else 150.0
    settle = 5.0 if C.quick else 15.0
    log(f"fig 6: resident bytes per active key at {', '.join(f'{n:,}' for n in sizes)} keys, "
        f"3 regions × 1 node, filling for at most {budget:.0f}s; load {ld}")
    # Reference: the same fill on a fresh single node (no cluster): what the store itself
    # costs, before the CRDT entries of other nodes and replication.
    proc, port = start_levee_single(levee, work, "levee-mem")
    try:
        time.sleep(0.5)
        base, done, t, cells = rss_bytes(proc.pid), 0, time.monotonic(), []
        for target in sizes:
            done += fill(port, done, target, time.monotonic() + budget / 3)
            time.sleep(1.0)
            cells.append(f"{(rss_bytes(proc.pid) - base) / done:.0f} B/key at {done:,} keys")
        log(f"  single node (reference): {'; '.join(cells)} ({time.monotonic() - t:.1f}s)")
        row("6", "reference: the same fill on a single node, no cluster (not a target row)",
            "; ".join(cells), "—", None, "—", None, ld)
    finally:
        stop(proc)
    nodes = start_cluster(levee, work, "cluster-mem", max_keys=4_000_000)
    deadline = time.monotonic() + budget
    try:
        eu = nodes[0]
        time.sleep(1.0)
        base = rss_bytes(eu["proc"].pid)
        base_rx = [rss_bytes(n["proc"].pid) for n in nodes[1:]]
        log(f"  eu-1 RSS before: {base / 2**20:.1f} MiB")
        done = 0
        t = time.monotonic()
        prev = None  # (keys, RSS) at the previous size: the marginal cost excludes fixed costs
        for target in sizes:
            done += fill(eu["http"], done, target, deadline)
            fill_s = time.monotonic() - t
            # Let the gossip of the last keys go out: at least 3 s, at most `settle` s, until
            # the replicas hold every key.
            t_end = time.monotonic() + settle
            time.sleep(3.0)
            while time.monotonic() < t_end:
                if all(metric_sum(metrics(n["http"]), "levee_keys") >= done for n in nodes[1:]):
                    break
                time.sleep(1.0)
            rss = rss_bytes(eu["proc"].pid)
            m = metrics(eu["http"])
            held = metric_sum(m, "levee_keys")
            evicted = metric_sum(m, "levee_keys_evicted_total")
            per = (rss - base) / done
            rx = [(rss_bytes(n["proc"].pid) - b) for n, b in zip(nodes[1:], base_rx)]
            rx_keys = [metric_sum(metrics(n["http"]), "levee_keys") for n in nodes[1:]]
            rx_txt = ", ".join(f"{k:,.0f} keys (+{b / 2**20:.0f} MiB)" for k, b in zip(rx_keys, rx))
            log(f"  {done:,} keys (filled after {fill_s:.1f}s): eu-1 RSS {rss / 2**20:.1f} MiB, "
                f"{per:.0f} B/key; levee_keys {held:,.0f}, evicted {evicted:,.0f}; "
                f"replicas hold {rx_txt}")
            short = "" if done == target else f" (only {done:,} of {target:,} in {budget:.0f}s)"
            marginal = ""
            if prev is not None and done > prev[0]:
                marginal = (f"; {(rss - prev[1]) / (done - prev[0]):.0f} B/key from "
                            f"{prev[0]:,} to {done:,} keys")
                log(f"  marginal: {(rss - prev[1]) / (done - prev[0]):.0f} B/key from "
                    f"{prev[0]:,} to {done:,} keys (fixed costs excluded)")
            prev = (done, rss)
            row("6", f"resident bytes per active key at {target:,} keys{short}, 3 regions × 1 "
                     f"node, strict (the node that took the checks: (RSS after − before) / keys)",
                f"{per:.0f} B/key (RSS {base / 2**20:.0f} → {rss / 2**20:.0f} MiB, "
                f"levee_keys {held:,.0f}; the replicas then held {rx_txt}{marginal})",
                "—", None, "≤ 256", per <= 256, ld)
            if evicted:
                NOTES.append(f"Figure 6: {evicted:,.0f} keys were evicted at {done:,} keys.")
            if done < target:
                NOTES.append(f"Figure 6: the fill reached {done:,} of {target:,} keys within "
                             f"its {budget:.0f}s budget.")
                break
        if C.quick:
            NOTES.append("Figure 6: --quick measures 100,000 keys only.")
    finally:
        stop_cluster(nodes)


class Sweeper:
    """Checks a fixed set of K keys over and over, every key once per sweep, a sweep every
    `period` seconds (or as fast as answers come back), on one connection per 1,000 keys."""

    def __init__(self, port: int, keys: int, period: float):
        self.port, self.period = port, period
        names = [f"g{i}" for i in range(keys)]
        self.bodies = [batch_body(names[i:i + 1000]) for i in range(0, keys, 1000)]
        self.sweeps = [0] * len(self.bodies)
        self.stop_at = 0.0
        self.error: BaseException | None = None

    def _worker(self, j: int) -> None:
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        due = time.monotonic()
        try:
            while time.monotonic() < self.stop_at:
                post(c, self.bodies[j])
                self.sweeps[j] += 1
                due += self.period
                now = time.monotonic()
                if due > now:
                    time.sleep(due - now)
                else:
                    due = now
        except BaseException as e:  # noqa: BLE001 - reported by run()
            self.error = e
        c.close()

    def run(self, secs: float) -> tuple[int, int]:
        """Runs for `secs`; returns the sweeps completed by the slowest connection, and the
        checks sent."""
        self.sweeps = [0] * len(self.bodies)
        self.stop_at = time.monotonic() + secs
        ts = [threading.Thread(target=self._worker, args=(j,)) for j in range(len(self.bodies))]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        if self.error:
            raise self.error
        return min(self.sweeps), sum(self.sweeps) * 1000


def fig7(levee: str, work: Path, levee_port: int, levee_pid: int) -> None:
    ld = load1()
    interval = 0.020
    secs = 3.0 if C.quick else 5.0
    log(f"fig 7: replication bytes and CPU, 3 regions × 1 node, gossip every 20 ms; load {ld}")
    nodes = start_cluster(levee, work, "cluster-gossip", max_keys=1_000_000)
    try:
        eu, others = nodes[0], nodes[1:]
        # A sweep every 16 ms < the 20 ms interval: every key changes in every interval.
        period = interval * 0.8

        def measure(port: int, keys: int, pids: list[int]) -> dict:
            sw = Sweeper(port, keys, period)
            sw.run(0.5)  # warm-up: the keys exist, connections are open
            m0 = metrics(port) if port == eu["http"] else None
            c0 = [cpu_seconds(p) for p in pids]
            t = time.monotonic()
            sweeps, checks = sw.run(secs)
            el = time.monotonic() - t
            c1 = [cpu_seconds(p) for p in pids]
            out = {"el": el, "sweeps": sweeps, "cpu": [(b - a) / el for a, b in zip(c0, c1)],
                   "checks_s": checks / el,
                   "changed_s": keys * min(sweeps, el / interval) / el}
            if m0 is not None:
                m1 = metrics(port)
                out["bytes"] = (metric_sum(m1, "levee_transport_bytes_sent_total")
                                - metric_sum(m0, "levee_transport_bytes_sent_total"))
                out["frames"] = (metric_sum(m1, "levee_transport_frames_sent_total")
                                 - metric_sum(m0, "levee_transport_frames_sent_total"))
            return out

        pids = [n["proc"].pid for n in nodes]
        # Bytes: K = 1,000 keys changing in every interval.
        k = 1000
        res = []
        for _ in range(1 if C.quick else 2):
            r = measure(eu["http"], k, pids)
            intervals = r["el"] / interval
            changed = k * min(r["sweeps"], intervals)  # key-intervals with a change
            r["per"] = r["bytes"] / (changed * len(others))
            res.append(r)
            log(f"  K={k}: {r['bytes']:,.0f} bytes in {r['frames']:,.0f} frames over "
                f"{intervals:.0f} intervals, {r['sweeps']} sweeps: {r['per']:.1f} B per changed "
                f"key per destination per interval")
        per = median([x["per"] for x in res])
        row("7", f"replication bytes per changed key per destination region per gossip "
                 f"interval ({k:,} keys changing every 20 ms interval; Levee frame bytes, "
                 f"`levee_transport_bytes_sent_total`, QUIC/UDP headers not included)",
            f"{per:.1f} B", "—", None, "≤ 24", per <= 24, ld)

        # CPU at 100,000 changed keys per second: K = 2,000 keys × 50 intervals a second.
        # Alternate the cluster's first node with the single node (no cluster) under the
        # same checks: the difference, per check, is what replication costs the node taking
        # the checks; the receiving nodes do nothing but gossip. Scaled linearly to exactly
        # 100,000 changed keys/s when the driver fell short.
        k = 2000
        cl, single = [], []
        for _ in range(1 if C.quick else 2):
            cl.append(measure(eu["http"], k, pids))
            single.append(measure(levee_port, k, [levee_pid]))
            a, b = cl[-1], single[-1]
            log(f"  K={k}: cluster: {a['changed_s']:,.0f} changed keys/s ({a['checks_s']:,.0f} "
                f"checks/s), eu-1 {a['cpu'][0]:.2f} cores, us-1 {a['cpu'][1]:.2f}, ap-1 "
                f"{a['cpu'][2]:.2f}; single node: {b['checks_s']:,.0f} checks/s, "
                f"{b['cpu'][0]:.2f} cores")
        single_per_check = median([x["cpu"][0] / x["checks_s"] for x in single])
        changed_s = median([x["changed_s"] for x in cl])
        send = median([(x["cpu"][0] - single_per_check * x["checks_s"]) / x["changed_s"] * 1e5
                       for x in cl])
        recv = median([(x["cpu"][1] + x["cpu"][2]) / 2 / x["changed_s"] * 1e5 for x in cl])
        row("7", f"CPU spent on gossip per 100,000 changed keys/s ({k:,} keys changing every "
                 f"interval, measured at {changed_s:,.0f} changed keys/s and scaled; /proc "
                 f"utime+stime; cores = CPU-seconds per second)",
            f"sending node {send:+.2f} cores over a single node doing the same checks; each "
            f"receiving node {recv:.2f} cores",
            "—", None, "—", None, ld)
    finally:
        stop_cluster(nodes)


PROFILE_GROUPS = [
    ("kernel (syscalls, TCP, scheduler)", r"^\[k\]"),
    ("allocator (malloc/free)", r"malloc|free|_int_|realloc|consolidate|unlink_chunk|calloc|tcache|\b_?mi_"),
    ("memcpy/memcmp", r"mem(move|cpy|cmp|set|chr)"),
    ("clock reads", r"clock_gettime|vdso|Instant|SystemTime"),
    ("metrics", r"metrics|prometheus|quanta|histogram|Histogram"),
    ("JSON (serde_json)", r"serde_json|serde::|serde_core|itoa|ryu"),
    ("levee (decisions, store, HTTP handlers)", r"levee_"),
    ("dashmap/hashing", r"dashmap|hash|Hash|sip"),
    ("HTTP (hyper, http, httparse)", r"hyper|httparse|http::"),
    ("axum/tower routing", r"axum|tower|matchit"),
    ("tokio runtime", r"tokio|mio|parking_lot|crossbeam"),
]


def profile_summary(report: str) -> str:
    """Self time grouped into broad categories, then the top symbols."""
    groups: dict[str, float] = {}
    top: list[str] = []
    for line in report.splitlines():
        m = re.match(r"\s*([\d.]+)%\s+(\[[k.]\])\s+(.*?)\s*$", line)
        if not m:
            continue
        pct, kind, sym = float(m.group(1)), m.group(2), m.group(3).split("  ")[0]
        if len(top) < 25:
            top.append(f"{pct:6.2f}%  {kind} {sym[:110]}")
        text = f"{kind} {sym}"
        for name, rx in PROFILE_GROUPS:
            if re.search(rx, text):
                groups[name] = groups.get(name, 0.0) + pct
                break
        else:
            groups["other"] = groups.get("other", 0.0) + pct
    g = "\n".join(f"{v:6.1f}%  {k}" for k, v in sorted(groups.items(), key=lambda x: -x[1]))
    return g + "\n\ntop symbols (self):\n" + "\n".join(top)


def profile(levee: str, levee_port: int, levee_pid: int, work: Path) -> None:
    """perf record -e cpu-clock on the levee process under figure 1's and figure 3's loads."""
    perf = shutil.which("perf")
    if perf is None:
        NOTES.append("--profile: perf not found.")
        return
    secs = max(3, int(C.secs))
    loads = [
        ("`GET /v1/authz` under wrk (figure 1, mostly allowed)",
         lambda: wrk(f"http://127.0.0.1:{levee_port}/v1/authz/allow", secs)),
        ("`POST /v1/check/batch`, 100 checks a request (figure 3)",
         lambda: levee_bench(levee, levee_port, ["--endpoint", "batch", "--batch-size", "100",
                                                 "--rule", "allow", "--connections", "16",
                                                 "--rate", "6000"], secs)),
    ]
    for i, (what, drive) in enumerate(loads):
        data = work / f"perf{i}.data"
        log(f"profile: perf record -e cpu-clock -g -p {levee_pid}, {secs}s, {what}")
        p = start("perf", [perf, "record", "-e", "cpu-clock", "-g", "-p", str(levee_pid),
                           "-o", str(data), "--", "sleep", str(secs)], work / f"perf{i}.log")
        drive()
        p.wait(timeout=120)
        r = run([perf, "report", "-i", str(data), "--stdio", "--no-children", "--sort", "symbol",
                 "-g", "none", "--percent-limit", "0"], timeout=300)
        (work / f"perf{i}.txt").write_text(r.stdout)
        print(f"\n### perf, levee serve, {what}: cpu-clock self time\n\n```\n"
              + profile_summary(r.stdout) + "\n```\n")


# ---------------------------------------------------------------------------------------------


def main() -> int:
    global WORK, KEEP_WORK
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="a ~2-minute pass: fewer, shorter runs")
    ap.add_argument("--figures", default="1,2,3,4,5,6,7,9",
                    help="which figures to run, e.g. 1,2 (default: all)")
    ap.add_argument("--anchor-script", default=os.environ.get(
        "LEVEE_BENCH_ANCHOR_SCRIPT", "../shared/anchors/token_bucket.lua"),
        help="the seed's Redis token-bucket script (default: ../shared/anchors/token_bucket.lua "
             "or $LEVEE_BENCH_ANCHOR_SCRIPT)")
    ap.add_argument("--levee-bin", help="use this levee binary instead of building one")
    ap.add_argument("--skip-build", action="store_true",
                    help="do not run cargo build (use target/release/levee as it is)")
    ap.add_argument("--pairs", type=int, help="A/B pairs per comparison (default 4, quick 2)")
    ap.add_argument("--secs", type=float, help="seconds per short run (default 3, quick 2)")
    ap.add_argument("--threads", type=int, default=1, help="wrk threads (default 1)")
    ap.add_argument("--connections", type=int, default=64,
                    help="connections for wrk, redis-benchmark and levee bench (default 64)")
    ap.add_argument("--keys", type=int, default=10_000, help="distinct keys (default 10,000)")
    ap.add_argument("--fig9-rate", type=int, default=10_000,
                    help="figure 9's fixed request rate, below saturation (default 10,000/s)")
    ap.add_argument("--fig9-rule", choices=["allow", "tight"], default="allow",
                    help="figure 9's rule: `allow`, a bucket far above what a key sees (its "
                         "writes stay on the node, docs/replication.md), or `tight`, a bucket "
                         "of 2 a second that every decision takes far from full (every write "
                         "is sent)")
    ap.add_argument("--fig9-warm", type=int, default=1,
                    help="figure 9's warm-up before each layout's runs, seconds (default 1; "
                         "`local_first` layouts warm 12 s at least). Above 5 the runs see the "
                         "steady state of a bucket near full, whose key is listed only when "
                         "its forecast is due a sample (docs/replication.md)")
    ap.add_argument("--fig9-topology", choices=["mesh", "regions"], default="mesh",
                    help="figure 9's cluster.gossip_topology (default mesh, Levee's default)")
    ap.add_argument("--http-threads", type=int, default=1,
                    help="Levee's HTTP threads (LEVEE_WORKER_THREADS) for figures 1, 2, 5 and 7: "
                         "as many as nginx's workers and Redis's one thread (default 1; 0: "
                         "Levee's default, one per core). Figure 3 always uses the default")
    ap.add_argument("--profile", action="store_true",
                    help="also perf-record levee under figures 1 and 3's loads and print where it spends time")
    ap.add_argument("--pin", action="store_true",
                    help="pin every server (Levee, nginx, Redis) to core 0 and every load "
                         "generator to core 1 with taskset, so that a generator cannot take a "
                         "server's core (needs 2 cores)")
    ap.add_argument("--out", help="also write the table (markdown) to this file")
    ap.add_argument("--keep", action="store_true", help="keep the work directory (logs, configs)")
    a = ap.parse_args()

    C.quick = a.quick
    C.pairs = a.pairs or (2 if a.quick else 4)
    C.secs = a.secs or (2.0 if a.quick else 3.0)
    C.threads, C.conns, C.keys = a.threads, a.connections, a.keys
    C.fig9_rate, C.http_threads = a.fig9_rate, (a.http_threads or None)
    C.fig9_topology = a.fig9_topology
    C.fig9_rule = a.fig9_rule
    if a.fig9_warm < 1:
        ap.error("--fig9-warm: at least 1 second")
    C.fig9_warm = a.fig9_warm
    C.pin = a.pin
    if C.pin and (os.cpu_count() or 1) < 2:
        ap.error("--pin needs at least 2 cores")
    if C.pin and not shutil.which("taskset"):
        ap.error("--pin needs taskset (util-linux)")
    figs = {int(x) for x in a.figures.split(",") if x.strip()}
    KEEP_WORK = a.keep

    os.chdir(REPO)
    atexit.register(cleanup)
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGHUP, on_signal)

    started = dt.datetime.now(dt.timezone.utc)
    anchor = Path(a.anchor_script)
    if 2 in figs and not anchor.is_file():
        raise SystemExit(f"error: the anchor script {anchor} is missing (--anchor-script)")

    log(f"Levee benchmark suite ({'quick' if a.quick else 'full'}), figures "
        f"{','.join(map(str, sorted(figs)))}; load {load1()}")
    ensure_tools()
    if a.levee_bin:
        levee = str(Path(a.levee_bin).resolve())
    else:
        if not a.skip_build:
            log("cargo build --release -p levee")
            r = subprocess.run(["cargo", "build", "--release", "-p", "levee"], cwd=REPO,
                               timeout=1800)
            if r.returncode != 0:
                raise SystemExit("error: cargo build --release -p levee failed")
        levee = str(target_dir() / "release" / "levee")
    if not Path(levee).is_file():
        raise SystemExit(f"error: no levee binary at {levee}")

    WORK = Path(tempfile.mkdtemp(prefix="levee-bench-"))
    WORK.chmod(0o755)
    log(f"work directory {WORK}{' (kept)' if KEEP_WORK else ''}")
    # A private copy: others may rebuild target/release/levee while the suite runs, and every
    # figure must measure the same binary.
    shutil.copy2(levee, WORK / "levee")
    levee = str(WORK / "levee")

    threads = a.http_threads or None
    levee_proc, levee_port = start_levee_single(levee, WORK, http_threads=threads)
    log(f"levee serve on 127.0.0.1:{levee_port} (pid {levee_proc.pid}), "
        f"{threads or 'one per core'} HTTP thread(s)")
    if threads is not None and figs & {1, 2, 5, 7}:
        NOTES.append(f"Figures 1, 2, 5 and 7: Levee ran with `LEVEE_WORKER_THREADS={threads}` "
                     f"(`--http-threads`), as many HTTP threads as nginx has workers; figure 3 "
                     f"with its default, one per core.")
    if C.pin:
        NOTES.append("Pinned (`--pin`): every server (Levee, nginx, Redis, every node of a "
                     "cluster) on core 0, every load generator on core 1 (`taskset`).")
    nginx_port = redis_port = None
    if figs & {1, 5}:
        nginx_proc, nginx_port = start_nginx(WORK)
        log(f"nginx (one worker) on 127.0.0.1:{nginx_port}")
    if 2 in figs:
        redis_proc, redis_port, sha = start_redis(WORK, anchor)
        log(f"redis-server on 127.0.0.1:{redis_port}, script {sha[:12]}… from {anchor}")

    saturating = None
    if 1 in figs:
        saturating = fig1(levee_port, levee_proc.pid, nginx_port, nginx_proc.pid)
    if 2 in figs:
        fig2(levee_port, levee_proc.pid, redis_port, redis_proc.pid, sha)
    if 3 in figs:
        if threads is None:
            fig3(levee, levee_port, levee_proc.pid)
        else:
            # The batch figure is about the whole machine: Levee's default threads.
            bproc, bport = start_levee_single(levee, WORK, "levee-batch")
            log(f"fig 3: levee serve on 127.0.0.1:{bport} (pid {bproc.pid}), one HTTP thread "
                f"per core")
            try:
                fig3(levee, bport, bproc.pid)
            finally:
                stop(bproc)
    if 4 in figs:
        fig4()
    if 5 in figs:
        if saturating is None:
            log("fig 5: measuring the saturating rate (figure 1 was not run)")
            saturating = median([wrk(f"http://127.0.0.1:{levee_port}/v1/authz/allow")["rps"]
                                 for _ in range(2)])
        fig5(levee, levee_port, nginx_port, saturating)
    if 7 in figs:
        fig7(levee, WORK, levee_port, levee_proc.pid)
    if 6 in figs:
        fig6(levee, WORK)
    if 9 in figs:
        fig9(levee, WORK)
    if a.profile:
        profile(levee, levee_port, levee_proc.pid, WORK)

    took = time.monotonic() - T0
    cmd = "bench/run.sh " + " ".join(sys.argv[1:])
    cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text()
                .splitlines() if ln.startswith("model name")), "unknown")
    head = (f"Levee benchmarks, {started:%Y-%m-%d %H:%M} UTC, `{cmd.strip()}`, "
            f"{took / 60:.1f} min; machine: {os.cpu_count()} CPUs ({cpu}), Linux "
            f"{os.uname().release}; load (1 min) {load1()} at the end.")
    notes = "\n".join(f"* {n}" for n in NOTES)
    text = f"{head}\n\n{table()}\n" + (f"\n{notes}\n" if notes else "")
    print("\n" + text)
    if a.out:
        Path(a.out).write_text(text)
    log(f"done in {took / 60:.1f} min")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except subprocess.TimeoutExpired as e:
        log(f"error: timed out: {' '.join(map(str, e.cmd))}")
        sys.exit(1)
    except RuntimeError as e:
        log(f"error: {e}")
        sys.exit(1)
