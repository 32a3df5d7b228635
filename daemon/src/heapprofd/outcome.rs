//! heapprofd's own verdict on a session, read back from the output trace.
//!
//! heapprofd writes one ProfilePacket.ProcessHeapSamples per (process, heap)
//! per dump, carrying flags for what went wrong: rejected_concurrent (another
//! session already profiles the process), buffer_overran (the shared-memory
//! ring filled and the profile stopped, block_client off), buffer_corrupted
//! (the client wrote garbage into the ring), hit_guardrail (the memory or CPU
//! guardrail stopped it), disconnected (the client went away, usually the
//! process exited), client_error, and stats.unwinding_errors. Dumps carry only
//! pids, so names come from the ProcessTree that linux.process_stats emits.
//!
//! What a profile caught is in its HeapSamples, one per callstack: the
//! sampled allocations (alloc_count) and the bytes they stand for
//! (self_allocated, heapprofd's estimate of all bytes allocated there), and
//! the same for frees. Every dump repeats the totals since profiling began,
//! so only the last dump of each heap is counted (trace_processor's
//! heap_profile_allocation turns successive dumps into deltas, so its sums
//! agree). One dump may be split over several ProfilePackets (`continued`);
//! its parts share the dump's timestamp and are added up.

use std::{
    collections::{BTreeMap, BTreeSet},
    fs, io,
    path::{Path, PathBuf},
};

use prost::Message;
use serde::{Deserialize, Serialize};
use thiserror::Error;

use super::config::{normalize_cmdline, HeapProfileRequest};
use crate::perfetto::protos::{
    profile_packet::{process_heap_samples::ClientError, ProcessHeapSamples},
    trace_packet::Data,
    TracePacket,
};

#[derive(Debug, Error)]
pub enum OutcomeError {
    #[error("reading trace {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("writing capture metadata {path}: {source}")]
    WriteMetadata {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// Something heapprofd reported about a process's profile.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Issue {
    /// Another session already profiled the process; this one got nothing.
    RejectedConcurrent,
    /// The shared-memory ring overran; the profile stopped early.
    BufferOverran,
    BufferCorrupted,
    /// heapprofd's memory/CPU guardrail stopped profiling.
    HitGuardrail,
    /// The client disconnected (the process exited or crashed).
    Disconnected,
    /// The client reported an error (timeout, invalid stack bounds).
    ClientError,
    /// Some samples could not be unwound; their stacks are truncated.
    UnwindingErrors,
}

/// Outcome for one profiled process (all its heaps and dumps merged).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessOutcome {
    pub pid: u64,
    /// Normalised cmdline from the trace's ProcessTree, if it had one.
    pub name: Option<String>,
    pub heaps: Vec<String>,
    /// Dumps seen (per heap; one dump split over packets counts once).
    pub dumps: u32,
    /// Distinct callstacks in the last dump of each heap.
    pub callstacks: u64,
    /// Sampled allocations in the profile (last dump of each heap): the
    /// allocations heapprofd caught, not every malloc of the process.
    pub allocations: u64,
    /// Bytes allocated as heapprofd estimates them from its samples.
    pub allocated_bytes: u64,
    /// Sampled frees, and the bytes they stand for.
    pub frees: u64,
    pub freed_bytes: u64,
    pub from_startup: bool,
    pub issues: Vec<Issue>,
    pub client_error: Option<String>,
    /// Highest of the cumulative per-dump counters.
    pub unwinding_errors: u64,
    pub heap_samples: u64,
    /// The interval heapprofd actually used (adaptive sampling may raise it)
    /// and the one requested.
    pub sampling_interval_bytes: Option<u64>,
    pub orig_sampling_interval_bytes: Option<u64>,
}

impl ProcessOutcome {
    /// Allocated and not freed by the end of the profile (estimate).
    pub fn unreleased_bytes(&self) -> u64 {
        self.allocated_bytes.saturating_sub(self.freed_bytes)
    }

