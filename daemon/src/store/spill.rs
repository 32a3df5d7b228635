//! `heapprofd/`: where perfetto writes heapprofd sessions before the service
//! moves them into the store.
//!
//! It is the one directory the policy lets the perfetto domain write
//! (sepolicy: vitalsd_heapprofd_data_file), so nothing in it is trusted:
//! entries are looked at with lstat, never followed, and only removed. Its
//! regular files count in the store's quota (a session's output is up to
//! about 64 MiB before it becomes a capture), and the store removes:
//! - at start, everything in it: no session outlives the daemon that ran it;
//! - while running, any file it has seen for longer than a session can live
//!   ([`DEFAULT_STALE_AFTER_MS`], settable): a crash of the perfetto client or
//!   a failed rename would otherwise leave it forever.
//!
//! "Seen for" is measured on CLOCK_BOOTTIME from the first scan that listed
//! the file, not from its mtime: a wall-clock jump must not delete the output
//! of a session in flight.

use std::{collections::HashMap, ffi::OsString, fs, os::unix::fs::MetadataExt, path::Path};

/// The subdirectory perfetto writes into.
pub const HEAPPROFD_DIR: &str = "heapprofd";

/// The longest a heapprofd session's file may sit in `heapprofd/`: the
/// longest session config allows (`config::MAX_CAPTURE_DURATION`) plus
/// traced's start and flush timeouts, with room to spare.
pub const DEFAULT_STALE_AFTER_MS: u64 =
    crate::config::MAX_CAPTURE_DURATION.as_millis() as u64 + 30 * 60 * 1000;

/// What the store knows of `heapprofd/`.
#[derive(Debug)]
pub struct Spill {
    /// Name → (inode, CLOCK_BOOTTIME ms of the first scan that saw it).
    seen: HashMap<OsString, (u64, u64)>,
    /// Bytes of its regular files at the last scan.
    pub bytes: u64,
    pub stale_after_ms: u64,
}

impl Default for Spill {
    fn default() -> Self {
        Self {
            seen: HashMap::new(),
            bytes: 0,
            stale_after_ms: DEFAULT_STALE_AFTER_MS,
        }
    }
}

impl Spill {
    /// Lists `dir`, removing stale entries (all of them with `remove_all`),
    /// and counts the bytes of what is left. Returns how many were removed.
    pub fn scan(&mut self, dir: &Path, now_boottime_ms: u64, remove_all: bool) -> u64 {
        let entries = match fs::read_dir(dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                self.seen.clear();
                self.bytes = 0;
                return 0;
            }
            Err(e) => {
                log::warn!("store: listing {}: {e}", dir.display());
                return 0;
            }
        };
        let mut seen = HashMap::new();
        let mut bytes = 0u64;
        let mut removed = 0u64;
        for e in entries.flatten() {
            let name = e.file_name();
            // DirEntry::metadata is lstat: a symlink is looked at, not followed.
            let Ok(st) = e.metadata() else { continue };
            if st.is_dir() {
                log::debug!("store: leaving directory {}", e.path().display());
                continue;
            }
            let first_seen = match self.seen.get(&name) {
                Some(&(ino, t)) if ino == st.ino() && t <= now_boottime_ms => t,
                _ => now_boottime_ms,
            };
            if remove_all || now_boottime_ms - first_seen > self.stale_after_ms {
                remove(&e.path(), st.len());
                removed += 1;
                continue;
            }
            if st.is_file() {
                bytes += st.len();
            }
            seen.insert(name, (st.ino(), first_seen));
        }
        self.seen = seen;
        self.bytes = bytes;
        removed
    }
}

/// Unlinks a stale entry (unlink never follows a symlink).
fn remove(path: &Path, len: u64) {
    log::info!("store: removing stale {} ({len} bytes)", path.display());
    if let Err(e) = fs::remove_file(path) {
        log::warn!("store: removing {}: {e}", path.display());
    }
}
