//! The bounded on-device capture store.
//!
//! Layout of the spool directory:
//! - `<id>.pftrace`: a finished trace, mode 0640;
//! - `<id>.json`: its metadata (trigger, rule values, times, sizes,
//!   heapprofd outcome), the source of truth: a capture exists iff both exist;
//! - `.<id>.pftrace.tmp`: a capture being written;
//! - `index.json`: the metadata of every capture, rewritten atomically after
//!   each change, a convenience for readers; rebuilt from `<id>.json` files
//!   at every start.
//!
//! Commit order: trace fsync, rename; metadata written to a temporary name,
//! fsync, rename; directory fsync. A kill -9 at any point leaves either no
//! metadata (the capture is not listed and the next start deletes its
//! leftovers) or a complete capture.

use std::{
    fs::{self, File, OpenOptions},
    io::{Read, Write},
    os::unix::fs::{OpenOptionsExt, PermissionsExt},
    path::{Path, PathBuf},
    time::{SystemTime, UNIX_EPOCH},
};

use serde::{Deserialize, Serialize};
use thiserror::Error;

#[derive(Debug, Error)]
pub enum StoreError {
    #[error("{op} {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("no capture {0:?}")]
    NotFound(String),
    #[error("capture id {0:?} is not a plain file name")]
    BadId(String),
}

fn io<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> StoreError + 'a {
    move |source| StoreError::Io {
        op,
        path: path.to_owned(),
        source,
    }
}

const FILE_MODE: u32 = 0o640;
const INDEX: &str = "index.json";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub quota_bytes: u64,
    pub max_captures: usize,
    pub max_age_ms: u64,
}

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

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CaptureMeta {
    pub id: String,
    pub created_unix_ms: u64,
    pub trigger: TriggerInfo,
    pub duration_ms: u64,
    pub trace_bytes: u64,
    /// "complete", or why the capture ended early (stopped, write error).
    pub status: String,
    /// heapprofd's own outcome per process, when a profile was taken.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heapprofd: Option<serde_json::Value>,
}

/// Counted store events, exported in status and dump.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct StoreCounters {
    pub committed: u64,
    pub evicted_over_quota: u64,
    pub evicted_over_count: u64,
    pub expired: u64,
    pub write_failures: u64,
    /// Leftovers of interrupted captures removed at start.
    pub repaired_leftovers: u64,
}

/// A capture being written: the recorder writes `tmp_path`.
#[derive(Debug)]
pub struct Pending {
    pub id: String,
    pub tmp_path: PathBuf,
}

#[derive(Debug)]
pub struct Store {
    dir: PathBuf,
    limits: Limits,
    captures: Vec<CaptureMeta>,
    pub counters: StoreCounters,
    seq: u64,
}

pub fn now_unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

fn valid_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 128
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

fn sync_dir(dir: &Path) -> Result<(), StoreError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io("fsync", dir))
}

/// Writes `bytes` to `path` atomically: temporary name, fsync, rename.
fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), StoreError> {
    let tmp = path.with_extension("json.tmp");
    let mut f = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(FILE_MODE)
        .open(&tmp)
        .map_err(io("create", &tmp))?;
    f.write_all(bytes).map_err(io("write", &tmp))?;
    f.sync_all().map_err(io("fsync", &tmp))?;
    fs::rename(&tmp, path).map_err(io("rename", &tmp))
}

/// Cuts a trace file after its last whole packet (field 1, length-delimited),
/// so a capture ended by a write error still decodes. Returns the new length.
pub fn truncate_to_whole_packets(path: &Path) -> Result<u64, StoreError> {
    let mut bytes = Vec::new();
    File::open(path)
        .and_then(|mut f| f.read_to_end(&mut bytes))
        .map_err(io("read", path))?;
    let mut pos = 0usize;
    let mut good = 0usize;
    while pos < bytes.len() {
        if bytes[pos] != 0x0a {
            break;
        }
        let mut len = 0u64;
        let mut shift = 0;
        let mut i = pos + 1;
        let mut ok = false;
        while i < bytes.len() && shift < 64 {
            let b = bytes[i];
            len |= u64::from(b & 0x7f) << shift;
            i += 1;
            if b & 0x80 == 0 {
                ok = true;
                break;
            }
            shift += 7;
        }
        if !ok || (bytes.len() - i) < len as usize {
            break;
        }
        pos = i + len as usize;
        good = pos;
    }
    if good < bytes.len() {
        let f = OpenOptions::new()
            .write(true)
            .open(path)
            .map_err(io("open", path))?;
        f.set_len(good as u64).map_err(io("truncate", path))?;
        f.sync_all().map_err(io("fsync", path))?;
    }
    Ok(good as u64)
}