    /// A usable profile: something was recorded and nothing cut it short.
    /// Unwinding errors alone leave a usable (partly truncated) profile.
    pub fn usable(&self) -> bool {
        self.dumps > 0
            && !self.issues.iter().any(|i| {
                matches!(
                    i,
                    Issue::RejectedConcurrent | Issue::BufferCorrupted | Issue::BufferOverran
                )
            })
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum TargetStatus {
    Profiled { pids: Vec<u64> },
    NoProfile { likely_causes: Vec<String> },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TargetOutcome {
    /// "name:<cmdline>" or "pid:<n>", as the rate limiter keys it.
    pub target: String,
    pub status: TargetStatus,
}

/// Everything read back from one output trace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct TraceOutcome {
    pub packets: u64,
    /// Bytes at the end that were not a whole packet (client killed mid-write).
    pub torn_tail_bytes: u64,
    pub processes: Vec<ProcessOutcome>,
    pub targets: Vec<TargetOutcome>,
}

impl TraceOutcome {
    pub fn all_targets_profiled(&self) -> bool {
        !self.targets.is_empty()
            && self
                .targets
                .iter()
                .all(|t| matches!(t.status, TargetStatus::Profiled { .. }))
    }
}

/// Decodes a trace packet by packet, stopping at the first record that is not
/// a whole `Trace.packet` (a client killed mid-write leaves a torn tail; every
/// whole-packet prefix is still a valid trace).
fn packets(bytes: &[u8]) -> (Vec<TracePacket>, u64) {
    let mut out = Vec::new();
    let mut buf = bytes;
    while !buf.is_empty() {
        let before = buf;
        let Ok(key) = prost::encoding::decode_varint(&mut buf) else {
            return (out, before.len() as u64);
        };
        // Field 1, wire type 2 (length-delimited).
        if key != (1 << 3 | 2) {
            return (out, before.len() as u64);
        }
        let Ok(len) = prost::encoding::decode_varint(&mut buf) else {
            return (out, before.len() as u64);
        };
        let Ok(len) = usize::try_from(len) else {
            return (out, before.len() as u64);
        };
        if len > buf.len() {
            return (out, before.len() as u64);
        }
        match TracePacket::decode(&buf[..len]) {
            Ok(p) => out.push(p),
            Err(_) => return (out, before.len() as u64),
        }
        buf = &buf[len..];
    }
    (out, 0)
}

/// Which dump of a heap a ProcessHeapSamples belongs to: its timestamp, or,
/// for a writer that sets none, its position (each record its own dump).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum DumpKey {
    At(u64),
    Untimed(u32),
}

/// One heap's totals in one dump (cumulative since profiling began).
#[derive(Debug, Default, Clone, Copy)]
struct DumpTotals {
    callstacks: u64,
    allocations: u64,
    allocated_bytes: u64,
    frees: u64,
    freed_bytes: u64,
}

impl DumpTotals {
    fn add(&mut self, d: &ProcessHeapSamples) {
        self.callstacks += d.samples.len() as u64;
        for s in &d.samples {
            self.allocations += s.alloc_count();
            self.allocated_bytes += s.self_allocated();
            self.frees += s.free_count();
            self.freed_bytes += s.self_freed();
        }
    }
}

#[derive(Default)]
struct Acc {
    heaps: BTreeSet<String>,
    /// Per (heap, dump): that dump's totals.
    dumps: BTreeMap<(String, DumpKey), DumpTotals>,
    untimed: u32,
    from_startup: bool,
    issues: BTreeSet<Issue>,
    client_error: Option<String>,
    unwinding_errors: u64,
    heap_samples: u64,
    sampling_interval_bytes: Option<u64>,
    orig_sampling_interval_bytes: Option<u64>,
}

impl Acc {
    fn add(&mut self, d: &ProcessHeapSamples) {
        let key = match d.timestamp {
            Some(ts) => DumpKey::At(ts),
            None => {
                self.untimed += 1;
                DumpKey::Untimed(self.untimed)
            }
        };
        let heap = d.heap_name.clone().unwrap_or_default();
        self.dumps.entry((heap, key)).or_default().add(d);
        if let Some(h) = &d.heap_name {
            self.heaps.insert(h.clone());
        }
        self.from_startup |= d.from_startup();
        let flags = [
            (d.rejected_concurrent(), Issue::RejectedConcurrent),
            (d.buffer_overran(), Issue::BufferOverran),
            (d.buffer_corrupted(), Issue::BufferCorrupted),
            (d.hit_guardrail(), Issue::HitGuardrail),
            (d.disconnected(), Issue::Disconnected),
        ];
        for (set, issue) in flags {
            if set {
                self.issues.insert(issue);
            }
        }
        if let Some(e) = d.client_error {
            if e != ClientError::None as i32 {
                self.issues.insert(Issue::ClientError);
                self.client_error = Some(
                    ClientError::try_from(e)
                        .map(|c| c.as_str_name().to_owned())
                        .unwrap_or_else(|_| format!("CLIENT_ERROR_{e}")),
                );
            }
        }
        if let Some(s) = &d.stats {
            // Stats are cumulative over the session, so a later dump's
            // values include the earlier ones: take the maximum.
            self.unwinding_errors = self.unwinding_errors.max(s.unwinding_errors());
            self.heap_samples = self.heap_samples.max(s.heap_samples());
        }
        if self.unwinding_errors > 0 {
            self.issues.insert(Issue::UnwindingErrors);
        }
        if d.sampling_interval_bytes.is_some() {
            self.sampling_interval_bytes = d.sampling_interval_bytes;
        }
        if d.orig_sampling_interval_bytes.is_some() {
            self.orig_sampling_interval_bytes = d.orig_sampling_interval_bytes;
        }
    }

