//! Where the `levee` binary is, built if need be, the way `tests/src/lib.rs` finds it.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The `levee` binary beside the running executable: `target/<profile>/levee` (a test
/// executable lives in `target/<profile>/deps/`). `LEVEE_BIN` overrides the path.
///
/// When run by cargo (`cargo run`, `cargo test`: `CARGO` is set), or when the binary is
/// missing, it first runs `cargo build -p levee --bin levee` for the same profile (`--release`
/// for a release runner) into the same target directory, so a run never uses a stale binary;
/// that is a no-op when it is up to date.
pub fn levee_binary() -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os("LEVEE_BIN") {
        return Ok(PathBuf::from(p));
    }
    let exe = std::env::current_exe().map_err(|e| format!("the executable's path: {e}"))?;
    let mut profile_dir = exe
        .parent()
        .ok_or("the executable has no directory")?
        .to_owned();
    if profile_dir.file_name().is_some_and(|n| n == "deps") {
        profile_dir = profile_dir
            .parent()
            .ok_or("deps/ has no parent")?
            .to_owned();
    }
    let bin = profile_dir.join(format!("levee{}", std::env::consts::EXE_SUFFIX));
    let cargo = std::env::var_os("CARGO");
    if cargo.is_some() || !bin.exists() {
        build(&profile_dir, cargo.unwrap_or_else(|| "cargo".into()))?;
        if !bin.exists() {
            return Err(format!(
                "cargo built levee but {} does not exist",
                bin.display()
            ));
        }
    }
    Ok(bin)
}

fn build(profile_dir: &Path, cargo: std::ffi::OsString) -> Result<(), String> {
    let mut cmd = Command::new(cargo);
    cmd.args(["build", "--quiet", "-p", "levee", "--bin", "levee"]);
    match profile_dir.file_name().and_then(|n| n.to_str()) {
        Some("debug") | None => {}
        Some("release") => {
            cmd.arg("--release");
        }
        Some(other) => {
            cmd.args(["--profile", other]);
        }
    }
    if let Some(target_dir) = profile_dir.parent() {
        cmd.arg("--target-dir").arg(target_dir);
    }
    // Under `cargo test` this process carries the variables cargo sets for *this* package
    // (`CARGO_MANIFEST_DIR` …). Build scripts that track them (ring's does) would see them
    // change between this build and a plain `cargo build`, and rebuild half the tree every
    // time; the nested build gets the environment a shell would give it.
    for (name, _) in std::env::vars_os() {
        let Some(name) = name.to_str() else { continue };
        if matches!(
            name,
            "CARGO_MANIFEST_DIR"
                | "CARGO_MANIFEST_PATH"
                | "CARGO_CRATE_NAME"
                | "CARGO_PRIMARY_PACKAGE"
                | "CARGO_TARGET_TMPDIR"
                | "CARGO_BIN_NAME"
                | "OUT_DIR"
        ) || name.starts_with("CARGO_PKG_")
            || name.starts_with("CARGO_BIN_EXE_")
        {
            cmd.env_remove(name);
        }
    }
    let status = cmd
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .status()
        .map_err(|e| format!("cannot run cargo to build levee: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!(
            "`cargo build -p levee --bin levee` failed: {status}"
        ))
    }
}
