//! `levee-sim`: runs seeded simulations of a Levee cluster and checks its properties.
//!
//! ```text
//! cargo run --release -p levee-sim -- --seeds 10000          # a summary over 10,000 seeds
//! cargo run --release -p levee-sim -- --seed 42 --scenario flapping   # replay one run
//! cargo run --release -p levee-sim -- --table                # the accuracy table (markdown)
//! ```

// The binary's output is its report.
#![allow(clippy::print_stdout)]

use std::process::ExitCode;
use std::time::Instant;

use clap::Parser;
use levee_sim::{Batch, Policy, Scenario, quiet_panics, run_batch, run_plan, table};

/// Deterministic simulation of a Levee cluster: faults, clock skew, crashes; checks the
/// global-limit properties on every run and compares Levee with three baseline policies.
#[derive(Debug, Parser)]
#[command(name = "levee-sim")]
struct Cli {
    /// Run this many seeds (from --first-seed), cycling through every scenario unless
    /// --scenario is given, and print a summary.
    #[arg(long)]
    seeds: Option<u64>,
    /// The first seed of --seeds.
    #[arg(long, default_value_t = 0)]
    first_seed: u64,
    /// Replay one seed and print its run in detail.
    #[arg(long)]
    seed: Option<u64>,
    /// The scenario: steady, skewed, hot-region, bursts, many-keys, region-isolated,
    /// full-split, one-way, flapping, crashes (the classic set); sporadic, follow-the-sun,
    /// back-to-back, light-keys (the demand set); grow, remove-dead, remove-dead-day,
    /// reweight, frozen-removed, churn, removed-alive, grow-reordered, leave (the membership
    /// set); bursts-wait (the
    /// waiting set); fixed-window, token-bucket, leaky-bucket, sliding-window, sliding-log,
    /// quota-day (the algorithms set).
    #[arg(long)]
    scenario: Option<String>,
    /// The set of scenarios seeds cycle through: classic (high-rate, 1 s windows, faults),
    /// demand (long windows, low rates, moving demand), membership (nodes added, removed,
    /// re-weighted while partitions and crashes happen), waiting (the bursts scenario with
    /// callers that wait for rights, `max_wait_ms`) or algorithms (every algorithm, with
    /// costs from 1–10 and refunds, over the classic worlds).
    #[arg(long, default_value = "classic")]
    set: String,
    /// Print the accuracy table (markdown) of figure 8.
    #[arg(long)]
    table: bool,
    /// Replay one plan of the accuracy table (overload, skewed, partition) with --seed and
    /// --rtt.
    #[arg(long)]
    table_plan: Option<String>,
    /// The round trip between regions of --table-plan, ms.
    #[arg(long, default_value_t = 100)]
    rtt: u64,
    /// Seeds per cell of the accuracy table.
    #[arg(long, default_value_t = 50)]
    table_seeds: u64,
    /// Worker threads (default: available cores).
    #[arg(long)]
    threads: Option<usize>,
    /// Failures listed in the summary.
    #[arg(long, default_value_t = 20)]
    show_failures: usize,
    /// Who a node gossips with: mesh (every node, every interval) or regions (region-mates
    /// and one node per other region, which relays).
    #[arg(long, default_value = "mesh", value_parser = parse_gossip)]
    gossip: levee_cluster::Topology,
    /// Run every node with `cluster.local_first`: a node that is not a key's owner decides
    /// the checks it holds rights for and forwards only the rest.
    #[arg(long)]
    local_first: bool,
    /// Measure the gossip protocol's cost per node as the cluster grows (regions × nodes,
    /// e.g. 2x2,5x5,10x10,10x20), under both topologies, with --scale-keys decisions a second.
    #[arg(long, value_delimiter = ',')]
    gossip_scale: Vec<String>,
    /// Keys of --gossip-scale, each decided once a second (decisions a second, cluster-wide).
    #[arg(long, default_value_t = 100_000)]
    scale_keys: usize,
}