    /// The last dump of every heap, added up: the profile's totals.
    fn totals(&self) -> DumpTotals {
        let mut last: BTreeMap<&str, DumpTotals> = BTreeMap::new();
        // Keys are ordered by heap, then dump: the last one written wins.
        for ((heap, _), t) in &self.dumps {
            last.insert(heap, *t);
        }
        let mut sum = DumpTotals::default();
        for t in last.values() {
            sum.callstacks += t.callstacks;
            sum.allocations += t.allocations;
            sum.allocated_bytes += t.allocated_bytes;
            sum.frees += t.frees;
            sum.freed_bytes += t.freed_bytes;
        }
        sum
    }

    fn into_outcome(self, pid: u64, name: Option<String>) -> ProcessOutcome {
        let t = self.totals();
        ProcessOutcome {
            pid,
            name,
            heaps: self.heaps.into_iter().collect(),
            dumps: self.dumps.len() as u32,
            callstacks: t.callstacks,
            allocations: t.allocations,
            allocated_bytes: t.allocated_bytes,
            frees: t.frees,
            freed_bytes: t.freed_bytes,
            from_startup: self.from_startup,
            issues: self.issues.into_iter().collect(),
            client_error: self.client_error,
            unwinding_errors: self.unwinding_errors,
            heap_samples: self.heap_samples,
            sampling_interval_bytes: self.sampling_interval_bytes,
            orig_sampling_interval_bytes: self.orig_sampling_interval_bytes,
        }
    }
}

/// Reads heapprofd's per-process outcome from `trace` and matches it to the
/// request's targets.
pub fn read_outcome(
    trace: &Path,
    request: &HeapProfileRequest,
) -> Result<TraceOutcome, OutcomeError> {
    let bytes = fs::read(trace).map_err(|source| OutcomeError::Read {
        path: trace.to_owned(),
        source,
    })?;
    Ok(outcome_from_bytes(&bytes, request))
}

pub fn outcome_from_bytes(bytes: &[u8], request: &HeapProfileRequest) -> TraceOutcome {
    let (packets, torn) = packets(bytes);
    if torn > 0 {
        log::warn!("heap profile trace ends in {torn} bytes that are not a whole packet");
    }
    let mut names: BTreeMap<u64, String> = BTreeMap::new();
    let mut by_pid: BTreeMap<u64, Acc> = BTreeMap::new();
    for p in &packets {
        match &p.data {
            Some(Data::ProcessTree(tree)) => {
                for proc in &tree.processes {
                    if let (Some(pid), Some(first)) = (proc.pid, proc.cmdline.first()) {
                        names.insert(pid as u64, normalize_cmdline(first).to_owned());
                    }
                }
            }
            Some(Data::ProfilePacket(pp)) => {
                for d in &pp.process_dumps {
                    by_pid.entry(d.pid()).or_default().add(d);
                }
            }
            _ => {}
        }
    }
    let processes: Vec<ProcessOutcome> = by_pid
        .into_iter()
        .map(|(pid, a)| a.into_outcome(pid, names.get(&pid).cloned()))
        .collect();

    let single_target = request.process_names.len() + request.pids.len() == 1;
    let mut targets = Vec::new();
    for name in &request.process_names {
        // heapprofd only profiles processes the config selects, so with a
        // single target every dump is that target's even if the ProcessTree
        // missed the process.
        let pids: Vec<u64> = processes
            .iter()
            .filter(|p| {
                p.name.as_deref() == Some(name.as_str()) || (single_target && p.name.is_none())
            })
            .map(|p| p.pid)
            .collect();
        let status = if pids.is_empty() {
            TargetStatus::NoProfile {
                likely_causes: causes_for_name(name, &names, request),
            }
        } else {
            TargetStatus::Profiled { pids }
        };
        targets.push(TargetOutcome {
            target: format!("name:{name}"),
            status,
        });
    }
    for &pid in &request.pids {
        let status = if processes.iter().any(|p| p.pid == pid) {
            TargetStatus::Profiled { pids: vec![pid] }
        } else {
            TargetStatus::NoProfile {
                likely_causes: causes_for_pid(pid, &names),
            }
        };
        targets.push(TargetOutcome {
            target: format!("pid:{pid}"),
            status,
        });
    }
    TraceOutcome {
        packets: packets.len() as u64,
        torn_tail_bytes: torn,
        processes,
        targets,
    }
}

const NOT_PROFILEABLE: &str = "not profileable: on a user build heapprofd only profiles apps \
     marked profileable or debuggable, never native system processes; on userdebug check \
     SELinux denials for heapprofd";

fn causes_for_name(
    name: &str,
    seen: &BTreeMap<u64, String>,
    request: &HeapProfileRequest,
) -> Vec<String> {
    let mut causes = Vec::new();
    if seen.is_empty() {
        // No ProcessTree at all: we cannot tell running from not running.
        causes.push(format!(
            "not running: no process named {name:?} (and no process list in the trace to check)"
        ));
        causes.push(NOT_PROFILEABLE.to_owned());
    } else if seen.values().any(|n| n == name) {
        causes.push(NOT_PROFILEABLE.to_owned());
    } else {
        causes.push(format!(
            "not running: no process with normalised cmdline {name:?} in the trace's process list"
        ));
        let similar: BTreeSet<&str> = seen
            .values()
            .map(String::as_str)
            .filter(|n| !n.is_empty() && (n.contains(name) || name.contains(n)))
            .collect();
        if !similar.is_empty() {
            causes.push(format!(
                "name mismatch: heapprofd matches the normalised cmdline exactly; similar names \
                 running: {similar:?}"
            ));
        } else {
            causes.push(
                "name mismatch: heapprofd matches the normalised cmdline (basename of argv[0], \
                 cut at '@') exactly, not the comm or a prefix"
                    .to_owned(),
            );
        }
    }
    if request.no_startup {
        causes
            .push("no_startup is set, so a process started during the session was skipped".into());
    }
    if request.no_running {
        causes.push("no_running is set, so an already-running process was skipped".into());
    }
    if !request.target_installed_by.is_empty() {
        causes.push(format!(
            "target_installed_by {:?} excluded it",
            request.target_installed_by
        ));
    }
    causes
}

fn causes_for_pid(pid: u64, seen: &BTreeMap<u64, String>) -> Vec<String> {
    if !seen.is_empty() && !seen.contains_key(&pid) {
        vec![format!(
            "not running: pid {pid} is not in the trace's process list"
        )]
    } else {
        vec![
            format!("pid {pid} may have exited before heapprofd attached"),
            NOT_PROFILEABLE.to_owned(),
        ]
    }
}

/// The metadata file kept beside a capture: `<trace>.meta.json`.
pub fn metadata_path(trace: &Path) -> PathBuf {
    let mut p = trace.as_os_str().to_owned();
    p.push(".meta.json");
    PathBuf::from(p)
}

/// Writes `meta` as pretty JSON to `<trace>.meta.json` (via a temporary file
/// and rename, so readers never see half a file). The capture store will
/// call this for its index; until it exists, the CLI does.
pub fn write_metadata<T: Serialize>(trace: &Path, meta: &T) -> Result<PathBuf, OutcomeError> {
    let path = metadata_path(trace);
    let err = |source| OutcomeError::WriteMetadata {
        path: path.clone(),
        source,
    };
    let json = serde_json::to_vec_pretty(meta).map_err(|e| err(e.into()))?;
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    fs::write(&tmp, json).map_err(err)?;
    fs::rename(&tmp, &path).map_err(err)?;
    Ok(path)
}
