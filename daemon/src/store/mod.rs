//! The bounded on-device capture store.
//!
//! Layout of the spool directory:
//! - `<id>.pftrace`: a finished trace, mode 0640;
//! - `<id>.json`: its metadata (trigger, rule values, times, sizes,
//!   heapprofd outcome, and the store's sequence number and age basis), the
//!   source of truth: a capture exists iff both exist;
//! - `.<id>.pftrace.tmp`: a capture being written;
//! - `index.json`: the metadata of every capture, rewritten atomically after
//!   each change, a convenience for readers; rebuilt from `<id>.json` files
//!   at every start;
//! - `heapprofd/`: perfetto's output for heapprofd sessions in flight
//!   (`spill.rs`): counted in the quota, emptied at start, stale files
//!   removed.
//!
//! Commit order: the trace is opened without following symlinks, cut after
//! its last whole packet (streamed, `packets.rs`), fchmod'ed, fsynced and
//! renamed; metadata written to a temporary name, fsync, rename; directory
//! fsync. A kill -9 at any point leaves either a recording (the next start
//! salvages its whole packets as a capture marked "cut: daemon crashed",
//! `repair.rs`), leftovers without metadata (removed) or a complete capture.
//!
//! Bounds (`evict.rs`): one capture keeps at most half the quota (or
//! [`Store::set_max_capture_bytes`], if lower); a larger one is cut at its
//! last whole packet under that and its status says so, and one with not even
//! a first packet under it is refused. Committing a capture evicts the oldest
//! captures only until the limits hold, never the newest other one, and a
//! manual capture makes room from other manual ones first. Order is a
//! persisted sequence number and age survives wall-clock jumps (`clock.rs`).

mod clock;
mod evict;
mod meta;
mod packets;
mod repair;
mod space;
mod spill;
#[cfg(test)]
mod tests;

use std::{
    fs::{self, File, OpenOptions},
    io::Write,
    os::unix::fs::{OpenOptionsExt, PermissionsExt},
    path::{Path, PathBuf},
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use serde::{Deserialize, Serialize};
use thiserror::Error;

pub use clock::{ClockReading, StoreClock, SystemClock, PLAUSIBLE_UNIX_MS};
pub use meta::{AgeBasis, BackendInfo, EntryMeta, EntryStatus, TriggerInfo, MANUAL_RULES};
pub use packets::truncate_to_whole_packets;
pub use repair::MAX_META_BYTES;
pub use spill::{DEFAULT_STALE_AFTER_MS, HEAPPROFD_DIR};

use meta::{RecordRef, Stamp, INDEX};
use packets::{Scan, Stop};

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
    #[error("{0}: not a regular file with a single link; refusing to store it")]
    NotRegular(PathBuf),
    #[error("capture {id}: its first packet is over the per-capture limit of {limit_bytes} bytes")]
    TooLarge { id: String, limit_bytes: u64 },
}

fn io<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> StoreError + 'a {
    move |source| StoreError::Io {
        op,
        path: path.to_owned(),
        source,
    }
}

const FILE_MODE: u32 = 0o640;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub quota_bytes: u64,
    pub max_captures: usize,
    pub max_age_ms: u64,
}

/// Counted store events, exported in status and dump.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoreCounters {
    pub committed: u64,
    pub evicted_over_quota: u64,
    pub evicted_over_count: u64,
    pub expired: u64,
    pub write_failures: u64,
    /// Leftovers of interrupted captures removed at start.
    pub repaired_leftovers: u64,
    /// Recordings a crash interrupted, kept as captures at start.
    pub salvaged_after_crash: u64,
    /// Recordings (and traces with unreadable metadata) that could not be
    /// made captures at start (a full disk), left for the next start.
    pub salvage_deferred: u64,
    /// Traces kept at start with metadata rebuilt from them, theirs being
    /// unreadable (status [`EntryStatus::Recovered`]).
    pub metadata_recovered: u64,
    /// Metadata whose `trace_bytes` disagreed with the trace file at
    /// start; the file's size was taken.
    pub sizes_corrected: u64,
    /// Captures cut at the per-capture limit.
    pub cut_at_limit: u64,
    /// Wall-clock jumps seen (`clock.rs`).
    pub clock_jumps: u64,
    /// Capture ages restarted because a jump made them unknowable.
    pub age_restarts: u64,
    /// Files removed from `heapprofd/` (at start, or stale).
    pub heapprofd_files_removed: u64,
    /// `index.json` rewrites that failed (full disk): the captures stay
    /// stored and listed, since `<id>.json` is the source of truth; the
    /// index is rewritten at the next change or upkeep.
    pub index_write_failures: u64,
}

