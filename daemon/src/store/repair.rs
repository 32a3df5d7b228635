//! Start-up repair: rebuild the list from the metadata files, salvage the
//! captures a crash interrupted, remove the store's own leftovers.
//!
//! Only names the store itself writes are looked at (see [`classify`]);
//! anything else in the directory (`state/`, the service's `.lock`, a
//! `notes.json` someone left) is never touched. Of the store's names:
//! - `<id>.json` with its `<id>.pftrace`: a capture;
//! - `.<id>.pftrace.tmp`: a capture in flight when the daemon died. Its whole
//!   packets are kept as a capture with status [`EntryStatus::Crashed`], metadata
//!   synthesised from the id (creation time, rule label); a file without a
//!   whole packet, or that is not a singly linked regular file, is removed.
//!   A salvage that fails otherwise (a full disk: ENOSPC writing the
//!   metadata) leaves the recording for the next start, counted in
//!   `salvage_deferred`;
//! - `<id>.json` that does not read (torn, over [`MAX_META_BYTES`], another
//!   id) beside its `<id>.pftrace`: the trace is kept, with metadata rebuilt
//!   from it and status [`EntryStatus::Recovered`] (or, when that cannot be
//!   written, left as it is for the next start); a readable `<id>.json` has
//!   its `trace_bytes` checked against the trace file;
//! - anything else of ours is a leftover and removed: metadata being
//!   written, metadata without its trace, and a trace without metadata. The
//!   last is never salvaged: it may be a capture whose deletion (metadata
//!   first) was cut short, which must stay deleted.
//!
//! Files are logged by name up to [`LOGGED_FILES`], then counted in one
//! line.

use std::{
    collections::HashSet,
    fs,
    io::Read,
    os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt},
    path::{Path, PathBuf},
};

use super::{
    io,
    meta::{self, classify, EntryMeta, EntryStatus, OwnId, OwnName, Record, Stamp, TriggerInfo},
    packets::{self, Stop},
    Store, StoreError, FILE_MODE,
};

/// The largest `<id>.json` read: a capture's metadata is a few KiB (the
/// heapprofd outcome the largest part); a larger file is treated as torn.
pub const MAX_META_BYTES: u64 = 1 << 20;

/// How many files of start-up repair are logged by name; the rest are
/// counted in one line (100k junk files must not be 100k log lines).
const LOGGED_FILES: u64 = 10;

/// Start-up repair's log lines, throttled to [`LOGGED_FILES`].
#[derive(Default)]
struct Throttle {
    seen: u64,
}

impl Throttle {
    fn line(&mut self) -> bool {
        self.seen += 1;
        self.seen <= LOGGED_FILES
    }

    fn warn(&mut self, what: std::fmt::Arguments) {
        if self.line() {
            log::warn!("store: {what}");
        }
    }

    fn info(&mut self, what: std::fmt::Arguments) {
        if self.line() {
            log::info!("store: {what}");
        }
    }

    fn summary(&self) {
        if self.seen > LOGGED_FILES {
            log::warn!(
                "store: start-up repair: {} files in all, {} not logged by name (see the store counters)",
                self.seen,
                self.seen - LOGGED_FILES
            );
        }
    }
}

/// `<id>.json`, read through a descriptor that does not follow links or
/// wait on a FIFO, and no more than [`MAX_META_BYTES`] of it.
fn read_record(path: &Path) -> Result<Record, String> {
    let f = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| e.to_string())?;
    let st = f.metadata().map_err(|e| e.to_string())?;
    if !st.is_file() {
        return Err("not a regular file".into());
    }
    let mut bytes = Vec::new();
    f.take(MAX_META_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| e.to_string())?;
    if bytes.len() as u64 > MAX_META_BYTES {
        return Err(format!("over {MAX_META_BYTES} bytes"));
    }
    serde_json::from_slice(&bytes).map_err(|e| e.to_string())
}

/// Metadata for a trace that has none (a crash's recording, a trace whose
/// metadata is unreadable): creation time and rule label from its id,
/// duration up to the file's last write, size its whole packets.
fn rebuilt_meta(
    own: &OwnId,
    id: &str,
    st: &fs::Metadata,
    whole_bytes: u64,
    status: EntryStatus,
) -> EntryMeta {
    // The last write, on the wall clock: 0 if it reads before creation.
    let mtime_ms = (st.mtime().max(0) as u64)
        .saturating_mul(1000)
        .saturating_add(st.mtime_nsec().max(0) as u64 / 1_000_000);
    EntryMeta {
        id: id.to_owned(),
        created_unix_ms: own.unix_ms,
        trigger: TriggerInfo {
            rule: own.label.clone(),
            value: None,
            threshold: None,
            offender_pid: None,
            offender_name: None,
        },
        duration_ms: mtime_ms.saturating_sub(own.unix_ms),
        trace_bytes: whole_bytes,
        status,
        heapprofd: None,
        backend: None,
    }
}

