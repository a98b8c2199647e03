//! The coverage-guided fuzz targets (`fuzz/`: the wire frame decoder, a peer's messages fed to
//! the state machine, the HTTP body decoders) run for a bounded time each, so that a crash
//! they can find fails the suite. They need the nightly toolchain and `cargo-fuzz`; without
//! them the test says it was skipped (`SKIPPED: …`), unless `LEVEE_REQUIRE_FUZZ=1` (set by
//! `.ci/run`, which installs cargo-fuzz) makes that a failure.

use std::io::Write;
use std::path::PathBuf;
use std::process::Command;

/// Seconds each target runs: enough to replay the corpus and explore a little, within the
/// suite's time budget (three targets).
const SECONDS_PER_TARGET: &str = "10";

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the repository")
        .to_owned()
}

/// Why fuzzing cannot run here, if it cannot.
fn missing_tools() -> Option<String> {
    let fuzz = Command::new("cargo")
        .args(["+nightly", "fuzz", "--version"])
        .output();
    match fuzz {
        Ok(out) if out.status.success() => None,
        Ok(out) => Some(format!(
            "`cargo +nightly fuzz` is not available ({}); install the nightly toolchain and \
             `cargo install cargo-fuzz` (.ci/run does)",
            String::from_utf8_lossy(&out.stderr).trim()
        )),
        Err(e) => Some(format!("cannot run cargo: {e}")),
    }
}

#[test]
fn every_fuzz_target_runs_its_bounded_time_without_a_crash() {
    if let Some(why) = missing_tools() {
        if std::env::var_os("LEVEE_REQUIRE_FUZZ").is_some_and(|v| v == "1") {
            panic!("{why}; LEVEE_REQUIRE_FUZZ=1 requires it");
        }
        // Past the harness's capture: a skip must be seen.
        let _ = writeln!(
            std::io::stderr(),
            "SKIPPED: {why}; set LEVEE_REQUIRE_FUZZ=1 to make this a failure"
        );
        return;
    }
    let out = Command::new("bash")
        .arg(repo().join("fuzz/run.sh"))
        .arg(SECONDS_PER_TARGET)
        // The outer `cargo test` sets variables meant for its own build.
        .env_remove("CARGO_TARGET_DIR")
        .env_remove("RUSTFLAGS")
        .output()
        .expect("run fuzz/run.sh");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let tail: String = stderr
        .lines()
        .rev()
        .take(40)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect::<Vec<_>>()
        .join("\n");
    assert!(
        out.status.success(),
        "a fuzz target failed (its input is in fuzz/artifacts/): {}\n{tail}",
        out.status
    );
    for target in ["wire_frame", "peer_message", "http_bodies"] {
        assert!(
            String::from_utf8_lossy(&out.stdout).contains(&format!("== {target}")),
            "{target} did not run"
        );
    }
}
