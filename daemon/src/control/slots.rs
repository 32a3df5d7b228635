//! Connection slots of the control socket, per peer uid.
//!
//! A slot is held from accept to close, but a connection that is only
//! waiting for (or still receiving) a request is *idle* and can be evicted:
//! when a uid is at its limit, its oldest idle connection is closed to make
//! room, and the same across uids at the total limit. So idle connections
//! can neither starve their own uid's next request nor another uid's (a
//! bugreport's `vitalsctl dump`); only connections whose requests are being
//! served hold their slot for sure.

use std::{
    collections::HashMap,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex,
    },
    time::Duration,
};

use tokio::sync::Notify;

/// Connections one uid may hold at once.
pub const PER_UID: usize = 16;
/// Connections held at once over all uids.
pub const TOTAL: usize = 64;
/// A connection that sends no request for this long is closed.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(30);
/// Descriptors below RLIMIT_NOFILE kept for the daemon's own work
/// (procfs reads, BPF maps and perf events, captures, the store): no peer
/// can have them.
pub const FD_RESERVE: u64 = 256;
/// Connections open at once beyond the slots: room to admit (or refuse)
/// a new peer while every slot is held.
pub const ADMISSION: usize = 16;

/// How many connections the socket may have open, from RLIMIT_NOFILE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FdBudget {
    /// Accepted connections open at once (the accept loop waits past it,
    /// peers queue in the kernel's backlog, which costs us no descriptor).
    pub open: usize,
    /// Slots over all uids (`TOTAL`, less when the limit is low).
    pub total: usize,
    /// Slots of one uid.
    pub per_uid: usize,
}

impl FdBudget {
    /// The budget under a soft RLIMIT_NOFILE of `nofile`: what is left
    /// after `FD_RESERVE`, at most `TOTAL + ADMISSION`, at least 2.
    pub fn from_nofile(nofile: u64) -> Self {
        let room = nofile.saturating_sub(FD_RESERVE);
        let open = room.clamp(2, (TOTAL + ADMISSION) as u64) as usize;
        let admission = (open / 5).max(1);
        let total = open - admission;
        Self {
            open,
            total,
            per_uid: PER_UID.min(total),
        }
    }

    /// The budget under this process's soft RLIMIT_NOFILE.
    pub fn of_this_process() -> (Self, u64) {
        let nofile = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
            .map(|(soft, _)| soft)
            .unwrap_or(1024);
        (Self::from_nofile(nofile), nofile)
    }
}

struct Conn {
    id: u64,
    idle: Arc<AtomicBool>,
    evict: Arc<Notify>,
}

struct Inner {
    per_uid: usize,
    total_max: usize,
    next_id: u64,
    /// Per uid, oldest first.
    by_uid: HashMap<u32, Vec<Conn>>,
    total: usize,
}

impl Inner {
    /// Closes the oldest idle connection of `uid` (any uid if None).
    fn evict_oldest_idle(&mut self, uid: Option<u32>) -> bool {
        let mut oldest: Option<(u32, usize, u64)> = None;
        for (&u, conns) in &self.by_uid {
            if uid.is_some_and(|want| want != u) {
                continue;
            }
            if let Some(i) = conns.iter().position(|c| c.idle.load(Ordering::Acquire)) {
                if oldest.is_none_or(|(_, _, id)| conns[i].id < id) {
                    oldest = Some((u, i, conns[i].id));
                }
            }
        }
        let Some((u, i, _)) = oldest else {
            return false;
        };
        let conn = self.by_uid.get_mut(&u).map(|v| v.remove(i));
        if let Some(c) = conn {
            c.evict.notify_one();
            self.total -= 1;
        }
        true
    }
}

/// Why a connection got no slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Full {
    /// This uid holds `PER_UID` connections, all busy with requests.
    Uid,
    /// `TOTAL` connections are held, all busy with requests.
    Total,
}

pub struct Slots {
    inner: Mutex<Inner>,
}

impl Default for Slots {
    fn default() -> Self {
        Self::new(PER_UID, TOTAL)
    }
}

/// A held slot; dropping it frees it.
pub struct Slot {
    slots: Arc<Slots>,
    uid: u32,
    id: u64,
    idle: Arc<AtomicBool>,
    /// Notified when this connection is evicted to make room.
    pub evict: Arc<Notify>,
}