/// What the directory listing found.
#[derive(Debug, Default)]
struct Listing {
    metas: Vec<(String, PathBuf)>,
    traces: HashSet<String>,
    recordings: Vec<(OwnId, String, PathBuf)>,
    junk: Vec<PathBuf>,
    max_seq: u64,
}

impl Store {
    fn list_dir(&self) -> Result<Listing, StoreError> {
        let mut l = Listing::default();
        for e in fs::read_dir(&self.dir)
            .map_err(io("list", &self.dir))?
            .flatten()
        {
            let name = e.file_name();
            let Some(own) = name.to_str().and_then(classify) else {
                continue;
            };
            // file_type() does not follow symlinks.
            let Ok(ft) = e.file_type() else { continue };
            if own == OwnName::Index {
                continue;
            }
            if ft.is_dir() {
                log::warn!("store: {} is a directory; left alone", e.path().display());
                continue;
            }
            if !ft.is_file() {
                // The store writes regular files only (unlink never follows).
                l.junk.push(e.path());
                continue;
            }
            match own {
                OwnName::Meta(id) => l.metas.push((id, e.path())),
                OwnName::Trace(id) => {
                    l.traces.insert(id);
                }
                OwnName::Recording(id) => {
                    let parsed = meta::parse_id(&id).expect("classify checked the id");
                    l.recordings.push((parsed, id, e.path()));
                }
                OwnName::MetaTmp => l.junk.push(e.path()),
                OwnName::Index => {}
            }
        }
        let ids = l
            .metas
            .iter()
            .map(|(id, _)| id)
            .chain(&l.traces)
            .chain(l.recordings.iter().map(|(_, id, _)| id));
        l.max_seq = ids
            .filter_map(|id| meta::parse_id(id))
            .map(|o| o.seq)
            .max()
            .unwrap_or(0);
        Ok(l)
    }

    /// Rebuilds the list, salvages, removes leftovers, empties `heapprofd/`.
    pub(super) fn repair(&mut self) -> Result<(), StoreError> {
        let Listing {
            metas,
            traces,
            mut recordings,
            mut junk,
            max_seq,
        } = self.list_dir()?;
        let mut log = Throttle::default();
        // Traces whose metadata could not be rebuilt now (a full disk).
        let mut later = HashSet::new();
        for (id, path) in metas {
            if !traces.contains(&id) {
                junk.push(path);
                continue;
            }
            match read_record(&path) {
                Ok(r) if r.meta.id == id => self.keep_checked(r),
                // Torn, oversized or not ours: the trace beside it is
                // intact, and is kept on what it says of itself.
                bad => {
                    let why = bad.err().unwrap_or_else(|| "names another id".into());
                    match self.recover(&id) {
                        Ok(Some(())) => log.warn(format_args!(
                            "metadata {} unreadable ({why}); rebuilt from its trace",
                            path.display()
                        )),
                        Ok(None) | Err(StoreError::NotRegular(_)) => junk.push(path),
                        Err(e) => {
                            log.warn(format_args!(
                                "metadata {} unreadable ({why}); not rebuilt now, kept for a later start: {e}",
                                path.display()
                            ));
                            self.counters.salvage_deferred += 1;
                            later.insert(id);
                        }
                    }
                }
            }
        }
        for id in &traces {
            if !later.contains(id) && !self.captures.iter().any(|c| &c.id == id) {
                junk.push(self.trace_path(id));
            }
        }
        let stamped = self.stamps.iter().filter_map(|s| s.seq).max().unwrap_or(0);
        self.next_seq = max_seq.max(stamped) + 1;

        recordings.sort_by_key(|(o, _, _)| o.seq);
        for (own, id, path) in recordings {
            if self.captures.iter().any(|c| c.id == id) {
                junk.push(path);
                continue;
            }
            match self.salvage(&own, &id, &path) {
                Ok(Some((m, s))) => {
                    log.warn(format_args!(
                        "salvaged {id} ({} bytes) from a crashed capture",
                        m.trace_bytes
                    ));
                    self.counters.salvaged_after_crash += 1;
                    self.captures.push(m);
                    self.stamps.push(s);
                }
                Ok(None) | Err(StoreError::NotRegular(_)) => junk.push(path),
                Err(e) => {
                    // A full disk (ENOSPC writing its metadata) is no reason
                    // to lose the recording: the next start tries again.
                    log.warn(format_args!(
                        "not salvaging {} now, kept for a later start: {e}",
                        path.display()
                    ));
                    self.counters.salvage_deferred += 1;
                }
            }
        }
        for p in &junk {
            log.info(format_args!("removing leftover {}", p.display()));
            let _ = fs::remove_file(p);
            self.counters.repaired_leftovers += 1;
        }
        log.summary();
        self.sort();
        let now = self.clock.now();
        self.jumps.observe(&now);
        let removed = self
            .spill
            .scan(&self.heapprofd_dir(), now.boottime_ms, true);
        self.counters.heapprofd_files_removed += removed;
        self.refresh_index();
        Ok(())
    }

