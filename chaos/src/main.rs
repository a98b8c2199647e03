//! `levee-chaos`: runs chaos scenarios against a real multi-region Levee cluster and writes a
//! report per scenario.

// A command-line tool prints its progress and its summary.
#![allow(clippy::print_stdout)]

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use clap::Parser;
use levee_chaos::{Report, RunOptions, Scenario, run};

/// Chaos scenarios against a local three-region Levee cluster of real processes, with a UDP
/// fault proxy on every link. Writes `<scenario>.json` and `<scenario>.svg` per scenario.
#[derive(Parser)]
#[command(name = "levee-chaos", about)]
struct Cli {
    /// Run every scenario of the suite.
    #[arg(long)]
    all: bool,
    /// Run this scenario (repeatable); see --list.
    #[arg(long = "scenario", value_name = "NAME")]
    scenarios: Vec<String>,
    /// List the scenarios and exit.
    #[arg(long)]
    list: bool,
    /// Where the reports go.
    #[arg(long, default_value = "chaos/reports")]
    report_dir: PathBuf,
    /// The run's seed (each scenario's is derived from it and the scenario's name).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// The `levee` binary (default: beside this one, built if need be; or $LEVEE_BIN).
    #[arg(long)]
    levee: Option<PathBuf>,
    /// Also write every decision to `<scenario>.decisions.csv`.
    #[arg(long)]
    decisions: bool,
    /// Keep every cluster's directory (configurations, node logs, data), not only a failed
    /// one's.
    #[arg(long)]
    keep_files: bool,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let all = Scenario::all();
    if cli.list {
        for s in all.iter().chain([&Scenario::region_partition_short()]) {
            println!("{:<24} {}", s.name, s.summary);
        }
        return ExitCode::SUCCESS;
    }
    let chosen: Vec<Scenario> = if cli.all {
        all
    } else {
        let mut out = Vec::new();
        for name in &cli.scenarios {
            match Scenario::by_name(name) {
                Some(s) => out.push(s),
                None => {
                    eprintln!("no scenario {name:?}; --list shows them");
                    return ExitCode::from(2);
                }
            }
        }
        out
    };
    if chosen.is_empty() {
        eprintln!("nothing to run: give --all or --scenario NAME (--list shows them)");
        return ExitCode::from(2);
    }
    let binary = match cli
        .levee
        .map(Ok)
        .unwrap_or_else(levee_blackbox::find_levee_binary)
    {
        Ok(b) => b,
        Err(e) => {
            eprintln!("the levee binary: {e}");
            return ExitCode::FAILURE;
        }
    };
    let opts = RunOptions {
        binary,
        report_dir: cli.report_dir,
        seed: cli.seed,
        keep_decisions: cli.decisions,
        keep_files: cli.keep_files,
    };
    println!(
        "levee-chaos: {} scenario(s), seed {}, levee {}, reports in {}",
        chosen.len(),
        opts.seed,
        opts.binary.display(),
        opts.report_dir.display()
    );
    let started = Instant::now();
    let mut reports = Vec::new();
    for (k, s) in chosen.iter().enumerate() {
        println!("[{}/{}] {} — {} …", k + 1, chosen.len(), s.name, s.summary);
        let r = run(s, &opts);
        println!("[{}/{}] {}", k + 1, chosen.len(), progress_line(&r));
        if let Some(e) = &r.write_error {
            println!("    could not write the report: {e}");
        }
        if !r.passed {
            for c in r.checks.iter().filter(|c| !c.passed) {
                println!("    {} failed: {}", c.name, c.detail);
            }
            if let Some(e) = &r.error {
                println!("    error: {e}");
            }
        }
        if let Some(dir) = &r.kept_files {
            println!("    cluster files kept in {dir}");
        }
        reports.push(r);
    }
    println!("\n{}", summary_table(&reports));
    println!("total {:.0} s", started.elapsed().as_secs_f64());
    if reports.iter().all(|r| r.passed) {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn progress_line(r: &Report) -> String {
    let verdict = if r.passed {
        "passed".to_owned()
    } else {
        format!("FAILED ({})", r.failed_checks().join(", "))
    };
    format!(
        "{} {verdict} in {:.1} s; {}",
        r.scenario,
        r.wall_s,
        headline(r)
    )
}

/// The figures a reader looks at first.
fn headline(r: &Report) -> String {
    let Some(f) = &r.figures else {
        return r.error.clone().unwrap_or_default();
    };
    let heal = f
        .agreements
        .iter()
        .filter(|a| a.label != "final")
        .map(|a| match a.agreed_ms {
            Some(ms) => format!("{} {ms} ms", a.label),
            None => format!("{} never", a.label),
        })
        .collect::<Vec<_>>();
    format!(
        "max {}/{} per window, utilisation {:.1} %, {} degraded{}",
        f.max_admitted_per_window,
        r.setup.limit,
        100.0 * f.utilisation_mean,
        f.main_degraded,
        if heal.is_empty() {
            String::new()
        } else {
            format!(", agreement {}", heal.join(", "))
        }
    )
}

fn summary_table(reports: &[Report]) -> String {
    let mut out = format!(
        "{:<18} {:<7} {:>10} {:>8} {:>9} {:>10} {:>10}  {}\n",
        "scenario",
        "result",
        "max/limit",
        "util %",
        "degraded",
        "heal ms",
        "final ms",
        "failed checks"
    );
    for r in reports {
        let (max, util, degraded, heal, fin) = match &r.figures {
            Some(f) => {
                let ms = |label: &str| {
                    f.agreements
                        .iter()
                        .filter(|a| a.label == label || (label == "heal" && a.label == "settle"))
                        .map(|a| a.agreed_ms.map_or("never".to_owned(), |m| m.to_string()))
                        .collect::<Vec<_>>()
                        .join("/")
                };
                (
                    format!("{}/{}", f.max_admitted_per_window, r.setup.limit),
                    format!("{:.1}", 100.0 * f.utilisation_mean),
                    f.main_degraded.to_string(),
                    ms("heal"),
                    ms("final"),
                )
            }
            None => Default::default(),
        };
        out.push_str(&format!(
            "{:<18} {:<7} {:>10} {:>8} {:>9} {:>10} {:>10}  {}\n",
            r.scenario,
            if r.passed { "pass" } else { "FAIL" },
            max,
            util,
            degraded,
            if heal.is_empty() { "-".into() } else { heal },
            fin,
            r.failed_checks().join(", ")
        ));
    }
    out
}