/// What commit's slow part found, done ahead by [`Pending::seal`].
#[derive(Debug, Clone, Copy)]
struct Sealed {
    scan: Scan,
}

/// A capture being written: the recorder writes `tmp_path`.
#[derive(Debug)]
pub struct Pending {
    pub id: String,
    pub tmp_path: PathBuf,
    seq: u64,
    basis: AgeBasis,
    limit_bytes: u64,
    sealed: Option<Sealed>,
}

impl Pending {
    /// The most bytes the store will keep of this capture (see
    /// [`Store::max_capture_bytes`]): a recorder can stop there.
    pub fn limit_bytes(&self) -> u64 {
        self.limit_bytes
    }

    /// Does the slow part of [`Store::commit`] (reading the trace for its
    /// whole packets, cutting it, fsync) without the store, so it need not
    /// run under the store's lock. Optional: commit does whatever was not
    /// done, and reports any error again (so this result may be ignored).
    pub fn seal(&mut self) -> Result<(), StoreError> {
        self.sealed = None;
        let f = packets::open_trace(&self.tmp_path)?;
        let scan = packets::cut(&f, &self.tmp_path, self.limit_bytes)?;
        f.sync_all().map_err(io("fsync", &self.tmp_path))?;
        self.sealed = Some(Sealed { scan });
        Ok(())
    }
}

#[derive(Debug)]
pub struct Store {
    dir: PathBuf,
    limits: Limits,
    /// Oldest first ([`meta::order_key`]); `stamps[i]` goes with
    /// `captures[i]` (kept apart so [`Store::list`] stays a slice of
    /// [`EntryMeta`]).
    captures: Vec<EntryMeta>,
    stamps: Vec<Stamp>,
    pub counters: StoreCounters,
    next_seq: u64,
    max_capture_bytes: Option<u64>,
    clock: Box<dyn StoreClock>,
    jumps: clock::JumpWatch,
    spill: spill::Spill,
    /// `index.json` is behind the captures (its last rewrite failed).
    index_stale: bool,
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
    let written = f
        .write_all(bytes)
        .map_err(io("write", &tmp))
        .and_then(|()| f.sync_all().map_err(io("fsync", &tmp)))
        .and_then(|()| fs::rename(&tmp, path).map_err(io("rename", &tmp)));
    if written.is_err() {
        // A half-written file would hold on to the space a full disk lacks.
        let _ = fs::remove_file(&tmp);
    }
    written
}

/// `<id>.json`'s content.
fn record_json(meta: &EntryMeta, stamp: &Stamp) -> Vec<u8> {
    serde_json::to_vec_pretty(&RecordRef { meta, stamp }).unwrap_or_default()
}

/// Marks a capture the store cut at `limit` bytes.
fn mark_cut(meta: &mut EntryMeta, limit: u64) {
    let before = std::mem::replace(&mut meta.status, EntryStatus::Complete);
    meta.status = before.cut_by_store(limit);
}

impl Store {
    /// Opens (creating) the spool directory and repairs it: leftovers of
    /// interrupted captures go, the index is rebuilt from the metadata files.
    pub fn open(dir: &Path, limits: Limits) -> Result<Self, StoreError> {
        Self::open_with_clock(dir, limits, Box::new(SystemClock::new()))
    }

    /// [`Store::open`], reading time from `clock`.
    pub fn open_with_clock(
        dir: &Path,
        limits: Limits,
        clock: Box<dyn StoreClock>,
    ) -> Result<Self, StoreError> {
        fs::create_dir_all(dir).map_err(io("create", dir))?;
        let _ = fs::set_permissions(dir, fs::Permissions::from_mode(0o750));
        let mut store = Self {
            dir: dir.to_owned(),
            limits,
            captures: Vec::new(),
            stamps: Vec::new(),
            counters: StoreCounters::default(),
            next_seq: 1,
            max_capture_bytes: None,
            clock,
            jumps: clock::JumpWatch::default(),
            spill: spill::Spill::default(),
            index_stale: false,
        };
        store.repair()?;
        Ok(store)
    }

    fn trace_path(&self, id: &str) -> PathBuf {
        self.dir.join(format!("{id}.pftrace"))
    }