impl Store {
    /// Opens (creating) the spool directory and repairs it: leftovers of
    /// interrupted captures go, the index is rebuilt from the metadata files.
    pub fn open(dir: &Path, limits: Limits) -> Result<Self, StoreError> {
        fs::create_dir_all(dir).map_err(io("create", dir))?;
        let _ = fs::set_permissions(dir, fs::Permissions::from_mode(0o750));
        let mut store = Self {
            dir: dir.to_owned(),
            limits,
            captures: Vec::new(),
            counters: StoreCounters::default(),
            seq: 0,
        };
        store.repair()?;
        Ok(store)
    }

    fn repair(&mut self) -> Result<(), StoreError> {
        let mut metas = Vec::new();
        let mut traces = Vec::new();
        let mut junk = Vec::new();
        for e in fs::read_dir(&self.dir)
            .map_err(io("list", &self.dir))?
            .flatten()
        {
            let name = e.file_name().to_string_lossy().into_owned();
            if name == INDEX {
                continue;
            } else if name.ends_with(".tmp") {
                junk.push(e.path());
            } else if let Some(id) = name.strip_suffix(".json") {
                metas.push((id.to_owned(), e.path()));
            } else if let Some(id) = name.strip_suffix(".pftrace") {
                traces.push(id.to_owned());
            }
        }
        for (id, path) in metas {
            let meta: Option<CaptureMeta> = fs::read(&path)
                .ok()
                .and_then(|b| serde_json::from_slice(&b).ok());
            match meta {
                Some(m) if m.id == id && traces.contains(&id) => self.captures.push(m),
                _ => {
                    log::warn!(
                        "store: dropping unreadable or orphaned metadata {}",
                        path.display()
                    );
                    junk.push(path);
                }
            }
        }
        for id in traces {
            if !self.captures.iter().any(|c| c.id == id) {
                junk.push(self.trace_path(&id));
            }
        }
        for p in &junk {
            log::info!("store: removing leftover {}", p.display());
            let _ = fs::remove_file(p);
            self.counters.repaired_leftovers += 1;
        }
        self.captures
            .sort_by_key(|c| (c.created_unix_ms, c.id.clone()));
        self.write_index()
    }

    fn trace_path(&self, id: &str) -> PathBuf {
        self.dir.join(format!("{id}.pftrace"))
    }

    fn meta_path(&self, id: &str) -> PathBuf {
        self.dir.join(format!("{id}.json"))
    }