impl Slot {
    /// Idle: waiting for or receiving a request, evictable.
    pub fn set_idle(&self, idle: bool) {
        self.idle.store(idle, Ordering::Release);
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut inner = self.slots.inner.lock().unwrap();
        if let Some(conns) = inner.by_uid.get_mut(&self.uid) {
            if let Some(i) = conns.iter().position(|c| c.id == self.id) {
                conns.remove(i);
                inner.total -= 1;
            }
        }
    }
}

impl Slots {
    /// Slots for at most `per_uid` connections of one uid, `total` in all.
    pub fn new(per_uid: usize, total: usize) -> Self {
        Self {
            inner: Mutex::new(Inner {
                per_uid,
                total_max: total,
                next_id: 0,
                by_uid: HashMap::new(),
                total: 0,
            }),
        }
    }

    /// A slot for a new connection of `uid`, evicting idle connections as
    /// needed; Err when every connection in the way is busy. Returns how
    /// many idle connections were evicted.
    pub fn take(self: &Arc<Self>, uid: u32) -> Result<(Slot, u64), Full> {
        let mut inner = self.inner.lock().unwrap();
        let mut evicted = 0;
        if inner.by_uid.get(&uid).map_or(0, Vec::len) >= inner.per_uid {
            if !inner.evict_oldest_idle(Some(uid)) {
                return Err(Full::Uid);
            }
            evicted += 1;
        }
        if inner.total >= inner.total_max {
            if !inner.evict_oldest_idle(None) {
                return Err(Full::Total);
            }
            evicted += 1;
        }
        inner.next_id += 1;
        let id = inner.next_id;
        // New connections start idle: nothing to serve yet.
        let idle = Arc::new(AtomicBool::new(true));
        let evict = Arc::new(Notify::new());
        inner.by_uid.entry(uid).or_default().push(Conn {
            id,
            idle: Arc::clone(&idle),
            evict: Arc::clone(&evict),
        });
        inner.total += 1;
        Ok((
            Slot {
                slots: Arc::clone(self),
                uid,
                id,
                idle,
                evict,
            },
            evicted,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fd_budget_keeps_the_reserve_and_room_to_admit() {
        // A systemd default soft limit: the whole budget fits.
        let b = FdBudget::from_nofile(1024);
        assert_eq!(
            (b.open, b.total, b.per_uid),
            (TOTAL + ADMISSION, TOTAL, PER_UID)
        );
        // A low limit: the reserve first, slots shrink, admission stays.
        let b = FdBudget::from_nofile(FD_RESERVE + 40);
        assert_eq!((b.open, b.total, b.per_uid), (40, 32, PER_UID));
        let b = FdBudget::from_nofile(10);
        assert_eq!((b.open, b.total, b.per_uid), (2, 1, 1));
    }

    #[test]
    fn idle_connections_make_room_and_busy_ones_keep_it() {
        let slots = Arc::new(Slots::default());
        let mut held: Vec<Slot> = (0..PER_UID).map(|_| slots.take(0).unwrap().0).collect();
        // All idle: the next of uid 0 evicts the oldest.
        let (newer, evicted) = slots.take(0).unwrap();
        assert_eq!(evicted, 1);
        // The evicted one was told; its own drop then frees nothing twice.
        let first = held.remove(0);
        assert!(Arc::strong_count(&first.evict) >= 1);
        drop(first);
        assert_eq!(slots.inner.lock().unwrap().total, PER_UID);
        // Busy connections are never evicted.
        for s in &held {
            s.set_idle(false);
        }
        newer.set_idle(false);
        assert_eq!(slots.take(0).err(), Some(Full::Uid));
        // Another uid still gets in: the limit is per uid.
        assert!(slots.take(2000).is_ok());
    }

    #[test]
    fn the_total_limit_evicts_idle_connections_of_any_uid() {
        let slots = Arc::new(Slots::default());
        let mut held = Vec::new();
        for uid in 0..(TOTAL / PER_UID) as u32 {
            for _ in 0..PER_UID {
                let (s, _) = slots.take(uid).unwrap();
                s.set_idle(uid != 0);
                held.push(s);
            }
        }
        // Full: a new uid evicts an idle connection of another uid, never
        // one of uid 0's busy ones.
        let (_s, evicted) = slots.take(4242).unwrap();
        assert_eq!(evicted, 1);
        let inner = slots.inner.lock().unwrap();
        assert_eq!(inner.by_uid[&0].len(), PER_UID);
        assert_eq!(inner.total, TOTAL);
    }
}
