//! The `[capture]` table: how the daemon's captures record, the eBPF
//! capture tier's memory, and the processes off-CPU captures watch.

use serde::{Deserialize, Serialize};

use crate::bpf::EventMemory;

/// `capture.backend`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BackendChoice {
    /// The first registered backend available on the daemon's tier: eBPF
    /// when the daemon has eBPF accounting, else Perfetto.
    #[default]
    Auto,
    Ebpf,
    Perfetto,
}

impl BackendChoice {
    /// The registered backend's name this choice asks for; None: auto.
    pub fn named(self) -> Option<&'static str> {
        match self {
            BackendChoice::Auto => None,
            BackendChoice::Ebpf => Some("ebpf"),
            BackendChoice::Perfetto => Some("perfetto"),
        }
    }
}

/// How the daemon's captures (rules', `vitalsctl capture`) record, and the
/// kernel memory the eBPF capture tier reserves at start.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CaptureSettings {
    /// "auto": the eBPF capture tier when the daemon has eBPF accounting,
    /// else a Perfetto session of traced's own data sources; "ebpf" (a
    /// capture /proc-only then fails); "perfetto" (through
    /// `heapprofd.consumer`, as heap profiles).
    pub backend: BackendChoice,
    /// The eBPF capture ring buffer (see [`EventMemory`]).
    pub buffer_bytes: u32,
    /// The eBPF sampled-fault stack map's entries (see [`EventMemory`]).
    pub stack_entries: u32,
    /// Processes (names matched as rules match `process`: argv[0]'s
    /// basename, else comm) whose long blocks every capture that records
    /// off-CPU stacks watches (`capture = { offcpu = true }`, `vitalsctl
    /// capture --offcpu`), beside a rule's offending process. Resolved to
    /// pids when the capture starts; a process started during it joins at
    /// the daemon's next scan.
    pub offcpu_watch: Vec<String>,
    /// Watch every thread instead (costs a stack walk per long block of
    /// any thread); exclusive with `offcpu_watch`.
    pub offcpu_watch_all: bool,
}

impl Default for CaptureSettings {
    fn default() -> Self {
        let m = EventMemory::default();
        Self {
            backend: Default::default(),
            buffer_bytes: m.buffer_bytes,
            stack_entries: m.stack_entries,
            offcpu_watch: Vec::new(),
            offcpu_watch_all: false,
        }
    }
}

impl CaptureSettings {
    /// The off-CPU keys: (key, why) of the first bad one. Names are
    /// matched exactly, so a glob is a mistake, not a pattern.
    pub fn check_offcpu(&self) -> Result<(), (&'static str, String)> {
        let max = vitals_common::capture::OFFCPU_WATCH_MAX_TGIDS as usize;
        if self.offcpu_watch_all && !self.offcpu_watch.is_empty() {
            return Err((
                "offcpu_watch_all",
                "watches every thread: leave offcpu_watch empty with it".into(),
            ));
        }
        if self.offcpu_watch.len() > max {
            return Err(("offcpu_watch", format!("at most {max} names")));
        }
        for name in &self.offcpu_watch {
            if name.is_empty() || name.contains(['*', '?', '[', '/']) {
                return Err((
                    "offcpu_watch",
                    format!(
                        "{name:?}: a process name, matched exactly (argv[0]'s basename or \
                         comm, as a rule's `process`); no globs or paths"
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Whether a capture of a system-wide rule (no offending process) has
    /// processes to watch.
    pub fn offcpu_watches_without_offender(&self) -> bool {
        self.offcpu_watch_all || !self.offcpu_watch.is_empty()
    }

    /// The eBPF capture tier's memory, as the programs are loaded with.
    pub fn memory(&self) -> EventMemory {
        EventMemory {
            buffer_bytes: self.buffer_bytes,
            stack_entries: self.stack_entries,
        }
    }
}
