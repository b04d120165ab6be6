//! Runs the Python end-to-end suite (`tests/e2e`, pytest + the official `openai` client) against
//! the real `ferrite` binary that cargo built for this test. The suite starts `ferrite serve`
//! on loopback ports with the tiny Llama fixture and covers every endpoint, the error cases,
//! disconnects, 64 concurrent streams and shutdown.
//!
//! Python comes from `FERRITE_E2E_PYTHON`, else `.venv-ci/bin/python`
//! (`python3 -m venv .venv-ci && .venv-ci/bin/pip install -r tests/e2e/requirements.txt`).

use std::io::Write;
use std::path::PathBuf;
use std::process::Command;

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Written past libtest's capture, so a skip shows in a passing run.
fn say(message: &str) {
    let _ = writeln!(std::io::stderr(), "{message}");
}

#[test]
fn openai_server_end_to_end() {
    let root = repo_root();
    let explicit = std::env::var_os("FERRITE_E2E_PYTHON").map(PathBuf::from);
    let python = match explicit.clone().or_else(|| Some(root.join(".venv-ci/bin/python")).filter(|p| p.exists())) {
        Some(p) => p,
        None => {
            say("SKIP: server e2e: set FERRITE_E2E_PYTHON or create .venv-ci (pip install -r tests/e2e/requirements.txt)");
            return;
        }
    };
    let deps = Command::new(&python).args(["-c", "import openai, pytest"]).output();
    if !deps.as_ref().is_ok_and(|o| o.status.success()) {
        let why = match &deps {
            Ok(o) => String::from_utf8_lossy(&o.stderr).into_owned(),
            Err(e) => e.to_string(),
        };
        // An interpreter named explicitly (as CI does) must have the suite's packages.
        assert!(explicit.is_none(), "FERRITE_E2E_PYTHON={} cannot import openai/pytest: {why}", python.display());
        say(&format!(
            "SKIP: server e2e: {} lacks openai/pytest (pip install -r tests/e2e/requirements.txt): {why}",
            python.display()
        ));
        return;
    }
    let output = Command::new(&python)
        .args(["-m", "pytest", "tests/e2e", "-q", "-rfE", "-p", "no:cacheprovider"])
        .current_dir(&root)
        .env("FERRITE_BIN", env!("CARGO_BIN_EXE_ferrite"))
        .output()
        .expect("running pytest");
    let report = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    // pytest's closing line ("N passed in Xs"), visible even when the test passes.
    if let Some(summary) = report.lines().rev().find(|l| !l.trim().is_empty()) {
        say(&format!("server e2e (pytest): {}", summary.trim_matches('=').trim()));
    }
    assert!(output.status.success(), "the Python e2e suite failed:\n{report}");
}
