//! The control protocol's messages: every request and every reply, typed,
//! serialized by the daemon and deserialized by `vitalsctl` (and tests).
//!
//! A request is `{"cmd": ...}` ([`Request`]); its answer is one
//! [`Response`] frame whose `result` is the reply type named beside each
//! request below. The JSON field names here are the ones `vitalsctl --json`
//! prints: renaming a field is a change users see (README).

use std::{
    collections::{BTreeMap, VecDeque},
    path::PathBuf,
};

use serde::{Deserialize, Serialize};

pub use super::outcome::TriggerOutcome;
use crate::store::StoreCounters;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "snake_case", deny_unknown_fields)]
pub enum Request {
    // Empty-brace variants, not unit ones: serde ignores unknown fields of
    // unit variants in an internally tagged enum, and a request with a
    // stray key must be an error.
    /// Replies [`Status`].
    Status {},
    /// Replies [`TopReply`].
    Top {
        #[serde(default = "default_top")]
        n: usize,
    },
    /// Start a capture now. Replies [`Started`].
    Capture {
        #[serde(default = "default_capture_s")]
        duration_s: f64,
        #[serde(default)]
        sched: bool,
        #[serde(default)]
        faults: bool,
        /// Off-CPU stacks of the watched processes (issue #24); absent:
        /// none. Needs `sched`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        offcpu: Option<OffcpuAsk>,
    },
    /// A heapprofd profile of a process (by name and/or pid), stored as a
    /// capture. Replies [`Started`].
    Heap {
        #[serde(default)]
        name: Option<String>,
        #[serde(default)]
        pid: Option<u64>,
        #[serde(default = "default_heap_s")]
        duration_s: f64,
    },
    /// Replies the store's entries, `Vec<EntryMeta>`.
    List {},
    /// Replies [`ExportHead`], then streams the trace's bytes.
    Export { id: String },
    /// Replies [`Deleted`].
    Delete { id: String },
    /// Replies [`ConfigReply`].
    Config {},
    /// A bugreport section: status, recent triggers, store summary.
    /// Replies [`DumpReply`].
    Dump {},
}

/// `capture`'s `offcpu`: `{}` watches the processes `capture.offcpu_watch`
/// names (or every thread with `capture.offcpu_watch_all`); `pids` adds
/// these processes.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OffcpuAsk {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pids: Vec<u32>,
}

impl OffcpuAsk {
    /// What the request itself gets wrong, before the daemon looks at its
    /// config (`capture.offcpu_watch`).
    pub fn check(&self, sched: bool) -> Result<(), String> {
        let max = vitals_common::capture::OFFCPU_WATCH_MAX_TGIDS as usize;
        if !sched {
            return Err(
                "offcpu needs sched: true (the blocks are cut from the CPU timeline's \
                        sched_switch and sched_waking records)"
                    .into(),
            );
        }
        if self.pids.contains(&0) {
            return Err("offcpu.pids: 0 is not a process (pid 0 is the idle task)".into());
        }
        if self.pids.len() > max {
            return Err(format!("offcpu.pids: at most {max} processes"));
        }
        Ok(())
    }
}

fn default_top() -> usize {
    15
}

fn default_heap_s() -> f64 {
    30.0
}

fn default_capture_s() -> f64 {
    10.0
}

/// The one answer frame of every request: `{"ok": true, "result": T}` or
/// `{"ok": false, "error": "..."}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Response<T> {
    pub ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<T>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl<T> Response<T> {
    pub fn ok(result: T) -> Self {
        Self {
            ok: true,
            result: Some(result),
            error: None,
        }
    }

    pub fn err(e: impl std::fmt::Display) -> Self {
        Self {
            ok: false,
            result: None,
            error: Some(e.to_string()),
        }
    }
}

/// An answer with nothing but an error to say, whatever was asked.
pub type Refusal = Response<()>;

