//! The (pid, starttime) instance table: what the per-task sources keep
//! per task is keyed by pid, but a process instance is (pid, starttime),
//! so pid reuse never yields a delta across two different processes. A
//! pid's instance ends when it is seen with another starttime (the pid was
//! reused) or when a scan no longer sees it (it exited); a task whose
//! files could not be read is kept, without a baseline.

use std::collections::HashMap;

/// One task instance and what its owner keeps for it.
#[derive(Debug, Clone)]
pub struct Instance<T> {
    pub starttime_ticks: u64,
    /// False after a read failure: the next good read re-baselines without
    /// a delta, since the gap spans more than one window.
    pub baseline_valid: bool,
    /// The last generation (scan) that saw it.
    seen: u64,
    pub value: T,
}

/// What the table held for a pid before this scan's instance.
pub enum Prior<T> {
    /// The same instance (same starttime): its entry as last seen.
    Same(Instance<T>),
    /// Another instance: the pid was reused, the old one is gone.
    Reused(Instance<T>),
    /// First sight of the pid.
    New,
}

/// Instances keyed by pid (or tid), with removal detection by generation.
#[derive(Debug)]
pub struct InstanceTable<T> {
    entries: HashMap<i32, Instance<T>>,
}

impl<T> Default for InstanceTable<T> {
    fn default() -> Self {
        Self {
            entries: HashMap::new(),
        }
    }
}

impl<T> InstanceTable<T> {
    /// Records `value` as the instance (`pid`, `starttime_ticks`) seen in
    /// `generation`; returns what the pid held before and the new entry.
    pub fn observe(
        &mut self,
        pid: i32,
        starttime_ticks: u64,
        generation: u64,
        value: T,
    ) -> (Prior<T>, &mut Instance<T>) {
        let fresh = Instance {
            starttime_ticks,
            baseline_valid: true,
            seen: generation,
            value,
        };
        let prior = match self.entries.insert(pid, fresh) {
            Some(old) if old.starttime_ticks == starttime_ticks => Prior::Same(old),
            Some(old) => Prior::Reused(old),
            None => Prior::New,
        };
        let entry = self.entries.get_mut(&pid).expect("just inserted");
        (prior, entry)
    }

    /// Keeps an unreadable instance alive, without a baseline.
    pub fn mark_unreadable(&mut self, pid: i32, generation: u64) {
        if let Some(e) = self.entries.get_mut(&pid) {
            e.baseline_valid = false;
            e.seen = generation;
        }
    }

    /// Everything not seen in `generation` has exited: handed to `gone`
    /// and forgotten.
    pub fn sweep(&mut self, generation: u64, mut gone: impl FnMut(i32, Instance<T>)) {
        let exited: Vec<i32> = self
            .entries
            .iter()
            .filter(|(_, e)| e.seen != generation)
            .map(|(pid, _)| *pid)
            .collect();
        for pid in exited {
            if let Some(e) = self.entries.remove(&pid) {
                gone(pid, e);
            }
        }
    }
}

#[cfg(test)]
mod tests;
