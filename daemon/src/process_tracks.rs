//! Per-process eBPF counters as Perfetto counter tracks, and the process
//! identities that name them: one encoding shared by `vitalsd record` (a
//! trace file) and the producer (a data source of traced), so both write
//! the same tracks with the same names, units and uuids.

use std::{collections::HashMap, io::Write, sync::Arc};

use crate::{
    accounting::{CounterOrigin, ProcessCounters},
    bpf::FaultSource,
    perfetto::{
        CounterSpec, CounterUnit, CounterValue, PerfettoError, ProcessKey, ProcessTreeEntry,
        TraceWriter, TrackUuid,
    },
    procfs::{
        cmdline::{argv, name_from_cmdline},
        sampler::ProcessSample,
    },
};

/// What a per-process counter measures; a data source config picks by kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CounterKind {
    OnCpu,
    RunqWait,
    Switches,
    Faults,
    /// Blocked time in S and D and long blocks (off-CPU accounting).
    Offcpu,
}

impl CounterKind {
    pub const ALL: [CounterKind; 5] = [
        CounterKind::OnCpu,
        CounterKind::RunqWait,
        CounterKind::Switches,
        CounterKind::Faults,
        CounterKind::Offcpu,
    ];

    /// The name a data source config uses for it.
    pub fn name(self) -> &'static str {
        match self {
            CounterKind::OnCpu => "oncpu",
            CounterKind::RunqWait => "runq_wait",
            CounterKind::Switches => "switches",
            CounterKind::Faults => "faults",
            CounterKind::Offcpu => "offcpu",
        }
    }
}

/// One per-process counter track: its descriptor and where its value comes from.
pub struct ProcessCounter {
    pub kind: CounterKind,
    pub spec: CounterSpec,
    pub value: fn(&ProcessCounters) -> u64,
}

fn spec(name: &str, unit: CounterUnit, description: &str) -> CounterSpec {
    CounterSpec {
        name: name.into(),
        unit,
        description: Some(description.into()),
    }
}

/// The per-process counters, named by where they come from; runqueue wait
/// only when it is measured, so an absent track never reads as zero wait.
/// `since` says where the cumulative values start ("recording start",
/// "vitalsd start").
pub fn process_counters(origin: CounterOrigin, since: &str) -> Vec<ProcessCounter> {
    match origin {
        CounterOrigin::Ebpf {
            fault_source,
            runq_wait,
            offcpu,
        } => {
            let mut v = ebpf_counters(fault_source, runq_wait, since);
            if offcpu {
                v.extend(offcpu_counters(since));
            }
            v
        }
        CounterOrigin::Schedstat => schedstat_counters(since),
    }
}

fn ebpf_counters(fault_source: FaultSource, runq_wait: bool, since: &str) -> Vec<ProcessCounter> {
    let mut v = vec![ProcessCounter {
        kind: CounterKind::OnCpu,
        spec: spec(
            "oncpu_ns",
            CounterUnit::TimeNs,
            &format!("on-CPU time since {since} (eBPF sched_switch)"),
        ),
        value: |r| r.oncpu_ns,
    }];
    if runq_wait {
        v.push(ProcessCounter {
            kind: CounterKind::RunqWait,
            spec: spec(
                "runq_wait_ns",
                CounterUnit::TimeNs,
                &format!("runnable-but-not-running time since {since}"),
            ),
            value: |r| r.runq_wait_ns,
        });
    }
    v.extend(switch_counters("", "(eBPF sched_switch)"));
    let faults: fn(&ProcessCounters) -> u64 = match fault_source {
        FaultSource::Tracepoint => |r| r.faults.entries,
        FaultSource::PerfEvent => |r| r.faults.minflt + r.faults.majflt,
        FaultSource::None => return v,
    };
    v.push(ProcessCounter {
        kind: CounterKind::Faults,
        spec: spec(
            &format!("faults_{}", fault_source.name()),
            CounterUnit::Count,
            fault_source.describe(),
        ),
        value: faults,
    });
    v
}

/// Off-CPU accounting's tracks (`sources::offcpu`): blocked time split
/// by the switch-out state, and long blocks.
fn offcpu_counters(since: &str) -> [ProcessCounter; 3] {
    [
        ProcessCounter {
            kind: CounterKind::Offcpu,
            spec: spec(
                "offcpu.blocked_s_ns",
                CounterUnit::TimeNs,
                &format!(
                    "time blocked in S (TASK_INTERRUPTIBLE) since {since}, \
                     from switch-out to the sched_waking that ended it"
                ),
            ),
            value: |r| r.offcpu.blocked_s_ns,
        },
        ProcessCounter {
            kind: CounterKind::Offcpu,
            spec: spec(
                "offcpu.blocked_d_ns",
                CounterUnit::TimeNs,
                &format!(
                    "time blocked in D (TASK_UNINTERRUPTIBLE, not TASK_IDLE) since {since}, \
                     from switch-out to the sched_waking that ended it"
                ),
            ),
            value: |r| r.offcpu.blocked_d_ns,
        },
        ProcessCounter {
            kind: CounterKind::Offcpu,
            spec: spec(
                "offcpu.long_blocks",
                CounterUnit::Count,
                &format!("blocks of at least sampling.long_block since {since}"),
            ),
            value: |r| r.offcpu.long_blocks,
        },
    ]
}