/// One row of `top`: eBPF and procfs figures of a process over the last window.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TopRow {
    pub pid: i32,
    pub name: String,
    pub core_equivalent_pct: f64,
    pub machine_share_pct: f64,
    pub minflt: u64,
    pub majflt: u64,
    pub rss_kb: Option<u64>,
    /// The eBPF figures of the same window; None on a process's first
    /// window (no delta yet) or when the maps could not be read.
    pub ebpf: Option<TopEbpf>,
    /// Off-CPU figures of the same window; None when off-CPU accounting
    /// is off or on a process's first window.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offcpu: Option<TopOffcpu>,
}

/// Off-CPU per-window figures of one process (`sources::offcpu`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TopOffcpu {
    /// Blocked in S (TASK_INTERRUPTIBLE), ended by a wakeup in the window.
    pub blocked_s_ms: f64,
    /// Blocked in D (TASK_UNINTERRUPTIBLE, not TASK_IDLE).
    pub blocked_d_ms: f64,
    /// Blocks of at least `sampling.long_block`.
    pub long_blocks: u64,
}

/// eBPF per-window figures of one process.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TopEbpf {
    pub oncpu_ms: f64,
    pub runq_wait_ms: f64,
    pub voluntary_switches: u64,
    pub involuntary_switches: u64,
}

/// The answer to `top`: the machine's figures and the busiest processes.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TopReply {
    pub local_busy_pct: Option<f64>,
    pub loadavg: Option<[f32; 3]>,
    /// The measured length of the window the rows' per-task figures
    /// (`ebpf`: on-CPU, runqueue wait, switches) cover; a late tick makes
    /// it longer than `interval_ms`. Absent without those figures.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window_ms: Option<f64>,
    pub processes: Vec<TopRow>,
}

/// A capture or heap profile running now.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RecordingProgress {
    pub id: String,
    pub rule: String,
    pub started_unix_ms: u64,
    pub duration_ms: u64,
    /// The capture backend ("ebpf", "perfetto"); empty for heap profiles.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub backend: String,
}

/// A rule that fired (or a manual request), and what came of it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TriggerRecord {
    pub unix_ms: u64,
    pub rule: String,
    pub value: Option<f64>,
    pub threshold: Option<f64>,
    pub offender: Option<String>,
    /// "captured <id>", "failed: …", …: the text it has always been.
    pub outcome: TriggerOutcome,
}

/// What the daemon's main loop publishes: most of `status`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct DaemonStatus {
    pub version: String,
    pub started_unix_ms: u64,
    pub samples: u64,
    pub interval_ms: u64,
    pub fault_source: String,
    /// "ebpf", or "proc-only (bpf denied: …)" / "proc-only (asked for …)".
    pub accounting: String,
    /// The tier the always-on accounting runs in ("ebpf", "cts", "ticks";
    /// `accounting::Tier`) and what it gives.
    pub tier: String,
    pub tier_gives: String,
    /// The procfs scheduler source's counters (the CTS tier); empty in
    /// the others.
    pub sched_procfs: BTreeMap<String, u64>,
    /// The backend a capture started now runs on (`capture.backend`
    /// resolved against the accounting): "ebpf" or "perfetto".
    pub capture_backend: String,
    pub capabilities: String,
    pub local_busy_pct: Option<f64>,
    pub loadavg: Option<[f32; 3]>,
    pub top: Vec<TopRow>,
    /// `TopReply::window_ms` of `top`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_window_ms: Option<f64>,
    pub capture: Option<RecordingProgress>,
    pub heap_session: Option<RecordingProgress>,
    pub recent_triggers: VecDeque<TriggerRecord>,
    pub triggers_fired: u64,
    pub triggers_skipped: BTreeMap<String, u64>,
    /// Manual captures and heap profiles refused, by reason.
    pub manual_refused: BTreeMap<String, u64>,
    pub bpf_drops: BTreeMap<String, u64>,
    /// Samples skipped because a read failed, by source.
    pub sample_errors: BTreeMap<String, u64>,
    pub procfs_drops: BTreeMap<String, u64>,
    /// Off-CPU accounting's settings and failed deletes; absent while off.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub offcpu: BTreeMap<String, u64>,
    /// The last window's busiest (wakee, waker) process pairs:
    /// "wakee<-waker.wakeups" and ".blocked_us" (`irq`: tgid 0).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub offcpu_wakers: BTreeMap<String, u64>,
    pub history_samples: usize,
    /// The Perfetto producer's counters (reconnects, sessions, drops);
    /// empty when it is not running.
    pub producer: BTreeMap<String, u64>,
    /// Its last error (a session's bad data source config), or why it
    /// is not running (not started: /proc-only, or registering failed).
    pub producer_error: Option<String>,
    pub config_path: String,
    pub last_reload_error: Option<String>,
}

