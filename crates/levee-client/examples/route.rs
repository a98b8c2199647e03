//! Checks a few keys through owner routing and prints where each went:
//! `cargo run -p levee-client --example route -- http://127.0.0.1:8750 api-per-tenant 10`
//! (against `levee cluster`, every node's `levee_forwarded_checks_total` stays 0).

use levee_client::{Check, Client};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let node = args
        .next()
        .unwrap_or_else(|| "http://127.0.0.1:8750".into());
    let rule = args.next().unwrap_or_else(|| "api-per-tenant".into());
    let n: usize = args.next().map(|s| s.parse()).transpose()?.unwrap_or(10);
    let levee = Client::builder().node(node).build()?;
    let mut out = std::io::stdout().lock();
    for i in 0..n {
        let key = format!("tenant-{i}");
        let to = levee.node_for(&key).await;
        let d = levee.check(&Check::new(&rule, &key)).await?;
        use std::io::Write as _;
        writeln!(
            out,
            "{key:<12} -> {to:<24} allowed={} remaining={}",
            d.allowed, d.remaining
        )?;
    }
    Ok(())
}
