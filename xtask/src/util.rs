use std::{
    os::unix::process::CommandExt,
    path::{Path, PathBuf},
    process::{Child, Command},
};

use std::collections::HashMap;

use anyhow::{bail, Context, Result};

pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_owned()
}

pub fn cargo() -> Command {
    let mut c = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    c.current_dir(workspace_root());
    c
}

/// Runs a command, inheriting stdio; a non-zero exit is an error.
pub fn run(cmd: &mut Command) -> Result<()> {
    let status = cmd
        .status()
        .with_context(|| format!("spawning {:?}", cmd.get_program()))?;
    if !status.success() {
        bail!("{cmd:?} failed: {status}");
    }
    Ok(())
}

/// Runs a command and returns its stdout.
pub fn output(cmd: &mut Command) -> Result<String> {
    let out = cmd
        .output()
        .with_context(|| format!("spawning {:?}", cmd.get_program()))?;
    if !out.status.success() {
        bail!(
            "{cmd:?} failed: {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

#[derive(Debug, Clone)]
/// One loaded BPF program, as `bpftool prog show --json` reports it
/// (run_time_ns/run_cnt move only while kernel.bpf_stats_enabled=1).
pub struct ProgStat {
    pub name: String,
    pub run_time_ns: u64,
    pub run_cnt: u64,
}

/// Every loaded BPF program by id.
pub fn bpf_progs() -> Result<HashMap<u64, ProgStat>> {
    let json = output(Command::new("bpftool").args(["prog", "show", "--json"]))?;
    let v: serde_json::Value = serde_json::from_str(&json).context("bpftool json")?;
    let mut out = HashMap::new();
    for p in v.as_array().into_iter().flatten() {
        let id = p["id"].as_u64().unwrap_or(0);
        out.insert(
            id,
            ProgStat {
                name: p["name"].as_str().unwrap_or("?").to_owned(),
                run_time_ns: p["run_time_ns"].as_u64().unwrap_or(0),
                run_cnt: p["run_cnt"].as_u64().unwrap_or(0),
            },
        );
    }
    Ok(out)
}

pub fn set_bpf_stats(on: bool) -> Result<()> {
    std::fs::write(
        "/proc/sys/kernel/bpf_stats_enabled",
        if on { "1" } else { "0" },
    )
    .context("writing kernel.bpf_stats_enabled")
}

/// A child in its own process group, killed with the group on drop, so a
/// run that fails leaves nothing of it running.
pub struct Group(pub Child);

impl Group {
    /// Spawns `cmd` as the leader of a new process group.
    pub fn spawn(cmd: &mut Command) -> std::io::Result<Self> {
        Ok(Self(cmd.process_group(0).spawn()?))
    }

    /// Sends `sig` to the whole group.
    pub fn signal(&self, sig: i32) {
        // SAFETY: a signal to the process group this child leads.
        unsafe { libc::kill(-(self.0.id() as i32), sig) };
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        self.signal(libc::SIGKILL);
        let _ = self.0.wait();
    }
}
