//! `levee check`: one decision from the command line.

use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use serde::Deserialize;

/// Arguments of `levee check`.
#[derive(Args)]
pub(crate) struct CheckArgs {
    /// The node's base URL, e.g. http://127.0.0.1:8750
    #[arg(long, default_value = "http://127.0.0.1:8750")]
    url: String,
    /// The rule's name.
    #[arg(long)]
    rule: String,
    /// The key (tenant, API key, IP …).
    #[arg(long)]
    key: String,
    /// Tokens the request takes.
    #[arg(long, default_value_t = 1)]
    cost: u64,
    /// Consumer class, for rules that define classes.
    #[arg(long)]
    class: Option<String>,
    /// Decide without consuming.
    #[arg(long)]
    dry_run: bool,
    /// Print the node's JSON answer instead of a summary.
    #[arg(long)]
    json: bool,
}

#[derive(Deserialize)]
struct Answer {
    allowed: bool,
    limit: u64,
    remaining: u64,
    reset_after_ms: u64,
    retry_after_ms: u64,
    mode: String,
    degraded: bool,
    would_allow: Option<bool>,
}

/// Exit 0 when allowed, 1 when denied, 2 on any error.
pub(crate) fn run(args: &CheckArgs) -> ExitCode {
    let url = format!("{}/v1/check", args.url.trim_end_matches('/'));
    let mut body = serde_json::json!({ "rule": args.rule, "key": args.key, "cost": args.cost, "dry_run": args.dry_run });
    if let Some(c) = &args.class {
        body["class"] = serde_json::Value::from(c.as_str());
    }
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs(10)))
        .http_status_as_error(false)
        .build()
        .into();
    let resp = match agent
        .post(&url)
        .header("content-type", "application/json")
        .send(body.to_string())
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot reach {url}: {e}");
            return ExitCode::from(2);
        }
    };
    let status = resp.status().as_u16();
    let text = match resp.into_body().read_to_string() {
        Ok(t) => t,
        Err(e) => {
            eprintln!("error: cannot read the answer of {url}: {e}");
            return ExitCode::from(2);
        }
    };
    if status != 200 {
        let msg = serde_json::from_str::<serde_json::Value>(&text)
            .ok()
            .and_then(|v| {
                Some(format!(
                    "{}: {}",
                    v.get("error")?.as_str()?,
                    v.get("message")?.as_str()?
                ))
            })
            .unwrap_or(text);
        eprintln!("error: {status} {msg}");
        return ExitCode::from(2);
    }
    if args.json {
        println!("{text}");
    }
    let a: Answer = match serde_json::from_str(&text) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("error: unexpected answer from {url}: {e}");
            return ExitCode::from(2);
        }
    };
    if !args.json {
        let verdict = if a.allowed { "ALLOWED" } else { "DENIED " };
        let mut line = format!(
            "{verdict} {}/{}  cost {}  remaining {}/{}  resets in {:.1}s",
            args.rule,
            args.key,
            args.cost,
            a.remaining,
            a.limit,
            a.reset_after_ms as f64 / 1000.0
        );
        if !a.allowed {
            line.push_str(&format!(
                "  retry in {:.1}s",
                a.retry_after_ms as f64 / 1000.0
            ));
        }
        if a.mode == "shadow" {
            line.push_str(&format!(
                "  (shadow: would {})",
                if a.would_allow == Some(true) {
                    "allow"
                } else {
                    "deny"
                }
            ));
        }
        if a.degraded {
            line.push_str("  (degraded)");
        }
        println!("{line}");
    }
    if a.allowed {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}
