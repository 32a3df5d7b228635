//! Start-up repair: rebuild the list from the metadata files, salvage the
//! captures a crash interrupted, remove the store's own leftovers.
//!
//! Only names the store itself writes are looked at (see [`classify`]);
//! anything else in the directory (`state/`, the service's `.lock`, a
//! `notes.json` someone left) is never touched. Of the store's names:
//! - `<id>.json` with its `<id>.pftrace`: a capture;
//! - `.<id>.pftrace.tmp`: a capture in flight when the daemon died. Its whole
//!   packets are kept as a capture with status [`CRASH_STATUS`], metadata
//!   synthesised from the id (creation time, rule label); a file without a
//!   whole packet, or that is not a singly linked regular file, is removed;
//! - anything else of ours is a leftover and removed: metadata being
//!   written, metadata without its trace or unreadable, and a trace without
//!   metadata. The last is never salvaged: it may be a capture whose
//!   deletion (metadata first) was cut short, which must stay deleted.

use std::{
    collections::HashSet,
    fs,
    os::unix::fs::{MetadataExt, PermissionsExt},
    path::PathBuf,
};

use super::{
    io,
    meta::{self, classify, CaptureMeta, OwnId, OwnName, Record, Stamp, TriggerInfo},
    packets::{self, Stop},
    Store, StoreError, FILE_MODE,
};

/// Status of a capture salvaged from a daemon crash.
pub const CRASH_STATUS: &str = "cut: daemon crashed";

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
        for (id, path) in metas {
            let record: Option<Record> = fs::read(&path)
                .ok()
                .and_then(|b| serde_json::from_slice(&b).ok());
            match record {
                Some(r) if r.meta.id == id && traces.contains(&id) => {
                    self.captures.push(r.meta);
                    self.stamps.push(r.stamp);
                }
                _ => {
                    log::warn!(
                        "store: dropping unreadable or orphaned metadata {}",
                        path.display()
                    );
                    junk.push(path);
                }
            }
        }
        for id in &traces {
            if !self.captures.iter().any(|c| &c.id == id) {
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
                    log::warn!(
                        "store: salvaged {id} ({} bytes) from a crashed capture",
                        m.trace_bytes
                    );
                    self.counters.salvaged_after_crash += 1;
                    self.captures.push(m);
                    self.stamps.push(s);
                }
                Ok(None) => junk.push(path),
                Err(e) => {
                    log::warn!("store: not salvaging {}: {e}", path.display());
                    junk.push(path);
                }
            }
        }
        for p in &junk {
            log::info!("store: removing leftover {}", p.display());
            let _ = fs::remove_file(p);
            self.counters.repaired_leftovers += 1;
        }
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

    /// Keeps the whole packets of an interrupted recording as a capture;
    /// `None` when there is not one.
    fn salvage(
        &self,
        own: &OwnId,
        id: &str,
        tmp: &std::path::Path,
    ) -> Result<Option<(CaptureMeta, Stamp)>, StoreError> {
        let f = packets::open_trace(tmp)?;
        let limit = self.max_capture_bytes();
        let scan = packets::cut(&f, tmp, limit)?;
        if scan.whole_bytes == 0 {
            return Ok(None);
        }
        let st = f.metadata().map_err(io("fstat", tmp))?;
        // The last write, on the wall clock: 0 if it reads before creation.
        let mtime_ms =
            (st.mtime().max(0) as u64) * 1000 + st.mtime_nsec().max(0) as u64 / 1_000_000;
        let mut m = CaptureMeta {
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
            trace_bytes: scan.whole_bytes,
            status: CRASH_STATUS.into(),
            heapprofd: None,
            backend: None,
        };
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
            // Back under its temporary name, which the caller removes.
            let _ = fs::rename(&trace, tmp);
            return Err(e);
        }
        Ok(Some((m, stamp)))
    }
}
