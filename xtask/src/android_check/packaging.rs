//! Check 1c: every file `cargo xtask dist` ships exists, the Android.bp it
//! writes parses as Blueprint (our own parser, `blueprint.rs`: there is no
//! Soong here), and every path that Android.bp names is a shipped file.

use std::path::Path;

use anyhow::{ensure, Result};

use super::blueprint::{self, Value};
use crate::dist;

fn strings(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Str(s) => out.push(s.clone()),
        Value::List(l) => l.iter().for_each(|x| strings(x, out)),
        Value::Map(m) => m.iter().for_each(|(_, x)| strings(x, out)),
        Value::Concat(a, b) => {
            strings(a, out);
            strings(b, out);
        }
        _ => {}
    }
}

/// Paths a module installs from: `src`, `srcs` (also under `arch`), `init_rc`.
fn source_paths(m: &blueprint::Module) -> Vec<String> {
    let mut out = Vec::new();
    for (k, v) in &m.props {
        match k.as_str() {
            "src" | "srcs" | "init_rc" => strings(v, &mut out),
            "arch" | "target" => {
                if let Value::Map(archs) = v {
                    for (_, a) in archs {
                        if let Value::Map(props) = a {
                            for (k, v) in props {
                                if k == "srcs" || k == "src" {
                                    strings(v, &mut out);
                                }
                            }
                        }
                    }
                }
            }
            _ => {}
        }
    }
    out
}

/// Check 1c for an Android target; `bins` holds the built binaries.
pub fn check(root: &Path, bins: &Path) -> Result<String> {
    let shipped = dist::manifest(root, bins)?;
    let missing: Vec<String> = shipped
        .iter()
        .filter(|s| !s.src.is_file())
        .map(|s| format!("{} (from {})", s.dest, s.src.display()))
        .collect();
    ensure!(
        missing.is_empty(),
        "files dist ships that do not exist:\n  {}",
        missing.join("\n  ")
    );
    let mut report = vec![format!("  {} shipped files exist", shipped.len())];
    for target in ["aarch64-linux-android", "x86_64-linux-android"] {
        let bp = dist::android_bp(target, &shipped);
        let modules = blueprint::parse(&bp).map_err(|e| anyhow::anyhow!("{e}\n{bp}"))?;
        let mut named = Vec::new();
        for m in &modules {
            for p in source_paths(m) {
                ensure!(
                    shipped.iter().any(|s| s.dest == p),
                    "{target}: Android.bp line {} ({}) names {p}, which dist does not ship",
                    m.line,
                    m.kind
                );
                named.push(p);
            }
        }
        for must in [
            "bin/vitalsd",
            "bin/vitalsctl",
            "bpf/vitals.o",
            "etc/init/vitalsd.rc",
        ] {
            ensure!(
                named.iter().any(|p| p == must),
                "{target}: Android.bp installs no {must}"
            );
        }
        let names: Vec<String> = modules
            .iter()
            .filter_map(|m| match m.get("name") {
                Some(Value::Str(n)) => Some(format!("{} {n}", m.kind)),
                _ => None,
            })
            .collect();
        report.push(format!(
            "  Android.bp for {target}: parses as Blueprint ({}); the {} paths it names are all \
             shipped",
            names.join(", "),
            named.len()
        ));
    }
    Ok(report.join("\n"))
}