    /// Lists a capture whose metadata read, with its size taken from the
    /// trace file, not the metadata: one wrong `trace_bytes` (2^40) would
    /// otherwise evict every other capture at the next commit.
    fn keep_checked(&mut self, mut r: Record) {
        let trace = self.trace_path(&r.meta.id);
        // lstat: the listing saw a regular file, and unlink never follows.
        if let Ok(st) = fs::symlink_metadata(&trace) {
            if st.len() != r.meta.trace_bytes {
                log::warn!(
                    "store: {} says {} trace bytes, its trace has {}; using the trace's",
                    r.meta.id,
                    r.meta.trace_bytes,
                    st.len()
                );
                r.meta.trace_bytes = st.len();
                self.counters.sizes_corrected += 1;
                let bytes = super::record_json(&r.meta, &r.stamp);
                if let Err(e) = super::write_atomic(&self.meta_path(&r.meta.id), &bytes) {
                    log::warn!("store: {e}");
                }
            }
        }
        self.captures.push(r.meta);
        self.stamps.push(r.stamp);
    }

    /// Lists the trace of a capture whose metadata is unreadable, with
    /// metadata rebuilt from its id (creation time, rule label), its file
    /// (size, last write) and status [`EntryStatus::Recovered`]. `None`: the
    /// trace has not one whole packet, it is not a trace.
    fn recover(&mut self, id: &str) -> Result<Option<()>, StoreError> {
        let own = meta::parse_id(id).expect("classify checked the id");
        let path = self.trace_path(id);
        let f = packets::open_trace(&path)?;
        // Whole packets, whatever today's per-capture limit: it was stored.
        let scan = packets::cut(&f, &path, u64::MAX)?;
        if scan.whole_bytes == 0 {
            return Ok(None);
        }
        let st = f.metadata().map_err(io("fstat", &path))?;
        let m = rebuilt_meta(&own, id, &st, scan.whole_bytes, EntryStatus::Recovered);
        let stamp = Stamp {
            seq: Some(own.seq),
            age_basis: None,
            age_restarted: false,
        };
        super::write_atomic(&self.meta_path(id), &super::record_json(&m, &stamp))?;
        self.counters.metadata_recovered += 1;
        self.captures.push(m);
        self.stamps.push(stamp);
        Ok(Some(()))
    }

    /// Keeps the whole packets of an interrupted recording as a capture;
    /// `None` when there is not one.
    fn salvage(
        &self,
        own: &OwnId,
        id: &str,
        tmp: &std::path::Path,
    ) -> Result<Option<(EntryMeta, Stamp)>, StoreError> {
        let f = packets::open_trace(tmp)?;
        // The configured limit, not the filesystem's share (`space.rs`): the
        // recording has its room already, and cutting it frees none that
        // eviction could not.
        let half = self.limits.quota_bytes / 2;
        let limit = self.max_capture_bytes.map_or(half, |m| m.min(half));
        let scan = packets::cut(&f, tmp, limit)?;
        if scan.whole_bytes == 0 {
            return Ok(None);
        }
        let st = f.metadata().map_err(io("fstat", tmp))?;
        let mut m = rebuilt_meta(own, id, &st, scan.whole_bytes, EntryStatus::Crashed);
        if scan.stop == Stop::Limit {
            super::mark_cut(&mut m, limit);
        }
        f.set_permissions(fs::Permissions::from_mode(FILE_MODE))
            .map_err(io("chmod", tmp))?;
        f.sync_all().map_err(io("fsync", tmp))?;
        drop(f);
        let stamp = Stamp {
            seq: Some(own.seq),
            age_basis: None,
            age_restarted: false,
        };
        let trace = self.trace_path(id);
        fs::rename(tmp, &trace).map_err(io("rename", tmp))?;
        if let Err(e) = super::write_atomic(&self.meta_path(id), &super::record_json(&m, &stamp)) {
            // Back under its temporary name, for a later start.
            let _ = fs::rename(&trace, tmp);
            return Err(e);
        }
        Ok(Some((m, stamp)))
    }
}
