//! The filesystem's share in the quota: a store on a small or nearly full
//! filesystem must evict before the disk refuses its writes, whatever
//! `quota_bytes` says (a 2 MiB store under the default 256 MiB quota never
//! evicted, and its later captures became stubs).
//!
//! The effective quota is `min(quota_bytes, used + free - reserve)`, where
//! `used` is what the store holds (traces and `heapprofd/`, plus a
//! recording being committed), `free` is statvfs(3)'s space available to
//! unprivileged writers (`f_bavail`, so the root reserve of ext4 is never
//! counted on) and the reserve is left to the rest of the system: 5 % of
//! the filesystem, at most 500 MiB — Android's own low-storage threshold
//! (StorageManager.getStorageLowBytes: 5 %, capped at 500 MB). Files of
//! other writers on the filesystem so shrink the store (down to evicting
//! when less than the reserve is free), never the other way round. When
//! statvfs fails, `quota_bytes` alone counts. `room` below is
//! `free - reserve`.
//!
//! A recording needs its room before it is committed, so [`Store::begin`]
//! also evicts (oldest first, never the newest other capture) until the
//! room is at least the new capture's limit, half the effective quota.

use super::{evict::Reason, Store, MANUAL_RULES};

/// Android's low-storage threshold: 5 % of the filesystem, at most 500 MiB.
fn reserve_bytes(fs_bytes: u64) -> u64 {
    (fs_bytes / 20).min(500 << 20)
}

impl Store {
    /// statvfs(3) of the store's file system: (bytes available to
    /// unprivileged writers, the reserve); `None` when it fails.
    fn fs_space(&self) -> Option<(u64, u64)> {
        let st = nix::sys::statvfs::statvfs(&self.dir)
            .inspect_err(|e| log::debug!("store: statvfs {}: {e}", self.dir.display()))
            .ok()?;
        let frsize = st.fragment_size() as u64;
        let avail = (st.blocks_available() as u64).saturating_mul(frsize);
        let size = (st.blocks() as u64).saturating_mul(frsize);
        Some((avail, reserve_bytes(size)))
    }

    /// Bytes the store may still write on its file system (`room` above,
    /// 0 when less than the reserve is free); `None` when statvfs fails.
    pub(super) fn fs_room_bytes(&self) -> Option<u64> {
        self.fs_space()
            .map(|(avail, reserve)| avail.saturating_sub(reserve))
    }

    /// The quota in force now, with `in_flight_bytes` of a recording being
    /// committed counted as the store's (its file already takes its room).
    /// Below what the store holds when less than the reserve is free.
    pub(super) fn quota_now(&self, in_flight_bytes: u64) -> u64 {
        let q = self.limits.quota_bytes;
        match self.fs_space() {
            Some((avail, reserve)) => q.min(
                self.used_bytes()
                    .saturating_add(in_flight_bytes)
                    .saturating_add(avail)
                    .saturating_sub(reserve),
            ),
            None => q,
        }
    }

    /// The quota in force now: `quota_bytes`, or less on a filesystem
    /// without room for it (see the module's doc).
    pub fn effective_quota_bytes(&self) -> u64 {
        self.quota_now(0)
    }

    /// Before a recording starts: evicts until the filesystem has room for
    /// the most it may keep (`limit_bytes`), never the newest other capture.
    pub(super) fn make_room(&mut self, label: &str, limit_bytes: u64) {
        let manual = MANUAL_RULES.contains(&label);
        let mut changed = false;
        while self.fs_room_bytes().is_some_and(|room| room < limit_bytes) {
            let protected = self.protected(None, manual);
            let Some(victim) = self.next_victim(None, protected, manual) else {
                break;
            };
            self.evict(victim, Reason::Quota);
            changed = true;
        }
        if changed {
            self.refresh_index();
        }
    }
}
