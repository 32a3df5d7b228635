//! The `[[rule]]` tables: what a health rule watches and the capture it
//! asks for when it fires.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::Dur;
use crate::event_set::EventSet;

/// What a rule watches.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields, tag = "kind")]
pub enum Metric {
    /// (user+nice+system+irq+softirq) / total of /proc/stat, %.
    SystemCpuBusyPct,
    /// One process's core-equivalent % ((Δutime+Δstime)/Δwall); `process`
    /// names it (argv[0] basename or comm); absent = any process.
    ProcessCpuPct { process: Option<String> },
    /// loadavg 1-minute average divided by online CPUs.
    LoadavgPerCpu,
    /// PSI avg10 of `resource` (cpu, memory, io), `some` or `full`, %.
    PsiAvg10 { resource: String, full: bool },
    /// Major faults per second of any (or the named) process.
    MajorFaultRate { process: Option<String> },
    /// RSS growth of a process over the rule's window, kB.
    RssGrowthKb { process: Option<String> },
    /// Long blocks (at least `sampling.long_block`, off-CPU accounting)
    /// of a process's main thread (tid == tgid: an app's UI thread) over
    /// the rule's window: fires when more than `threshold` (threshold 2:
    /// "3 times in the window"). Not all threads': idle pool workers
    /// block for long as a matter of course.
    MainThreadLongBlocks { process: Option<String> },
}

/// How a rule reads the figure its metric names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Watch<'a> {
    /// A sample's system-wide figure, above the threshold in every sample
    /// of the window.
    System { figure: &'static str },
    /// A process's figure, above the threshold in every sample of the
    /// window for one process instance (`process`: its name, None = any).
    Held {
        figure: &'static str,
        process: Option<&'a str>,
    },
    /// A process's figure, grown by more than the threshold from the
    /// window's first sample to its last.
    Growth {
        figure: &'static str,
        process: Option<&'a str>,
    },
}

impl Metric {
    /// The one table from the config's metrics to the figures the sources
    /// offer (`sources::*::figures`, by name). None: a PSI resource no
    /// source offers, which never matches.
    pub fn watch(&self) -> Option<Watch<'_>> {
        use Watch::*;
        Some(match self {
            Metric::SystemCpuBusyPct => System {
                figure: "system.local_busy_pct",
            },
            Metric::LoadavgPerCpu => System {
                figure: "system.loadavg_1m_per_cpu",
            },
            Metric::PsiAvg10 { resource, full } => System {
                figure: match (resource.as_str(), full) {
                    ("cpu", false) => "system.psi_cpu_some_avg10",
                    ("cpu", true) => "system.psi_cpu_full_avg10",
                    ("memory", false) => "system.psi_memory_some_avg10",
                    ("memory", true) => "system.psi_memory_full_avg10",
                    ("io", false) => "system.psi_io_some_avg10",
                    ("io", true) => "system.psi_io_full_avg10",
                    _ => return None,
                },
            },
            Metric::ProcessCpuPct { process } => Held {
                figure: "tasks.core_equivalent_pct",
                process: process.as_deref(),
            },
            Metric::MajorFaultRate { process } => Held {
                figure: "tasks.majflt_per_s",
                process: process.as_deref(),
            },
            Metric::RssGrowthKb { process } => Growth {
                figure: "tasks.rss_kb",
                process: process.as_deref(),
            },
            Metric::MainThreadLongBlocks { process } => Growth {
                figure: "offcpu.main_thread_long_blocks",
                process: process.as_deref(),
            },
        })
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rule {
    pub name: String,
    pub metric: Metric,
    pub threshold: f64,
    /// The metric must stay above the threshold for this long (RSS growth:
    /// the span the growth is measured over).
    pub window: Dur,
    pub cooldown: Dur,
    #[serde(default)]
    pub capture: RecordingSpec,
}

/// The capture a rule asks for (`capture = { … }`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "RecordingSpecFile", into = "RecordingSpecFile")]
pub struct RecordingSpec {
    pub duration: Dur,
    /// The kernel events the window records (`sched`, `faults` in the
    /// file); [`EventSet::RULE_DEFAULT`] when it names neither.
    pub events: EventSet,
    /// Off-CPU stacks (issue #24): each long block (`sampling.long_block`)
    /// of a watched thread with its stack at switch-out and its waker's at
    /// sched_waking. Watched: the rule's offending process, and the
    /// processes `capture.offcpu_watch` names. Needs `sched`.
    pub offcpu: bool,
    /// heapprofd profile of the offending process when allowlisted.
    pub heap_profile: bool,
    /// Process names (normalised cmdline) a heap profile may target.
    pub heap_allowlist: Vec<String>,
    /// Installers (package installer names) allowed, empty = any.
    pub heap_installers: Vec<String>,
    /// "ring": keep a Perfetto ring-buffer session running for this rule
    /// and stop it with a trigger when the rule fires, so the capture holds
    /// the minutes before (Perfetto backend); "none": start at the fire.
    pub prelude: Prelude,
}

/// `capture.prelude`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Prelude {
    #[default]
    None,
    Ring,
}

impl Default for RecordingSpec {
    fn default() -> Self {
        Self {
            duration: Dur(Duration::from_secs(10)),
            events: EventSet::RULE_DEFAULT,
            offcpu: false,
            heap_profile: false,
            heap_allowlist: Vec::new(),
            heap_installers: Vec::new(),
            prelude: Prelude::None,
        }
    }
}

/// [`RecordingSpec`] as the config file spells it: `sched` and `faults`
/// among the other keys. (serde's `flatten` would do, but it does not
/// work with `deny_unknown_fields`.)
#[derive(Serialize, Deserialize)]
#[serde(rename = "RecordingSpec", deny_unknown_fields, default)]
struct RecordingSpecFile {
    duration: Dur,
    sched: bool,
    faults: bool,
    offcpu: bool,
    heap_profile: bool,
    heap_allowlist: Vec<String>,
    heap_installers: Vec<String>,
    prelude: Prelude,
}

impl Default for RecordingSpecFile {
    fn default() -> Self {
        RecordingSpec::default().into()
    }
}

impl TryFrom<RecordingSpecFile> for RecordingSpec {
    type Error = &'static str;

    fn try_from(f: RecordingSpecFile) -> Result<Self, Self::Error> {
        // The blocks are cut from the capture's own sched_switch and
        // sched_waking records; with sched off none are taken.
        if f.offcpu && !f.sched {
            return Err(
                "capture.offcpu needs the CPU timeline: drop `sched = false` \
                        (the blocks are found in its sched_switch/sched_waking records)",
            );
        }
        Ok(Self {
            duration: f.duration,
            events: EventSet {
                sched: f.sched,
                faults: f.faults,
            },
            offcpu: f.offcpu,
            heap_profile: f.heap_profile,
            heap_allowlist: f.heap_allowlist,
            heap_installers: f.heap_installers,
            prelude: f.prelude,
        })
    }
}

impl From<RecordingSpec> for RecordingSpecFile {
    fn from(s: RecordingSpec) -> Self {
        Self {
            duration: s.duration,
            sched: s.events.sched,
            faults: s.events.faults,
            offcpu: s.offcpu,
            heap_profile: s.heap_profile,
            heap_allowlist: s.heap_allowlist,
            heap_installers: s.heap_installers,
            prelude: s.prelude,
        }
    }
}