impl DaemonStatus {
    /// The answer to `top` from the published rows: the first `n`.
    pub fn top_reply(&self, n: usize) -> TopReply {
        TopReply {
            local_busy_pct: self.local_busy_pct,
            loadavg: self.loadavg,
            window_ms: self.top_window_ms,
            processes: self.top.iter().take(n).cloned().collect(),
        }
    }
}

/// The answer to `status`: the daemon's published state, the control
/// socket's counters and the store's summary.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Status {
    #[serde(flatten)]
    pub daemon: DaemonStatus,
    pub control: ControlCounts,
    pub store: StoreSummary,
}

/// The control socket's counters (`control::server::ControlCounters`, read).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ControlCounts {
    pub connections: u64,
    pub refused_uid: u64,
    /// Connections closed for sending no request (idle past the timeout,
    /// or evicted to make room for a new connection).
    pub idle_closed: u64,
    /// Connections refused because every slot in the way was busy.
    pub refused_full: u64,
    pub bad_requests: u64,
    pub oversized_requests: u64,
    /// Requests refused on an open connection whose uid a reload removed
    /// from `allowed_uids` (the connection is then closed).
    pub refused_uid_revoked: u64,
    /// accept() failures (EMFILE, ENFILE, ...), retried after a pause.
    pub accept_errors: u64,
    /// Connections dropped because the peer read nothing for `WRITE_TIMEOUT`.
    pub write_timeouts: u64,
    /// Accepted connections open now, and the most allowed (the fd budget).
    pub open_connections: u64,
    pub max_open_connections: u64,
    /// Peer-caused log lines (refused uids, accept errors) held back: at
    /// most one is logged per kind a minute.
    pub log_lines_suppressed: u64,
}

/// The store in `status`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StoreSummary {
    pub dir: PathBuf,
    pub captures: usize,
    pub bytes: u64,
    pub newest: Option<String>,
    pub newest_path: Option<PathBuf>,
    pub heapprofd_bytes: u64,
    pub counters: StoreCounters,
}

/// The answer to `capture` and `heap`: the id the entry will be stored as.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Started {
    pub id: String,
}

/// The answer to `delete`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Deleted {
    pub deleted: String,
}

/// The answer to `config`: the effective config as TOML.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConfigReply {
    pub path: String,
    pub toml: String,
}

/// The answer to `dump`: the bugreport section's text.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DumpReply {
    pub text: String,
}