fn parse_gossip(s: &str) -> Result<levee_cluster::Topology, String> {
    match s {
        "mesh" => Ok(levee_cluster::Topology::Mesh),
        "regions" => Ok(levee_cluster::Topology::Regions),
        other => Err(format!("{other:?}: one of mesh, regions")),
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let scenario = match cli.scenario.as_deref().map(Scenario::from_name) {
        Some(None) => {
            eprintln!(
                "unknown scenario {:?}; one of: {}",
                cli.scenario.unwrap_or_default(),
                Scenario::every()
                    .map(Scenario::name)
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            return ExitCode::from(2);
        }
        Some(Some(s)) => Some(s),
        None => None,
    };
    let set: &'static [Scenario] = match cli.set.as_str() {
        "classic" => &Scenario::ALL,
        "demand" => &Scenario::DEMAND,
        "membership" => &Scenario::MEMBERSHIP,
        "waiting" => &Scenario::WAITING,
        "algorithms" => &Scenario::ALGORITHMS,
        other => {
            eprintln!(
                "unknown --set {other:?}; one of: classic, demand, membership, waiting, algorithms"
            );
            return ExitCode::from(2);
        }
    };
    let threads = cli.threads.unwrap_or_else(|| {
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
    });
    if !cli.gossip_scale.is_empty() {
        return gossip_scale(&cli.gossip_scale, cli.scale_keys, threads);
    }
    if cli.table {
        let started = Instant::now();
        quiet_panics();
        let t = table::run_table(cli.table_seeds, threads);
        println!("{}", t.render());
        let rows = table::run_algorithm_rows(cli.table_seeds, threads);
        println!("{}", rows.render());
        eprintln!("table: {:.1} s", started.elapsed().as_secs_f64());
        return ExitCode::SUCCESS;
    }
    if let Some(case) = cli.table_plan.as_deref() {
        let case = match case {
            "overload" => table::Case::Overload,
            "skewed" => table::Case::Skewed,
            "partition" => table::Case::Partition,
            other => {
                eprintln!("unknown table plan {other:?}; one of: overload, skewed, partition");
                return ExitCode::from(2);
            }
        };
        return replay(&table::table_plan(case, cli.rtt, cli.seed.unwrap_or(0)));
    }
    if let Some(seed) = cli.seed {
        let scenario = scenario.unwrap_or(Scenario::for_seed_in(set, seed));
        let mut plan = scenario.plan(seed);
        plan.protocol.gossip = cli.gossip;
        plan.protocol.local_first = cli.local_first;
        return replay(&plan);
    }
    let seeds = cli.seeds.unwrap_or(100);
    let batch = Batch {
        first_seed: cli.first_seed,
        seeds,
        scenario,
        set,
        threads,
        progress: true,
        gossip: cli.gossip,
        local_first: cli.local_first,
    };
    quiet_panics();
    let started = Instant::now();
    let summary = run_batch(&batch);
    println!(
        "levee-sim: seeds {}..{} ({}), {} threads, {:.1} s",
        batch.first_seed,
        batch.first_seed + seeds,
        scenario.map_or(
            match cli.set.as_str() {
                "demand" => "every demand scenario",
                "membership" => "every membership scenario",
                "algorithms" => "every algorithm",
                _ => "every scenario",
            },
            Scenario::name
        ),
        threads,
        started.elapsed().as_secs_f64()
    );
    println!("{}", summary.render(cli.show_failures));
    if summary.violation_count() == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// `--gossip-scale`: every layout under both topologies, on `threads` threads.
fn gossip_scale(layouts: &[String], keys: usize, threads: usize) -> ExitCode {
    use levee_cluster::Topology;
    use levee_sim::scale::{Layout, measure, render};
    let mut parsed = Vec::new();
    for l in layouts {
        match Layout::parse(l) {
            Some(x) => parsed.push(x),
            None => {
                eprintln!(
                    "--gossip-scale {l:?}: expected REGIONSxNODES (e.g. 10x20), at most {} nodes",
                    levee_core::MAX_NODES
                );
                return ExitCode::from(2);
            }
        }
    }
    let jobs: Vec<(Layout, Topology)> = parsed
        .iter()
        .flat_map(|&l| [(l, Topology::Mesh), (l, Topology::Regions)])
        .collect();
    let next = std::sync::atomic::AtomicUsize::new(0);
    let results = std::sync::Mutex::new(vec![None; jobs.len()]);
    let started = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..threads.max(1) {
            s.spawn(|| {
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some(&(layout, topology)) = jobs.get(i) else {
                        break;
                    };
                    let t = Instant::now();
                    let f = measure(layout, topology, keys, 2);
                    eprintln!(
                        "{}x{} {:?}: {:.1} s",
                        layout.regions,
                        layout.nodes,
                        topology,
                        t.elapsed().as_secs_f64()
                    );
                    results.lock().expect("no worker panics")[i] = Some(f);
                }
            });
        }
    });
    let figures: Vec<_> = results
        .into_inner()
        .expect("no worker panics")
        .into_iter()
        .flatten()
        .collect();
    println!(
        "levee-sim --gossip-scale: {keys} keys, 2 s of load, {:.1} s",
        started.elapsed().as_secs_f64()
    );
    println!("{}", render(&figures));
    ExitCode::SUCCESS
}

/// Runs one plan under every policy, prints it in detail, and fails if Levee broke a property.
fn replay(plan: &levee_sim::RunPlan) -> ExitCode {
    let outcome = run_plan(plan, &Policy::ALL);
    println!("{}", levee_sim::report::describe(plan, &outcome));
    if outcome.violations.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
