//! The host end of the decoder relay. The tests decode every trace with the
//! official Perfetto Python package (tests/python/trace_summary.py), and a
//! guest has no Python; the init script therefore sets VITALS_PYTHON to
//! tests/src/bin/vitals-vm-relay.rs, which sends the script's name, its
//! options and the trace over a virtio-serial port. This end runs the same
//! script of this workspace with the venv's Python on a copy of the trace
//! and sends back the exit status, stdout and stderr. The test in the guest
//! then asserts on that output exactly as it does on the host.
//!
//! Wire format, both ways: one JSON line, then the raw bytes it announces.
//! Request: {"script": "<file name>", "args": [...], "len": N} + N bytes.
//! Response: {"code": C, "stdout_len": A, "stderr_len": B} + A + B bytes.

use std::{
    io::{BufRead, BufReader, Read, Write},
    os::unix::net::UnixStream,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context, Result};

use crate::util::workspace_root;

/// The Python with the official `perfetto` package: VITALS_PYTHON, else
/// the workspace's .venv (what tests/src/lib.rs picks too).
pub fn host_python() -> PathBuf {
    std::env::var_os("VITALS_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join(".venv/bin/python"))
}

/// Serves requests until the guest goes away (EOF on the socket).
pub fn serve(stream: UnixStream, work: &Path) {
    let mut writer = match stream.try_clone() {
        Ok(w) => w,
        Err(e) => {
            eprintln!("vm-test relay: {e}");
            return;
        }
    };
    let mut reader = BufReader::new(stream);
    let mut n = 0;
    loop {
        n += 1;
        match one(&mut reader, &mut writer, work, n) {
            Ok(true) => {}
            Ok(false) => return,
            Err(e) => {
                eprintln!("vm-test relay: {e:#}");
                return;
            }
        }
    }
}

/// Handles one request; false at EOF.
fn one(
    reader: &mut BufReader<UnixStream>,
    writer: &mut UnixStream,
    work: &Path,
    n: usize,
) -> Result<bool> {
    let mut header = String::new();
    if reader.read_line(&mut header)? == 0 {
        return Ok(false);
    }
    let req: serde_json::Value =
        serde_json::from_str(header.trim()).with_context(|| format!("request {header:?}"))?;
    let len = req["len"].as_u64().context("request without len")? as usize;
    let mut trace = vec![0u8; len];
    reader.read_exact(&mut trace)?;
    // Only a script of tests/python, by file name.
    let script = req["script"].as_str().unwrap_or("");
    let path = workspace_root().join("tests/python").join(script);
    if script.is_empty() || script.contains('/') || !path.is_file() {
        bail!("the guest asked for {script:?}, not a script of tests/python");
    }
    let args: Vec<String> = req["args"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|a| a.as_str().map(str::to_owned))
        .collect();
    let copy = work.join(format!("relay-{n}.pftrace"));
    std::fs::write(&copy, &trace)?;
    let out = Command::new(host_python())
        .arg(&path)
        .args(&args)
        .arg(&copy)
        .output()
        .context("running the host's Python")?;
    let _ = std::fs::remove_file(&copy);
    let resp = serde_json::json!({
        "code": out.status.code().unwrap_or(1),
        "stdout_len": out.stdout.len(),
        "stderr_len": out.stderr.len(),
    });
    writer.write_all(format!("{resp}\n").as_bytes())?;
    writer.write_all(&out.stdout)?;
    writer.write_all(&out.stderr)?;
    writer.flush()?;
    eprintln!(
        "vm-test relay: decoded {len} bytes with {script} {args:?}: exit {}",
        out.status.code().unwrap_or(-1)
    );
    Ok(true)
}