/// The answer to `export`, before exactly `bytes` bytes of trace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExportHead {
    pub id: String,
    pub bytes: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_round_trip_and_reject_unknown() {
        let r: Request =
            serde_json::from_str(r#"{"cmd":"capture","duration_s":2,"sched":true}"#).unwrap();
        assert_eq!(
            r,
            Request::Capture {
                duration_s: 2.0,
                sched: true,
                faults: false,
                offcpu: None,
            }
        );
        assert!(serde_json::from_str::<Request>(r#"{"cmd":"reboot"}"#).is_err());
        assert!(serde_json::from_str::<Request>(r#"{"cmd":"list","x":1}"#).is_err());
        assert_eq!(
            serde_json::from_str::<Request>(r#"{"cmd":"top"}"#).unwrap(),
            Request::Top { n: 15 }
        );
    }

    /// The status fields as today's daemon writes them (the keys
    /// `vitalsctl --json status` prints): a reply of that shape reads, and
    /// writes back with the same keys.
    #[test]
    fn status_keeps_its_field_names() {
        let status = Status {
            daemon: DaemonStatus {
                capture: Some(RecordingProgress {
                    id: "1-1-manual".into(),
                    rule: "manual".into(),
                    ..Default::default()
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        let v = serde_json::to_value(&status).unwrap();
        let keys: Vec<&str> = v.as_object().unwrap().keys().map(|k| k.as_str()).collect();
        assert_eq!(
            keys,
            [
                "accounting",
                "bpf_drops",
                "capabilities",
                "capture",
                "capture_backend",
                "config_path",
                "control",
                "fault_source",
                "heap_session",
                "history_samples",
                "interval_ms",
                "last_reload_error",
                "loadavg",
                "local_busy_pct",
                "manual_refused",
                "procfs_drops",
                "producer",
                "producer_error",
                "recent_triggers",
                "sample_errors",
                "samples",
                "sched_procfs",
                "started_unix_ms",
                "store",
                "tier",
                "tier_gives",
                "top",
                "triggers_fired",
                "triggers_skipped",
                "version",
            ]
        );
        // A heap profile's progress has no backend: the key is absent.
        assert!(v["capture"].get("backend").is_none(), "{v}");
        let back: Status = serde_json::from_value(v).unwrap();
        assert_eq!(back, status);
    }

    #[test]
    fn an_error_reply_reads_as_any_reply() {
        let wire = serde_json::to_vec(&Refusal::err("uid 7 is not allowed")).unwrap();
        assert_eq!(wire, br#"{"ok":false,"error":"uid 7 is not allowed"}"#);
        let r: Response<Status> = serde_json::from_slice(&wire).unwrap();
        assert_eq!((r.ok, r.result), (false, None));
    }

    /// `vitalsctl capture` with neither `--sched` nor `--faults` sends a
    /// request naming neither: no events (a counters-only recording).
    #[test]
    fn a_capture_request_naming_neither_switches_no_events_on() {
        let r: Request = serde_json::from_str(r#"{"cmd":"capture"}"#).unwrap();
        let Request::Capture { sched, faults, .. } = r else {
            panic!("not a capture request: {r:?}");
        };
        assert_eq!(
            crate::event_set::EventSet { sched, faults },
            crate::event_set::EventSet::NONE
        );
    }

    /// `offcpu` is an object with `pids` only; a request the daemon could
    /// not act on is refused before it reaches the main loop.
    #[test]
    fn an_offcpu_capture_request_is_checked() {
        let parse = |s: &str| serde_json::from_str::<Request>(s);
        let Request::Capture { offcpu, sched, .. } =
            parse(r#"{"cmd":"capture","sched":true,"offcpu":{"pids":[42,7]}}"#).unwrap()
        else {
            panic!("not a capture");
        };
        let ask = offcpu.unwrap();
        assert_eq!(ask.pids, vec![42, 7]);
        assert_eq!(ask.check(sched), Ok(()));
        let Request::Capture { offcpu, .. } =
            parse(r#"{"cmd":"capture","sched":true,"offcpu":{}}"#).unwrap()
        else {
            panic!("not a capture");
        };
        assert_eq!(offcpu, Some(OffcpuAsk::default()));
        // Malformed: the daemon never sees these.
        for bad in [
            r#"{"cmd":"capture","offcpu":true}"#,
            r#"{"cmd":"capture","offcpu":{"pid":3}}"#,
            r#"{"cmd":"capture","offcpu":{"pids":[-1]}}"#,
            r#"{"cmd":"capture","offcpu":{"pids":"3"}}"#,
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
        let e = OffcpuAsk { pids: vec![3] }.check(false).unwrap_err();
        assert!(e.contains("needs sched"), "{e}");
        let e = OffcpuAsk { pids: vec![0] }.check(true).unwrap_err();
        assert!(e.contains("pid 0"), "{e}");
        let many = OffcpuAsk {
            pids: (1..=65).collect(),
        };
        assert!(many.check(true).unwrap_err().contains("at most 64"));
        // Absent from the wire when off: older daemons read the request.
        let wire = serde_json::to_string(&Request::Capture {
            duration_s: 1.0,
            sched: true,
            faults: false,
            offcpu: None,
        })
        .unwrap();
        assert!(!wire.contains("offcpu"), "{wire}");
    }
}
