//! Who a recorded process is: the names of its tracks and its ProcessTree
//! entry.

use std::sync::Arc;

use crate::{
    perfetto::ProcessTreeEntry,
    procfs::{
        cmdline::{argv, name_from_cmdline},
        sampler::ProcessSample,
    },
};

/// Who a process is, for naming its tracks and its ProcessTree entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct ProcessIdentity {
    pub(super) pid: u32,
    pub(super) ppid: u32,
    pub(super) comm: String,
    /// /proc/<pid>/stat field 22; with pid it identifies the instance.
    pub(super) starttime_ticks: u64,
    /// NUL-separated argv (procfs::cmdline); empty for kernel threads.
    pub(super) cmdline: Arc<str>,
}

impl ProcessIdentity {
    pub(super) fn of(p: &ProcessSample) -> Self {
        Self {
            pid: p.stat.pid as u32,
            ppid: p.stat.ppid.max(0) as u32,
            comm: p.stat.comm.to_string_lossy(),
            starttime_ticks: p.stat.starttime_ticks,
            cmdline: p.cmdline.clone().unwrap_or_else(|| Arc::from("")),
        }
    }

    /// A process that was gone before it could be read, named by the comm
    /// its leader's free record carries.
    pub(super) fn from_comm(pid: u32, comm: String) -> Self {
        Self {
            pid,
            ppid: 0,
            comm,
            starttime_ticks: 0,
            cmdline: Arc::from(""),
        }
    }

    /// argv[0]'s basename (Android app processes set argv[0] to the
    /// package name), else comm.
    pub(super) fn name(&self) -> &str {
        match name_from_cmdline(&self.cmdline) {
            "" => &self.comm,
            n => n,
        }
    }
}

pub(super) fn tree_entries<'a>(
    ids: impl IntoIterator<Item = &'a ProcessIdentity>,
) -> Vec<ProcessTreeEntry> {
    ids.into_iter()
        .map(|p| {
            let argv: Vec<String> = argv(&p.cmdline).map(str::to_owned).collect();
            ProcessTreeEntry {
                pid: p.pid as i32,
                ppid: p.ppid as i32,
                cmdline_is_comm: argv.is_empty(),
                cmdline: if argv.is_empty() {
                    vec![p.comm.clone()]
                } else {
                    argv
                },
                uid: None,
                threads: Vec::new(),
            }
        })
        .collect()
}