/// The procfs scheduler source's tracks: `schedstat.*` from the kernel's
/// per-thread schedstat, `status.*` from its status switch counts.
fn schedstat_counters(since: &str) -> Vec<ProcessCounter> {
    let mut v = vec![
        ProcessCounter {
            kind: CounterKind::OnCpu,
            spec: spec(
                "schedstat.oncpu_ns",
                CounterUnit::TimeNs,
                &format!(
                    "on-CPU time since {since}: the kernel's sum_exec_runtime \
                     (task/<tid>/schedstat), exited threads from stat ticks"
                ),
            ),
            value: |r| r.oncpu_ns,
        },
        ProcessCounter {
            kind: CounterKind::RunqWait,
            spec: spec(
                "schedstat.runq_wait_ns",
                CounterUnit::TimeNs,
                &format!(
                    "runqueue wait since {since}: the kernel's run_delay (task/<tid>/schedstat)"
                ),
            ),
            value: |r| r.runq_wait_ns,
        },
    ];
    v.extend(switch_counters("status.", "(task/<tid>/status)"));
    v.push(ProcessCounter {
        kind: CounterKind::Faults,
        spec: spec(
            "stat.faults",
            CounterUnit::Count,
            "successful page faults, minflt + majflt of /proc/<pid>/stat",
        ),
        value: |r| r.faults.minflt + r.faults.majflt,
    });
    v
}

fn switch_counters(prefix: &str, source: &str) -> [ProcessCounter; 2] {
    [
        ProcessCounter {
            kind: CounterKind::Switches,
            spec: spec(
                &format!("{prefix}voluntary_switches"),
                CounterUnit::Count,
                &format!("switch-outs while blocked {source}"),
            ),
            value: |r| r.voluntary_switches,
        },
        ProcessCounter {
            kind: CounterKind::Switches,
            spec: spec(
                &format!("{prefix}involuntary_switches"),
                CounterUnit::Count,
                &format!("switch-outs while runnable (preempted) {source}"),
            ),
            value: |r| r.involuntary_switches,
        },
    ]
}

/// A process's counter tracks, parallel to the counters.
struct Tracks {
    key: ProcessKey,
    uuids: Vec<TrackUuid>,
    /// Last values written, so unchanged counters cost nothing.
    last: Vec<i64>,
}

/// The counter tracks of every process written so far, by tgid.
pub struct ProcessCounterTracks {
    counters: Vec<ProcessCounter>,
    tracks: HashMap<u32, Tracks>,
}

impl ProcessCounterTracks {
    pub fn new(counters: Vec<ProcessCounter>) -> Self {
        Self {
            counters,
            tracks: HashMap::new(),
        }
    }

    /// Writes `row`'s counters that changed since the last call for this
    /// process; its tracks are created on its first row, and anew when
    /// `key` (pid, starttime) differs from the tracks' (a reused pid).
    pub fn write<W: Write>(
        &mut self,
        w: &mut TraceWriter<W>,
        key: ProcessKey,
        name: &str,
        row: &ProcessCounters,
        ts_boot_ns: u64,
    ) -> Result<(), PerfettoError> {
        let t = match self.tracks.get_mut(&row.tgid) {
            Some(t) if t.key == key => t,
            _ => {
                let mut uuids = Vec::with_capacity(self.counters.len());
                for c in &self.counters {
                    uuids.push(w.process_counter_track(key, name, &c.spec)?);
                }
                let last = vec![-1; uuids.len()];
                self.tracks.insert(row.tgid, Tracks { key, uuids, last });
                self.tracks.get_mut(&row.tgid).expect("just inserted")
            }
        };
        for (i, c) in self.counters.iter().enumerate() {
            let v = (c.value)(row) as i64;
            // Unchanged counters cost nothing in the trace.
            if v != t.last[i] {
                w.write_counter(ts_boot_ns, t.uuids[i], CounterValue::Int(v))?;
                t.last[i] = v;
            }
        }
        Ok(())
    }

    /// The process instance is over; the pid's next user gets new tracks.
    pub fn forget(&mut self, tgid: u32) {
        self.tracks.remove(&tgid);
    }

    /// Whether `tgid` has tracks.
    pub fn has(&self, tgid: u32) -> bool {
        self.tracks.contains_key(&tgid)
    }
}

/// Who a process instance is, from a procfs scan or an exit record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessIdentity {
    pub pid: u32,
    pub ppid: u32,
    pub comm: String,
    /// /proc/<pid>/stat field 22; with pid it identifies the instance.
    pub starttime_ticks: u64,
    /// NUL-separated argv (procfs::cmdline); empty for kernel threads.
    pub cmdline: Arc<str>,
}

impl ProcessIdentity {
    pub fn of(p: &ProcessSample) -> Self {
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
    pub fn from_comm(pid: u32, comm: String) -> Self {
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
    pub fn name(&self) -> &str {
        match name_from_cmdline(&self.cmdline) {
            "" => &self.comm,
            n => n,
        }
    }
}

/// ProcessTree entries: argv, or `[comm]` with `cmdline_is_comm` for
/// kernel threads and processes whose argv was unreadable.
pub fn tree_entries<'a>(
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
