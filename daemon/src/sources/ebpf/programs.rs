//! The always-on programs, held once: the pipeline's eBPF room reads their
//! maps each tick, and a recording switches their capture tier on and
//! drains it (one set of programs: a daemon capture that loaded its own
//! object ran every always-on program twice per event, #14). One reader
//! drains EXITED (`Accounting::read` deletes a freed task's final counters
//! once read), so every freed task is folded exactly once.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use crate::bpf::Accounting;

/// A handle on the loaded programs and maps; clones share them.
#[derive(Clone)]
pub struct Programs(Arc<Mutex<Accounting>>);

impl Programs {
    pub fn new(acc: Accounting) -> Self {
        Self(Arc::new(Mutex::new(acc)))
    }

    /// Runs `f` on the accounting, holding it for that long (a map read,
    /// the capture flag, the loss counters, the stack map).
    pub fn with<R>(&self, f: impl FnOnce(&mut Accounting) -> R) -> R {
        f(&mut self.lock())
    }

    /// A thread that panicked while holding the lock left the maps as they
    /// were (reads and flag writes are single syscalls): carry on.
    fn lock(&self) -> MutexGuard<'_, Accounting> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}
