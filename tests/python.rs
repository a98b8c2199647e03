//! The Python client (`clients/python`) against a real `levee serve`: a venv under
//! `target/python-venv` gets the pinned test requirements (`clients/python/requirements-test.txt`)
//! and the package itself (`pip install ./clients/python`); `mypy --strict` checks its types,
//! then its pytest suite runs with the node's URL in `LEVEE_URL`.
//!
//! Where `python3 -m venv` is not available the test is skipped, and says so on stderr
//! (`SKIPPED: …`, past the harness's capture); with `LEVEE_REQUIRE_PYTHON=1` (as `.ci/run`
//! sets it) that is a failure instead. A failing `pip install` is always a failure.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use levee_blackbox::Node;

const CONFIG: &str = r#"
[node]
id = "n1"
region = "local"

[[rule]]
name = "search-per-tenant"
algorithm = "fixed_window"
limit = 1000
window = "1m"

[[rule]]
name = "tiny"
algorithm = "fixed_window"
limit = 2
window = "1m"
"#;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace")
        .to_owned()
}

fn run(cmd: &mut Command) -> Result<Output, String> {
    let out = cmd.output().map_err(|e| format!("{cmd:?}: {e}"))?;
    if out.status.success() {
        Ok(out)
    } else {
        Err(format!(
            "{cmd:?}: {}\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// The venv's python, made if need be; `None` (said on stderr) when there is no venv to make
/// and it is not required.
fn venv() -> Option<PathBuf> {
    let dir = repo().join("target").join("python-venv");
    let python = dir.join("bin").join("python");
    let has_pip = || run(Command::new(&python).args(["-m", "pip", "--version"])).is_ok();
    if has_pip() {
        return Some(python);
    }
    // Absent, or left without pip by a `python3 -m venv` that failed half way (Debian's
    // python3 without python3-venv makes the directory, then fails on ensurepip).
    let _ = std::fs::remove_dir_all(&dir);
    let made = run(Command::new("python3").args(["-m", "venv"]).arg(&dir)).and_then(|_| {
        has_pip()
            .then_some(())
            .ok_or_else(|| "no pip in the venv".to_owned())
    });
    if let Err(e) = made {
        let _ = std::fs::remove_dir_all(&dir);
        let why = format!("python3 -m venv is not available ({e})");
        if std::env::var_os("LEVEE_REQUIRE_PYTHON").is_some_and(|v| v == "1") {
            panic!("{why}, and LEVEE_REQUIRE_PYTHON=1");
        }
        let _ = writeln!(
            std::io::stderr(),
            "SKIPPED: {why}; set LEVEE_REQUIRE_PYTHON=1 to make this a failure"
        );
        return None;
    }
    Some(python)
}

#[test]
fn the_python_client_passes_its_tests_against_a_real_node() {
    let Some(python) = venv() else { return };
    let pkg = repo().join("clients").join("python");
    let pip = |args: &[&str]| {
        run(Command::new(&python)
            .args(["-m", "pip", "install", "-q", "--disable-pip-version-check"])
            .args(args))
        .unwrap_or_else(|e| panic!("{e}"))
    };
    pip(&[
        "-r",
        pkg.join("requirements-test.txt").to_str().expect("utf-8"),
    ]);
    // The package as a user installs it; no build isolation, so setuptools comes pinned from
    // the requirements instead of the index.
    pip(&[
        "--no-build-isolation",
        "--force-reinstall",
        "--no-deps",
        pkg.to_str().expect("utf-8"),
    ]);
    // The package is typed (`py.typed`): mypy --strict finds nothing in it.
    let typed = run(Command::new(&python)
        .args([
            "-m",
            "mypy",
            "--strict",
            "--no-incremental",
            "src/levee_client",
        ])
        .current_dir(&pkg));
    if let Err(e) = typed {
        panic!("mypy --strict:\n{e}");
    }
    let node = Node::start(CONFIG);
    let out = Command::new(&python)
        .args(["-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"])
        .current_dir(&pkg)
        .env("LEVEE_URL", node.url())
        .output()
        .expect("pytest runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "pytest failed:\n{text}");
    assert!(text.contains(" passed"), "pytest ran nothing:\n{text}");
    assert!(!text.contains("skipped"), "pytest skipped tests:\n{text}");
}
