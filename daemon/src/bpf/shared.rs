//! One set of programs for several readers: the daemon's sampling tick and
//! a capture's recording read the same `Accounting` (issue #14: a capture
//! that loaded its own object ran every always-on program twice).
//!
//! Reading the counters is harmless to share, but `Accounting::read`
//! drains EXITED (a freed task's final counters are deleted once read), so
//! a record one reader drains is queued for every other reader and handed
//! to it with its next read. Each reader therefore sees every freed task
//! exactly once, and always in a read no older than the drain: the
//! record's task left TASKS before the drain, so no reader's later TASKS
//! walk can see it alive again.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use vitals_common::{ExitKey, ExitedTask};

use super::{Accounting, BpfError, BpfSnapshot};

type Exited = Vec<(ExitKey, ExitedTask)>;

/// The loaded programs and maps, shared by the readers made from it.
pub struct SharedAccounting {
    inner: Mutex<Inner>,
}

struct Inner {
    acc: Accounting,
    /// Per reader slot: freed tasks other readers drained since this
    /// reader's last read. None: a free slot.
    pending: Vec<Option<Exited>>,
}

/// One reader of a [`SharedAccounting`]; its slot is freed on drop.
pub struct AccountingReader {
    shared: Arc<SharedAccounting>,
    slot: usize,
}

impl SharedAccounting {
    pub fn new(acc: Accounting) -> Arc<Self> {
        Arc::new(Self {
            inner: Mutex::new(Inner {
                acc,
                pending: Vec::new(),
            }),
        })
    }

    /// A new reader: it gets the freed tasks drained from now on.
    pub fn reader(self: &Arc<Self>) -> AccountingReader {
        let mut g = self.lock();
        let slot = match g.pending.iter().position(Option::is_none) {
            Some(i) => i,
            None => {
                g.pending.push(None);
                g.pending.len() - 1
            }
        };
        g.pending[slot] = Some(Vec::new());
        AccountingReader {
            shared: Arc::clone(self),
            slot,
        }
    }

    /// Runs `f` on the accounting, holding it for that long (the capture
    /// flag, the loss counters, the stack map), without a reader's slot.
    pub fn with<R>(&self, f: impl FnOnce(&mut Accounting) -> R) -> R {
        f(&mut self.lock().acc)
    }

    /// A reader that panicked while holding the lock left the maps as
    /// they were (reads and flag writes are single syscalls): carry on.
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl AccountingReader {
    /// `Accounting::read`, with the freed tasks the other readers drained
    /// since this reader's last read put in front of its own.
    pub fn read(&self) -> Result<BpfSnapshot, BpfError> {
        let mut g = self.shared.lock();
        let mut snap = g.acc.read()?;
        let mine = fan_out(&mut g.pending, self.slot, &snap.exited);
        snap.exited.splice(0..0, mine);
        Ok(snap)
    }

    /// Another reader of the same accounting (a capture's, beside the
    /// daemon's tick).
    pub fn another(&self) -> AccountingReader {
        self.shared.reader()
    }

    /// The programs this reader reads, for what does not read them (a
    /// recording's capture tier).
    pub fn programs(&self) -> Arc<SharedAccounting> {
        Arc::clone(&self.shared)
    }

    /// Runs `f` on the accounting, holding it for that long (the capture
    /// flag, the loss counters, the stack map).
    pub fn with<R>(&self, f: impl FnOnce(&mut Accounting) -> R) -> R {
        f(&mut self.shared.lock().acc)
    }
}

impl Drop for AccountingReader {
    fn drop(&mut self) {
        self.shared.lock().pending[self.slot] = None;
    }
}

/// Queues `drained` for every reader but `slot` and takes what was queued
/// for `slot`.
fn fan_out(pending: &mut [Option<Exited>], slot: usize, drained: &Exited) -> Exited {
    for (i, q) in pending.iter_mut().enumerate() {
        if let (Some(q), true) = (q.as_mut(), i != slot) {
            q.extend_from_slice(drained);
        }
    }
    pending
        .get_mut(slot)
        .and_then(Option::as_mut)
        .map(std::mem::take)
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exited(tid: u32) -> (ExitKey, ExitedTask) {
        let key = ExitKey {
            tid,
            ..ExitKey::default()
        };
        (key, ExitedTask::default())
    }

    fn tids(v: &Exited) -> Vec<u32> {
        v.iter().map(|(k, _)| k.tid).collect()
    }

    #[test]
    fn every_reader_gets_each_drained_task_once() {
        // Slots 0 and 2 read; slot 1 is free.
        let mut pending = vec![Some(Vec::new()), None, Some(Vec::new())];
        // Reader 0 drains 7 and 8: nothing was queued for it.
        assert!(fan_out(&mut pending, 0, &vec![exited(7), exited(8)]).is_empty());
        assert!(pending[1].is_none(), "a free slot gets nothing");
        // Reader 2 drains 9: it gets 7 and 8 from reader 0.
        assert_eq!(tids(&fan_out(&mut pending, 2, &vec![exited(9)])), [7, 8]);
        // Reader 0 gets 9, and reader 2 nothing more.
        assert_eq!(tids(&fan_out(&mut pending, 0, &Vec::new())), [9]);
        assert!(fan_out(&mut pending, 2, &Vec::new()).is_empty());
    }
}