    fn write_index(&self) -> Result<(), StoreError> {
        let bytes = serde_json::to_vec_pretty(&self.captures).unwrap_or_default();
        write_atomic(&self.dir.join(INDEX), &bytes)?;
        sync_dir(&self.dir)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn set_limits(&mut self, limits: Limits) {
        self.limits = limits;
    }

    /// Reserves a new capture id and its temporary path.
    pub fn begin(&mut self, label: &str) -> Pending {
        self.seq += 1;
        let label: String = label
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' {
                    c
                } else {
                    '_'
                }
            })
            .take(40)
            .collect();
        let id = format!("{}-{}-{}", now_unix_ms(), self.seq, label);
        let tmp_path = self.dir.join(format!(".{id}.pftrace.tmp"));
        Pending { id, tmp_path }
    }

    /// Makes a written capture durable and listed, then enforces the limits
    /// (never evicting the capture just committed).
    pub fn commit(
        &mut self,
        pending: Pending,
        mut meta: CaptureMeta,
    ) -> Result<CaptureMeta, StoreError> {
        let result = self.commit_inner(&pending, &mut meta);
        if result.is_err() {
            self.counters.write_failures += 1;
            let _ = fs::remove_file(&pending.tmp_path);
            let _ = fs::remove_file(self.meta_path(&pending.id));
            let _ = fs::remove_file(self.trace_path(&pending.id));
        }
        result?;
        self.counters.committed += 1;
        self.captures.push(meta.clone());
        self.enforce_limits(now_unix_ms(), &meta.id);
        self.write_index()?;
        Ok(meta)
    }

    fn commit_inner(
        &mut self,
        pending: &Pending,
        meta: &mut CaptureMeta,
    ) -> Result<(), StoreError> {
        let tmp = &pending.tmp_path;
        meta.id = pending.id.clone();
        meta.trace_bytes = truncate_to_whole_packets(tmp)?;
        fs::set_permissions(tmp, fs::Permissions::from_mode(FILE_MODE))
            .map_err(io("chmod", tmp))?;
        File::open(tmp)
            .and_then(|f| f.sync_all())
            .map_err(io("fsync", tmp))?;
        let trace = self.trace_path(&pending.id);
        fs::rename(tmp, &trace).map_err(io("rename", tmp))?;
        let bytes = serde_json::to_vec_pretty(meta).unwrap_or_default();
        let meta_path = self.meta_path(&pending.id);
        if let Err(e) = write_atomic(&meta_path, &bytes) {
            // Full disk: make room from the oldest captures, then try once more.
            log::warn!("store: {e}; evicting the oldest capture and retrying");
            if self.captures.is_empty() {
                return Err(e);
            }
            let oldest = self.captures[0].id.clone();
            self.remove_files(&oldest);
            self.captures.remove(0);
            self.counters.evicted_over_quota += 1;
            write_atomic(&meta_path, &bytes)?;
        }
        sync_dir(&self.dir)
    }

    /// Abandons a capture that could not be recorded at all.
    pub fn abort(&mut self, pending: Pending) {
        self.counters.write_failures += 1;
        let _ = fs::remove_file(&pending.tmp_path);
    }

    fn remove_files(&self, id: &str) {
        // Metadata first: once it is gone the capture is no longer listed.
        let _ = fs::remove_file(self.meta_path(id));
        let _ = fs::remove_file(self.trace_path(id));
    }

    fn total_bytes(&self) -> u64 {
        self.captures.iter().map(|c| c.trace_bytes).sum()
    }

    /// Oldest first: expired ones, then whatever exceeds count or quota.
    fn enforce_limits(&mut self, now_ms: u64, keep: &str) {
        let mut i = 0;
        while i < self.captures.len() {
            let c = &self.captures[i];
            if c.id != keep && now_ms.saturating_sub(c.created_unix_ms) > self.limits.max_age_ms {
                let id = c.id.clone();
                self.remove_files(&id);
                self.captures.remove(i);
                self.counters.expired += 1;
            } else {
                i += 1;
            }
        }
        while self.captures.len() > self.limits.max_captures
            || self.total_bytes() > self.limits.quota_bytes
        {
            let Some(pos) = self.captures.iter().position(|c| c.id != keep) else {
                break;
            };
            let over_count = self.captures.len() > self.limits.max_captures;
            let id = self.captures[pos].id.clone();
            log::info!(
                "store: evicting {id} ({})",
                if over_count { "count" } else { "quota" }
            );
            self.remove_files(&id);
            self.captures.remove(pos);
            if over_count {
                self.counters.evicted_over_count += 1;
            } else {
                self.counters.evicted_over_quota += 1;
            }
        }
    }

    /// Drops captures older than max_age (called periodically).
    pub fn expire(&mut self, now_ms: u64) -> Result<(), StoreError> {
        let before = self.captures.len();
        self.enforce_limits(now_ms, "");
        if self.captures.len() != before {
            self.write_index()?;
        }
        Ok(())
    }

    pub fn list(&self) -> &[CaptureMeta] {
        &self.captures
    }

    pub fn newest(&self) -> Option<&CaptureMeta> {
        self.captures.last()
    }

    /// A capture's metadata and trace path.
    pub fn get(&self, id: &str) -> Result<(&CaptureMeta, PathBuf), StoreError> {
        if !valid_id(id) {
            return Err(StoreError::BadId(id.to_owned()));
        }
        let meta = self
            .captures
            .iter()
            .find(|c| c.id == id)
            .ok_or_else(|| StoreError::NotFound(id.to_owned()))?;
        Ok((meta, self.trace_path(id)))
    }

    pub fn delete(&mut self, id: &str) -> Result<(), StoreError> {
        self.get(id)?;
        self.remove_files(id);
        self.captures.retain(|c| c.id != id);
        self.write_index()
    }

    pub fn total_trace_bytes(&self) -> u64 {
        self.total_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: Limits = Limits {
        quota_bytes: 1 << 20,
        max_captures: 10,
        max_age_ms: 3_600_000,
    };

    fn meta(rule: &str) -> CaptureMeta {
        CaptureMeta {
            id: String::new(),
            created_unix_ms: now_unix_ms(),
            trigger: TriggerInfo {
                rule: rule.into(),
                value: Some(95.0),
                threshold: Some(90.0),
                offender_pid: None,
                offender_name: None,
            },
            duration_ms: 1000,
            trace_bytes: 0,
            status: "complete".into(),
            heapprofd: None,
        }
    }

    /// A trace of `n` packets of `size` bytes each.
    fn packets(n: usize, size: usize) -> Vec<u8> {
        let mut v = Vec::new();
        for _ in 0..n {
            v.push(0x0a);
            let mut len = size;
            loop {
                let b = (len & 0x7f) as u8;
                len >>= 7;
                if len == 0 {
                    v.push(b);
                    break;
                }
                v.push(b | 0x80);
            }
            v.extend(std::iter::repeat_n(0x08, size));
        }
        v
    }

    fn add(store: &mut Store, rule: &str, bytes: &[u8]) -> CaptureMeta {
        let p = store.begin(rule);
        fs::write(&p.tmp_path, bytes).unwrap();
        store.commit(p, meta(rule)).unwrap()
    }

    #[test]
    fn commit_lists_with_mode_0640_and_index() {
        let d = tempfile::tempdir().unwrap();
        let mut s = Store::open(d.path(), LIMITS).unwrap();
        let m = add(&mut s, "cpu", &packets(3, 10));
        assert_eq!(m.trace_bytes, 36);
        let (_, path) = s.get(&m.id).unwrap();
        assert_eq!(
            fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o640
        );
        let index: Vec<CaptureMeta> =
            serde_json::from_slice(&fs::read(d.path().join(INDEX)).unwrap()).unwrap();
        assert_eq!(index, vec![m]);
    }

    #[test]
    fn quota_evicts_oldest_first() {
        let d = tempfile::tempdir().unwrap();
        let mut s = Store::open(
            d.path(),
            Limits {
                quota_bytes: 2500,
                ..LIMITS
            },
        )
        .unwrap();
        let a = add(&mut s, "a", &packets(1, 1000));
        let b = add(&mut s, "b", &packets(1, 1000));
        let c = add(&mut s, "c", &packets(1, 1000));
        let ids: Vec<&str> = s.list().iter().map(|m| m.id.as_str()).collect();
        assert_eq!(ids, vec![b.id.as_str(), c.id.as_str()]);
        assert!(!s.trace_path(&a.id).exists() && !s.meta_path(&a.id).exists());
        assert_eq!(s.counters.evicted_over_quota, 1);
        // A capture larger than the whole quota is still kept (it is the newest).
        let big = add(&mut s, "big", &packets(1, 4000));
        assert_eq!(s.list().len(), 1);
        assert_eq!(s.list()[0].id, big.id);
    }

    #[test]
    fn count_limit_and_expiry() {
        let d = tempfile::tempdir().unwrap();
        let mut s = Store::open(
            d.path(),
            Limits {
                max_captures: 2,
                max_age_ms: 1000,
                ..LIMITS
            },
        )
        .unwrap();
        add(&mut s, "a", &packets(1, 10));
        let b = add(&mut s, "b", &packets(1, 10));
        let c = add(&mut s, "c", &packets(1, 10));
        assert_eq!(s.counters.evicted_over_count, 1);
        assert_eq!(
            s.list().iter().map(|m| &m.id).collect::<Vec<_>>(),
            vec![&b.id, &c.id]
        );
        s.expire(now_unix_ms() + 5000).unwrap();
        assert!(s.list().is_empty());
        assert_eq!(s.counters.expired, 2);
    }

    #[test]
    fn interrupted_captures_are_repaired_at_open() {
        let d = tempfile::tempdir().unwrap();
        let kept = {
            let mut s = Store::open(d.path(), LIMITS).unwrap();
            let kept = add(&mut s, "kept", &packets(2, 10));
            // Killed while recording: only the temporary file.
            let p = s.begin("recording");
            fs::write(&p.tmp_path, packets(1, 10)).unwrap();
            // Killed between the trace rename and the metadata: an orphan trace.
            fs::write(d.path().join("123-9-orphan.pftrace"), packets(1, 10)).unwrap();
            // Killed while writing metadata: its temporary.
            fs::write(d.path().join("123-9-orphan.json.tmp"), b"{").unwrap();
            // Metadata whose trace is gone.
            fs::write(
                d.path().join("55-1-ghost.json"),
                serde_json::to_vec(&meta("ghost")).unwrap(),
            )
            .unwrap();
            kept
        };
        let s = Store::open(d.path(), LIMITS).unwrap();
        assert_eq!(s.list(), &[kept]);
        assert_eq!(s.counters.repaired_leftovers, 4);
        let mut names: Vec<String> = fs::read_dir(d.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(names.len(), 3, "{names:?}");
    }

    #[test]
    fn partial_last_packet_is_cut() {
        let d = tempfile::tempdir().unwrap();
        let mut s = Store::open(d.path(), LIMITS).unwrap();
        let mut bytes = packets(2, 100);
        bytes.extend_from_slice(&packets(1, 100)[..50]);
        let m = add(&mut s, "cut", &bytes);
        assert_eq!(m.trace_bytes, 204);
        assert_eq!(fs::metadata(s.get(&m.id).unwrap().1).unwrap().len(), 204);
    }

    #[test]
    fn ids_are_checked_and_delete_works() {
        let d = tempfile::tempdir().unwrap();
        let mut s = Store::open(d.path(), LIMITS).unwrap();
        assert!(matches!(s.get("../etc/passwd"), Err(StoreError::BadId(_))));
        assert!(matches!(s.get("nope"), Err(StoreError::NotFound(_))));
        let m = add(&mut s, "x", &packets(1, 10));
        s.delete(&m.id).unwrap();
        assert!(s.list().is_empty());
        assert!(!s.trace_path(&m.id).exists());
    }
}