    fn meta_path(&self, id: &str) -> PathBuf {
        self.dir.join(format!("{id}.json"))
    }

    /// Rewrites `index.json`; a failure is logged and counted, never the
    /// caller's: the change it follows is already durable in `<id>.json`
    /// files, and [`Store::maintain`] retries.
    fn refresh_index(&mut self) {
        match self.write_index() {
            Ok(()) => self.index_stale = false,
            Err(e) => {
                if !self.index_stale {
                    log::warn!("store: index not rewritten, retried at upkeep: {e}");
                }
                self.counters.index_write_failures += 1;
                self.index_stale = true;
            }
        }
    }

    fn write_index(&self) -> Result<(), StoreError> {
        let records: Vec<RecordRef> = self
            .captures
            .iter()
            .zip(&self.stamps)
            .map(|(meta, stamp)| RecordRef { meta, stamp })
            .collect();
        let bytes = serde_json::to_vec_pretty(&records).unwrap_or_default();
        write_atomic(&self.dir.join(INDEX), &bytes)?;
        sync_dir(&self.dir)
    }

    /// Rewrites capture `i`'s `<id>.json` (its stamp changed).
    fn write_record(&self, i: usize) -> Result<(), StoreError> {
        let (m, s) = (&self.captures[i], &self.stamps[i]);
        write_atomic(&self.meta_path(&m.id), &record_json(m, s))
    }

    /// Restores the oldest-first order.
    fn sort(&mut self) {
        let mut both: Vec<(EntryMeta, Stamp)> =
            self.captures.drain(..).zip(self.stamps.drain(..)).collect();
        both.sort_by_cached_key(|(m, s)| meta::order_key(m, s));
        (self.captures, self.stamps) = both.into_iter().unzip();
    }

