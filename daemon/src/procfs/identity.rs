//! Who a process is: pid, ppid, comm, starttime and argv, for naming tracks
//! and ProcessTree entries. Read once per process instance, on first sight.

use std::path::Path;

use super::{cmdline::parse_argv, is_vanished, pid_stat::parse_pid_stat, read_into};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessIdentity {
    pub pid: u32,
    pub ppid: u32,
    pub comm: String,
    /// /proc/<pid>/stat field 22; with pid it identifies the instance.
    pub starttime_ticks: u64,
    /// argv; empty for kernel threads and zombies.
    pub cmdline: Vec<String>,
}

impl ProcessIdentity {
    /// A process that was gone before we could read it.
    pub fn unknown(pid: u32) -> Self {
        Self {
            pid,
            ppid: 0,
            comm: format!("<{pid}>"),
            starttime_ticks: 0,
            cmdline: Vec::new(),
        }
    }

    /// The name users know: argv[0]'s basename (Android app processes set
    /// argv[0] to the package name), else comm.
    pub fn name(&self) -> &str {
        match self.cmdline.first() {
            Some(a) if !a.is_empty() => a.rsplit('/').next().unwrap_or(a),
            _ => &self.comm,
        }
    }
}

/// Reads one process; None if it vanished or cannot be read.
pub fn read_process(proc_root: &Path, pid: u32) -> Option<ProcessIdentity> {
    let mut buf = Vec::new();
    read_process_with(proc_root, pid, &mut buf)
}

fn read_process_with(proc_root: &Path, pid: u32, buf: &mut Vec<u8>) -> Option<ProcessIdentity> {
    let dir = proc_root.join(pid.to_string());
    if let Err(e) = read_into(&dir.join("stat"), buf) {
        if !is_vanished(&e) {
            log::debug!("reading {}/stat: {e}", dir.display());
        }
        return None;
    }
    let stat = match parse_pid_stat(buf) {
        Ok(s) => s,
        Err(e) => {
            log::warn!("{}/stat: {e}", dir.display());
            return None;
        }
    };
    let cmdline = match read_into(&dir.join("cmdline"), buf) {
        Ok(()) => parse_argv(buf),
        Err(_) => Vec::new(),
    };
    Some(ProcessIdentity {
        pid,
        ppid: stat.ppid.max(0) as u32,
        comm: stat.comm.to_string_lossy(),
        starttime_ticks: stat.starttime_ticks,
        cmdline,
    })
}

/// Every process under `proc_root`; ones that vanish mid-scan are skipped.
pub fn scan_processes(proc_root: &Path) -> Vec<ProcessIdentity> {
    let mut out = Vec::new();
    let Ok(dir) = std::fs::read_dir(proc_root) else {
        return out;
    };
    let mut buf = Vec::new();
    for entry in dir.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        if let Some(p) = read_process_with(proc_root, pid, &mut buf) {
            out.push(p);
        }
    }
    out.sort_by_key(|p| p.pid);
    out
}
