//! What the store persists for each capture, and the names it writes.
//!
//! `<id>.json` holds the caller-visible [`CaptureMeta`] and, flattened beside
//! it, the store's own bookkeeping ([`Stamp`]: the sequence number that
//! orders captures and the instant their age counts from). Metadata written
//! before the stamp existed has neither field and still reads.
//!
//! Ids are `<wall ms>-<seq>-<label>`; [`OwnName`] recognises exactly the file
//! names the store writes, so start-up repair never touches anything else in
//! the directory.

use serde::{Deserialize, Serialize};

/// `TriggerInfo::rule` of captures asked for through the control socket
/// (`vitalsctl capture`, `vitalsctl heap`) rather than fired by a rule.
pub const MANUAL_RULES: &[&str] = &["manual", "manual-heap"];

/// What started a capture.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TriggerInfo {
    /// Rule name, or "manual" for `vitalsctl capture`.
    pub rule: String,
    pub value: Option<f64>,
    pub threshold: Option<f64>,
    pub offender_pid: Option<i32>,
    pub offender_name: Option<String>,
}

impl TriggerInfo {
    /// Asked for by hand ([`MANUAL_RULES`]); eviction makes room for such a
    /// capture from other manual ones first.
    pub fn is_manual(&self) -> bool {
        MANUAL_RULES.contains(&self.rule.as_str())
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CaptureMeta {
    pub id: String,
    pub created_unix_ms: u64,
    pub trigger: TriggerInfo,
    pub duration_ms: u64,
    pub trace_bytes: u64,
    /// "complete", or why the capture ended early (stopped, write error,
    /// "cut: …" when the store cut it).
    pub status: String,
    /// heapprofd's own outcome per process, when a profile was taken.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heapprofd: Option<serde_json::Value>,
    /// The capture backend that recorded it; absent for heap profiles and
    /// metadata written before backends existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend: Option<BackendInfo>,
}

/// Which capture backend recorded a capture, and what that means for it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BackendInfo {
    /// "ebpf" or "perfetto".
    pub name: String,
    /// What the backend gives and lacks (the consumer route, "faults:
    /// counters only", ...).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

/// The instant a capture's age counts from, on both clocks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgeBasis {
    /// Wall clock (CLOCK_REALTIME) at that instant.
    pub unix_ms: u64,
    /// `/proc/sys/kernel/random/boot_id` of the boot `boottime_ms` belongs
    /// to; empty when it could not be read (then only the wall clock counts).
    pub boot_id: String,
    /// CLOCK_BOOTTIME at that instant: immune to wall-clock jumps, counts
    /// through suspend, restarts at each boot.
    pub boottime_ms: u64,
}

/// The store's own fields in `<id>.json`, beside [`CaptureMeta`].
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Stamp {
    /// Store-wide, persisted, increasing: the order of captures (eviction
    /// removes the lowest first). Absent in metadata written before it
    /// existed: such captures sort before all others, by `created_unix_ms`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seq: Option<u64>,
    /// Absent in old and salvaged metadata: the age then counts from
    /// `created_unix_ms` on the wall clock.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub age_basis: Option<AgeBasis>,
    /// A wall-clock jump made the age unknowable: it restarted at the moment
    /// the jump was seen (`age_basis`), instead of expiring the capture.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub age_restarted: bool,
}

impl Stamp {
    /// The age basis, or the creation time on the wall clock alone.
    pub(super) fn basis_or(&self, meta: &CaptureMeta) -> AgeBasis {
        self.age_basis.clone().unwrap_or(AgeBasis {
            unix_ms: meta.created_unix_ms,
            boot_id: String::new(),
            boottime_ms: 0,
        })
    }
}

/// `<id>.json` as written (and as each entry of `index.json`).
#[derive(Debug, Serialize)]
pub(super) struct RecordRef<'a> {
    #[serde(flatten)]
    pub meta: &'a CaptureMeta,
    #[serde(flatten)]
    pub stamp: &'a Stamp,
}

/// `<id>.json` as read.
#[derive(Debug, Deserialize)]
pub(super) struct Record {
    #[serde(flatten)]
    pub meta: CaptureMeta,
    #[serde(flatten)]
    pub stamp: Stamp,
}

/// Sort key: captures without a sequence number (written before it
/// existed) first, by creation time; then by sequence number.
pub(super) fn order_key(meta: &CaptureMeta, stamp: &Stamp) -> (bool, u64, u64, String) {
    (
        stamp.seq.is_some(),
        stamp.seq.unwrap_or(0),
        meta.created_unix_ms,
        meta.id.clone(),
    )
}

/// The longest label kept in an id.
const LABEL_CHARS: usize = 40;

/// The label part of an id: ASCII alphanumerics and `-`, anything else
/// `_`, at most 40 characters.
pub(super) fn label_of(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '_'
            }
        })
        .take(LABEL_CHARS)
        .collect()
}

/// The parts of an id the store made: `<wall ms>-<seq>-<label>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct OwnId {
    pub unix_ms: u64,
    pub seq: u64,
    pub label: String,
}

fn digits(s: &str) -> Option<u64> {
    if s.is_empty() || s.len() > 20 || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// `Some` iff `id` has the shape [`super::Store::begin`] gives ids.
pub(super) fn parse_id(id: &str) -> Option<OwnId> {
    let mut parts = id.splitn(3, '-');
    let unix_ms = digits(parts.next()?)?;
    let seq = digits(parts.next()?)?;
    let label = parts.next()?;
    let label_ok = label.len() <= LABEL_CHARS
        && label
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    label_ok.then(|| OwnId {
        unix_ms,
        seq,
        label: label.to_owned(),
    })
}

pub(super) const INDEX: &str = "index.json";

/// A file name the store writes in its directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum OwnName {
    /// `index.json`.
    Index,
    /// `<id>.json`: a capture's metadata.
    Meta(String),
    /// `<id>.pftrace`: a capture's trace.
    Trace(String),
    /// `.<id>.pftrace.tmp`: a capture being recorded.
    Recording(String),
    /// `<id>.json.tmp`, `index.json.tmp`: metadata being written.
    MetaTmp,
}

/// What `name` is to the store, or `None` for a name it never writes.
pub(super) fn classify(name: &str) -> Option<OwnName> {
    let own = |id: &str| parse_id(id).map(|_| id.to_owned());
    if name == INDEX {
        return Some(OwnName::Index);
    }
    if name == "index.json.tmp" {
        return Some(OwnName::MetaTmp);
    }
    if let Some(id) = name
        .strip_prefix('.')
        .and_then(|n| n.strip_suffix(".pftrace.tmp"))
    {
        return own(id).map(OwnName::Recording);
    }
    if let Some(id) = name.strip_suffix(".json.tmp") {
        return own(id).map(|_| OwnName::MetaTmp);
    }
    if let Some(id) = name.strip_suffix(".json") {
        return own(id).map(OwnName::Meta);
    }
    if let Some(id) = name.strip_suffix(".pftrace") {
        return own(id).map(OwnName::Trace);
    }
    None
}