    fn insert(&mut self, meta: EntryMeta, stamp: Stamp) {
        let key = meta::order_key(&meta, &stamp);
        let at = (0..self.captures.len())
            .position(|i| meta::order_key(&self.captures[i], &self.stamps[i]) > key)
            .unwrap_or(self.captures.len());
        self.captures.insert(at, meta);
        self.stamps.insert(at, stamp);
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Where perfetto writes heapprofd sessions before they are stored.
    pub fn heapprofd_dir(&self) -> PathBuf {
        self.dir.join(HEAPPROFD_DIR)
    }

    pub fn set_limits(&mut self, limits: Limits) {
        self.limits = limits;
    }

    /// Lowers the per-capture limit below half the quota (`None`: half the
    /// quota).
    pub fn set_max_capture_bytes(&mut self, max: Option<u64>) {
        self.max_capture_bytes = max;
    }

    /// The most bytes one capture keeps: half the quota in force
    /// ([`Store::effective_quota_bytes`]), or the limit set, if lower.
    /// Half, so that the capture and the newest other one always fit
    /// together.
    pub fn max_capture_bytes(&self) -> u64 {
        self.capture_limit(0)
    }

    /// [`Store::max_capture_bytes`] while a recording of `in_flight_bytes`
    /// is being committed (its file takes room already).
    fn capture_limit(&self, in_flight_bytes: u64) -> u64 {
        let half = self.quota_now(in_flight_bytes) / 2;
        self.max_capture_bytes.map_or(half, |m| m.min(half))
    }

    /// How long a file may sit in `heapprofd/` before it is removed as
    /// stale (default [`DEFAULT_STALE_AFTER_MS`]): more than a session lives.
    pub fn set_heapprofd_stale_after(&mut self, after: Duration) {
        self.spill.stale_after_ms = after.as_millis().min(u128::from(u64::MAX)) as u64;
    }

    /// Reserves a new capture id and its temporary path.
    pub fn begin(&mut self, label: &str) -> Pending {
        let now = self.clock.now();
        let seq = self.next_seq;
        self.next_seq += 1;
        let id = format!("{}-{}-{}", now.unix_ms, seq, meta::label_of(label));
        let tmp_path = self.dir.join(format!(".{id}.pftrace.tmp"));
        let limit_bytes = self.max_capture_bytes();
        self.make_room(label, limit_bytes);
        Pending {
            id,
            tmp_path,
            seq,
            basis: AgeBasis::at(&now),
            limit_bytes,
            sealed: None,
        }
    }

    /// Makes a written capture durable and listed, then enforces the limits
    /// (never evicting the capture just committed). A capture over
    /// [`Store::max_capture_bytes`] is cut there and its status says so.
    pub fn commit(
        &mut self,
        pending: Pending,
        mut meta: EntryMeta,
    ) -> Result<EntryMeta, StoreError> {
        let stamp = Stamp {
            seq: Some(pending.seq),
            age_basis: Some(pending.basis.clone()),
            age_restarted: false,
        };
        let result = self.commit_inner(&pending, &mut meta, &stamp);
        let cut = match result {
            Ok(cut) => cut,
            Err(e) => {
                self.counters.write_failures += 1;
                let _ = fs::remove_file(&pending.tmp_path);
                let _ = fs::remove_file(self.meta_path(&pending.id));
                let _ = fs::remove_file(self.trace_path(&pending.id));
                return Err(e);
            }
        };
        self.counters.committed += 1;
        if cut {
            self.counters.cut_at_limit += 1;
        }
        self.insert(meta.clone(), stamp);
        self.enforce_limits(Some(&meta.id));
        self.refresh_index();
        Ok(meta)
    }

    /// Returns whether the capture was cut at the limit.
    fn commit_inner(
        &mut self,
        pending: &Pending,
        meta: &mut EntryMeta,
        stamp: &Stamp,
    ) -> Result<bool, StoreError> {
        let tmp = &pending.tmp_path;
        meta.id = pending.id.clone();
        let f = packets::open_trace(tmp)?;
        let len = f.metadata().map_err(io("fstat", tmp))?.len();
        let limit = self.capture_limit(len);
        let scan = match pending.sealed {
            // Sealed, unchanged since, and within today's limit.
            Some(s) if s.scan.whole_bytes == len && len <= limit => s.scan,
            _ => packets::cut(&f, tmp, limit)?,
        };
        let cut = scan.stop == Stop::Limit;
        if cut && scan.whole_bytes == 0 {
            return Err(StoreError::TooLarge {
                id: pending.id.clone(),
                limit_bytes: limit,
            });
        }
        meta.trace_bytes = scan.whole_bytes;
        if cut {
            log::warn!(
                "store: {} cut at {} bytes, the per-capture limit",
                pending.id,
                scan.whole_bytes
            );
            mark_cut(meta, limit);
        }
        // fchmod and fsync on the descriptor: the path is never followed.
        f.set_permissions(fs::Permissions::from_mode(FILE_MODE))
            .map_err(io("chmod", tmp))?;
        f.sync_all().map_err(io("fsync", tmp))?;
        drop(f);
        let trace = self.trace_path(&pending.id);
        fs::rename(tmp, &trace).map_err(io("rename", tmp))?;
        let bytes = record_json(meta, stamp);
        let meta_path = self.meta_path(&pending.id);
        if let Err(e) = write_atomic(&meta_path, &bytes) {
            // Full disk: make room from one capture eviction may take, then
            // try once more.
            let manual = meta.trigger.is_manual();
            let protected = self.protected(None, manual);
            let Some(victim) = self.next_victim(None, protected, manual) else {
                return Err(e);
            };
            log::warn!("store: {e}; evicting one capture and retrying");
            self.evict(victim, evict::Reason::Quota);
            write_atomic(&meta_path, &bytes)?;
        }
        sync_dir(&self.dir)?;
        Ok(cut)
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

    /// Periodic upkeep: ages (minding clock jumps), count and quota, stale
    /// files in `heapprofd/`.
    pub fn maintain(&mut self) -> Result<(), StoreError> {
        if self.enforce_limits(None) || self.index_stale {
            self.refresh_index();
        }
        Ok(())
    }

    pub fn list(&self) -> &[EntryMeta] {
        &self.captures
    }

    pub fn newest(&self) -> Option<&EntryMeta> {
        self.captures.last()
    }

    /// A capture's metadata and trace path.
    pub fn get(&self, id: &str) -> Result<(&EntryMeta, PathBuf), StoreError> {
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
        if let Some(i) = self.captures.iter().position(|c| c.id == id) {
            self.captures.remove(i);
            self.stamps.remove(i);
        }
        self.refresh_index();
        Ok(())
    }

    /// Bytes of the stored traces.
    pub fn total_trace_bytes(&self) -> u64 {
        // Saturating: a sum that wrapped would hide a store over its quota.
        self.captures
            .iter()
            .fold(0, |sum, c| sum.saturating_add(c.trace_bytes))
    }

    /// Bytes in `heapprofd/` at the last look (counted in the quota).
    pub fn heapprofd_bytes(&self) -> u64 {
        self.spill.bytes
    }
}
