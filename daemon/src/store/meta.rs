//! What the store persists for each capture, and the names it writes.
//!
//! `<id>.json` holds the caller-visible [`EntryMeta`] and, flattened beside
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
pub struct EntryMeta {
    pub id: String,
    pub created_unix_ms: u64,
    pub trigger: TriggerInfo,
    pub duration_ms: u64,
    pub trace_bytes: u64,
    /// How the recording ended: complete, or why it ended early. Written
    /// as the text it has always been (`"complete"`, `"cut: …"`).
    pub status: EntryStatus,
    /// heapprofd's own outcome per process, when a profile was taken.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heapprofd: Option<serde_json::Value>,
    /// The capture backend that recorded it; absent for heap profiles and
    /// metadata written before backends existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend: Option<BackendInfo>,
}

/// How a stored entry's recording ended. In `<id>.json`, `vitalsctl list`
/// and `--json` it is the text it has always been (the variants' docs
/// quote it); text this daemon does not write reads as [`Self::Other`],
/// so metadata of any version loads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EntryStatus {
    /// `complete`: recorded for its whole window.
    Complete,
    /// `stopped by daemon shutdown`: ended early, kept.
    StoppedByShutdown,
    /// `cut: reached store.max_capture_bytes (N bytes)`: the recording
    /// stopped itself at the per-capture limit, `at_bytes` written.
    CutAtLimit { at_bytes: u64 },
    /// `[<before>; ]cut: over the store's per-capture limit of N bytes`:
    /// the store cut the trace at the last whole packet under the limit
    /// when committing it; `before` is how the recording itself ended,
    /// when that was not complete.
    CutByStore {
        limit_bytes: u64,
        before: Option<Box<EntryStatus>>,
    },
    /// `cut short: <error>`: the recording failed part-way; the whole
    /// packets that reached the disk are kept.
    CutShort { error: String },
    /// `cut: daemon crashed`: the daemon died during the recording; its
    /// whole packets were kept at the next start.
    Crashed,
    /// `recovered: metadata unreadable, rebuilt from the trace`.
    Recovered,
    /// `heapprofd: <session status as JSON>`: a heap profile whose session
    /// did not complete (its `heapprofd` field has the whole report).
    HeapprofdIncomplete { session: String },
    /// Any other text (written by another version of vitalsd), kept as is.
    Other(String),
}

const COMPLETE: &str = "complete";
const STOPPED_BY_SHUTDOWN: &str = "stopped by daemon shutdown";
const CRASHED: &str = "cut: daemon crashed";
const RECOVERED: &str = "recovered: metadata unreadable, rebuilt from the trace";
const CUT_SHORT: &str = "cut short: ";
const HEAPPROFD: &str = "heapprofd: ";
const AT_LIMIT: (&str, &str) = ("cut: reached store.max_capture_bytes (", " bytes)");
const BY_STORE: (&str, &str) = ("cut: over the store's per-capture limit of ", " bytes");

impl EntryStatus {
    /// Recorded for its whole window.
    pub fn is_complete(&self) -> bool {
        *self == Self::Complete
    }

    /// `self`, then cut by the store at `limit_bytes`.
    pub fn cut_by_store(self, limit_bytes: u64) -> Self {
        let before = (!self.is_complete()).then(|| Box::new(self));
        Self::CutByStore {
            limit_bytes,
            before,
        }
    }

    /// Reads the text the store writes; never fails (see [`Self::Other`]).
    pub fn parse(s: &str) -> Self {
        let within = |(head, tail): (&str, &str)| {
            s.strip_prefix(head)?
                .strip_suffix(tail)?
                .parse::<u64>()
                .ok()
        };
        match s {
            COMPLETE => return Self::Complete,
            STOPPED_BY_SHUTDOWN => return Self::StoppedByShutdown,
            CRASHED => return Self::Crashed,
            RECOVERED => return Self::Recovered,
            _ => {}
        }
        if let Some(at_bytes) = within(AT_LIMIT) {
            return Self::CutAtLimit { at_bytes };
        }
        // The store's cut comes last, after what the recording said.
        if let Some(at) = s.rfind(BY_STORE.0) {
            let (before, cut) = s.split_at(at);
            let before = match before.strip_suffix("; ") {
                Some(b) => Some(Box::new(Self::parse(b))),
                None if before.is_empty() => None,
                None => return Self::Other(s.to_owned()),
            };
            if let Some(limit_bytes) = cut
                .strip_prefix(BY_STORE.0)
                .and_then(|c| c.strip_suffix(BY_STORE.1))
                .and_then(|n| n.parse().ok())
            {
                return Self::CutByStore {
                    limit_bytes,
                    before,
                };
            }
        }
        if let Some(error) = s.strip_prefix(CUT_SHORT) {
            return Self::CutShort {
                error: error.to_owned(),
            };
        }
        if let Some(session) = s.strip_prefix(HEAPPROFD) {
            return Self::HeapprofdIncomplete {
                session: session.to_owned(),
            };
        }
        Self::Other(s.to_owned())
    }
}

impl std::fmt::Display for EntryStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Complete => f.write_str(COMPLETE),
            Self::StoppedByShutdown => f.write_str(STOPPED_BY_SHUTDOWN),
            Self::CutAtLimit { at_bytes } => {
                write!(f, "{}{at_bytes}{}", AT_LIMIT.0, AT_LIMIT.1)
            }
            Self::CutByStore {
                limit_bytes,
                before,
            } => {
                if let Some(b) = before {
                    write!(f, "{b}; ")?;
                }
                write!(f, "{}{limit_bytes}{}", BY_STORE.0, BY_STORE.1)
            }
            Self::CutShort { error } => write!(f, "{CUT_SHORT}{error}"),
            Self::Crashed => f.write_str(CRASHED),
            Self::Recovered => f.write_str(RECOVERED),
            Self::HeapprofdIncomplete { session } => write!(f, "{HEAPPROFD}{session}"),
            Self::Other(s) => f.write_str(s),
        }
    }
}

impl Serialize for EntryStatus {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for EntryStatus {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = std::borrow::Cow::<'de, str>::deserialize(d)?;
        Ok(Self::parse(&s))
    }
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

/// The store's own fields in `<id>.json`, beside [`EntryMeta`].
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
    pub(super) fn basis_or(&self, meta: &EntryMeta) -> AgeBasis {
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
    pub meta: &'a EntryMeta,
    #[serde(flatten)]
    pub stamp: &'a Stamp,
}

/// `<id>.json` as read.
#[derive(Debug, Deserialize)]
pub(super) struct Record {
    #[serde(flatten)]
    pub meta: EntryMeta,
    #[serde(flatten)]
    pub stamp: Stamp,
}

/// Sort key: captures without a sequence number (written before it
/// existed) first, by creation time; then by sequence number.
pub(super) fn order_key(meta: &EntryMeta, stamp: &Stamp) -> (bool, u64, u64, String) {
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
