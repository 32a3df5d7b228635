//! Which threads an off-CPU capture watches (issue #24 part 2): every
//! thread (`vitalsd record --offcpu`), or the threads of a set of processes
//! (a rule's offender, `--offcpu-pid`, `vitalsctl capture --offcpu-pid`,
//! and the processes `[capture] offcpu_watch` names), resolved to tgids
//! when the capture starts; processes started during it with one of the
//! names join when the recording's tick first sees them.

use std::path::Path;

use crate::procfs::cmdline::{name_from_cmdline, parse_cmdline};

/// Which blocks a capture records with their stacks: a watched thread's
/// block (switch-out while not runnable to the sched_waking ending it)
/// at least `min_block_ns` long.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OffcpuWatch {
    pub min_block_ns: u64,
    pub processes: WatchedProcesses,
    /// With `Tgids`: a process that starts during the capture with one of
    /// these names joins the watch at the first tick whose scan sees it
    /// (`capture.offcpu_watch`); its blocks before then are not recorded.
    pub follow_names: Vec<String>,
}

/// The processes whose threads are watched.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatchedProcesses {
    /// Every thread on the machine.
    All,
    /// These processes' threads only (tgids, deduplicated); empty: none.
    Tgids(Vec<u32>),
}

impl OffcpuWatch {
    /// One 60 Hz frame: a block this long is a jank on its own.
    pub const DEFAULT_MIN_BLOCK_NS: u64 = 16_000_000;
}

impl Default for OffcpuWatch {
    fn default() -> Self {
        Self {
            min_block_ns: Self::DEFAULT_MIN_BLOCK_NS,
            processes: WatchedProcesses::All,
            follow_names: Vec::new(),
        }
    }
}

/// What a daemon capture asks to watch, before it starts: resolved to
/// [`OffcpuWatch`] in the recording's thread as it starts (a /proc walk
/// for the names), not on the daemon's main loop.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OffcpuRequest {
    /// `sampling.long_block`: the same "long" as the off-CPU accounting.
    pub min_block_ns: u64,
    /// The rule's offending process, or `vitalsctl capture --offcpu-pid`.
    pub pids: Vec<u32>,
    /// `capture.offcpu_watch`.
    pub names: Vec<String>,
    /// `capture.offcpu_watch_all`.
    pub all: bool,
}

impl OffcpuRequest {
    pub fn resolve(&self, proc_root: &Path) -> OffcpuWatch {
        OffcpuWatch {
            min_block_ns: self.min_block_ns,
            processes: if self.all {
                WatchedProcesses::All
            } else {
                WatchedProcesses::resolve(proc_root, &self.pids, &self.names)
            },
            follow_names: if self.all {
                Vec::new()
            } else {
                self.names.clone()
            },
        }
    }
}

impl WatchedProcesses {
    /// The processes `pids`, each once.
    pub fn of_pids(pids: &[u32]) -> Self {
        Self::resolve(Path::new("/proc"), pids, &[])
    }

    /// The tgids `pids` and the processes named `names` under `proc_root`,
    /// sorted, each once.
    pub fn resolve(proc_root: &Path, pids: &[u32], names: &[String]) -> Self {
        let mut tgids = pids.to_vec();
        if !names.is_empty() {
            tgids.extend(tgids_named(proc_root, names));
        }
        tgids.sort_unstable();
        tgids.dedup();
        Self::Tgids(tgids)
    }
}

/// The processes under `proc_root` whose name is one of `names`, matched
/// as rules match `process`: argv[0]'s basename, or comm for a process
/// with an empty cmdline (kernel threads, zombies). A process that exits
/// between the listing and the read is skipped (ENOENT/ESRCH are normal).
pub fn tgids_named(proc_root: &Path, names: &[String]) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir(proc_root) else {
        log::warn!("off-CPU watch: cannot list {}", proc_root.display());
        return Vec::new();
    };
    let mut out = Vec::new();
    for entry in dir.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        let path = entry.path();
        let cmdline = match std::fs::read(path.join("cmdline")) {
            Ok(b) => parse_cmdline(&b),
            Err(_) => continue,
        };
        let name = if cmdline.is_empty() {
            match std::fs::read_to_string(path.join("comm")) {
                Ok(c) => c.trim_end_matches('\n').to_owned(),
                Err(_) => continue,
            }
        } else {
            name_from_cmdline(&cmdline).to_owned()
        };
        if names.contains(&name) {
            out.push(pid);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn process(root: &Path, pid: u32, cmdline: &[u8], comm: &str) {
        let d = root.join(pid.to_string());
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("cmdline"), cmdline).unwrap();
        std::fs::write(d.join("comm"), format!("{comm}\n")).unwrap();
    }

    /// argv[0]'s basename, else comm (a kernel thread has no cmdline); the
    /// explicit pids join them; each tgid once.
    #[test]
    fn names_match_argv0_basename_or_comm_and_pids_join_them() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        process(root, 10, b"/system/bin/surfaceflinger\0", "surfaceflinge");
        process(root, 11, b"system_server\0", "system_server");
        // comm would match, argv[0] does not: argv[0] wins.
        process(root, 12, b"/bin/other\0", "system_server");
        process(root, 13, b"", "kswapd0");
        process(root, 14, b"/usr/bin/surfaceflinger-helper\0", "sf");
        std::fs::create_dir_all(root.join("self")).unwrap();
        let names = |n: &[&str]| n.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let w = WatchedProcesses::resolve(
            root,
            &[11, 99],
            &names(&["surfaceflinger", "system_server", "kswapd0"]),
        );
        assert_eq!(w, WatchedProcesses::Tgids(vec![10, 11, 13, 99]));
        assert_eq!(
            WatchedProcesses::resolve(root, &[], &names(&["nothing"])),
            WatchedProcesses::Tgids(vec![])
        );
    }
}
