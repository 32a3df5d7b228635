//! Runs tests/python/check_schema.py so `cargo test -p vitals-proto` fails if
//! a field in protos/ drifts from the official Perfetto schema. Needs the
//! workspace venv (or VITALS_PYTHON) with the PyPI `perfetto` package; a
//! missing interpreter is a failure, not a skip.

use std::path::{Path, PathBuf};
use std::process::Command;

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("proto/ has a parent")
        .to_owned()
}

fn python() -> PathBuf {
    let p = match std::env::var_os("VITALS_PYTHON") {
        Some(p) => PathBuf::from(p),
        None => workspace_root().join(".venv/bin/python"),
    };
    assert!(
        p.exists(),
        "{} not found: run `cargo xtask setup` to create the venv with the `perfetto` Python package (or set VITALS_PYTHON)",
        p.display()
    );
    p
}

#[test]
fn protos_match_official_schema() {
    let root = workspace_root();
    let out = Command::new(python())
        .arg(root.join("tests/python/check_schema.py"))
        .arg(root.join("proto/protos"))
        .output()
        .expect("running check_schema.py");
    assert!(
        out.status.success(),
        "check_schema.py failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
