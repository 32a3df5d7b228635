//! The (wakee, waker) pairs through WAKERS' mapping, no bpf() call (the
//! programs' `offcpu` module has the layout). Each read folds the half
//! the programs left at the previous read (none writes it any more: a
//! sched_waking program runs for microseconds with interrupts off, a
//! tick is a second) into `Mappings::waker_totals` and zeroes it, makes
//! it the active half, then adds what the half it just left holds so far:
//! the pairs come out cumulative and current, as the WAKERS hash's did.
//! Ended wakees are forgotten here, with no delete in the kernel.

use std::{
    collections::HashMap,
    sync::atomic::{fence, Ordering},
};

use vitals_common::{names, WakerCounters, WakerKey, WakerSlot};

use super::super::{mapped::MappedArray, Accounting, BpfError};

/// Folds in which an ended wakee's pairs are still dropped: the half
/// being left when it was forgotten and the half active then.
const FORGET_FOLDS: u8 = 2;

impl Accounting {
    /// Maps WAKERS and WAKER_HALF writable (off-CPU accounting on only).
    pub(super) fn map_wakers(&mut self) -> Result<(), BpfError> {
        if self.offcpu().is_none() || self.mappings().wakers.is_some() {
            return Ok(());
        }
        let slots = MappedArray::open_writable(self.map(names::WAKERS)?, names::WAKERS)?;
        let half = MappedArray::open_writable(self.map(names::WAKER_HALF)?, names::WAKER_HALF)?;
        let m = self.mappings_mut();
        m.wakers = Some(slots);
        m.waker_half = Some(half);
        Ok(())
    }

    /// Every pair's cumulative wakeups and blocked time (see the module).
    pub(super) fn read_wakers(&mut self) -> HashMap<WakerKey, WakerCounters> {
        let max_pairs = self.offcpu().map_or(0, |o| o.max_waker_pairs) as usize;
        let m = self.mappings_mut();
        let (Some(slots), Some(half)) = (m.wakers.as_ref(), m.waker_half.as_ref()) else {
            return HashMap::new();
        };
        let half_len = slots.entries() / 2;
        let active = half.copy(0) & 1;
        let left = active ^ 1;
        let mut dropped = 0;
        for i in left * half_len..(left + 1) * half_len {
            let s = slots.copy(i);
            if s.key.wakee_tgid == 0 {
                continue;
            }
            dropped += add_pair(&mut m.waker_totals, max_pairs, &s);
            slots.write(i, WakerSlot::default());
        }
        m.wakers_dropped += dropped;
        for (tgid, folds) in m.wakers_forgotten.iter_mut() {
            m.waker_totals.retain(|k, _| k.wakee_tgid != *tgid);
            *folds -= 1;
        }
        m.wakers_forgotten.retain(|(_, folds)| *folds > 0);
        // The zeroes land before the programs can see the new index (a
        // release store; the programs' slot address depends on the
        // index they load, which orders their accesses after it).
        fence(Ordering::Release);
        half.write(0, left);
        let mut out = m.waker_totals.clone();
        for i in active * half_len..(active + 1) * half_len {
            let s = slots.read_stable(i);
            let forgotten = m
                .wakers_forgotten
                .iter()
                .any(|(t, _)| *t == s.key.wakee_tgid);
            if s.key.wakee_tgid != 0 && !forgotten {
                // Not counted as dropped: the fold at the next read does.
                add_pair(&mut out, max_pairs, &s);
            }
        }
        out
    }

    /// Wakeups of pairs the totals had no room for (`WAKER_MAP_FULL`).
    pub(super) fn wakers_dropped(&self) -> u64 {
        self.mappings().wakers_dropped
    }

    /// Forgets the pairs whose wakee process has ended, so the bounded
    /// totals keep room for live ones; their wakeups still in WAKERS are
    /// dropped for `FORGET_FOLDS` reads (a new process that takes the
    /// tgid that soon loses as much).
    pub fn forget_wakers(&mut self, ended_wakees: &[u32]) {
        if self.offcpu().is_none() || ended_wakees.is_empty() {
            return;
        }
        let m = self.mappings_mut();
        m.waker_totals
            .retain(|k, _| !ended_wakees.contains(&k.wakee_tgid));
        m.wakers_forgotten
            .retain(|(t, _)| !ended_wakees.contains(t));
        m.wakers_forgotten
            .extend(ended_wakees.iter().map(|&t| (t, FORGET_FOLDS)));
    }
}

/// Adds a slot's counts to its pair in `totals`; returns its wakeups if
/// the pair is new and `totals` already holds `max_pairs` pairs.
fn add_pair(totals: &mut HashMap<WakerKey, WakerCounters>, max_pairs: usize, s: &WakerSlot) -> u64 {
    if !totals.contains_key(&s.key) && totals.len() >= max_pairs {
        return s.counters.wakeups;
    }
    let t = totals.entry(s.key).or_default();
    t.wakeups = t.wakeups.wrapping_add(s.counters.wakeups);
    t.blocked_ns = t.blocked_ns.wrapping_add(s.counters.blocked_ns);
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slot(wakee_tgid: u32, waker_tgid: u32, wakeups: u64, blocked_ns: u64) -> WakerSlot {
        WakerSlot {
            key: WakerKey {
                wakee_tgid,
                waker_tgid,
            },
            counters: WakerCounters {
                wakeups,
                blocked_ns,
            },
        }
    }

    #[test]
    fn pairs_add_up_across_cpus_and_a_full_table_drops_only_new_pairs() {
        let mut totals = HashMap::new();
        // The same pair from two CPUs' regions sums.
        assert_eq!(add_pair(&mut totals, 2, &slot(7, 9, 2, 30)), 0);
        assert_eq!(add_pair(&mut totals, 2, &slot(7, 9, 3, 40)), 0);
        assert_eq!(add_pair(&mut totals, 2, &slot(8, 9, 1, 5)), 0);
        // Full: a new pair's wakeups are dropped, a known one still adds.
        assert_eq!(add_pair(&mut totals, 2, &slot(9, 1, 4, 50)), 4);
        assert_eq!(add_pair(&mut totals, 2, &slot(8, 9, 1, 5)), 0);
        let get = |w, k| {
            totals[&WakerKey {
                wakee_tgid: w,
                waker_tgid: k,
            }]
        };
        assert_eq!(
            get(7, 9),
            WakerCounters {
                wakeups: 5,
                blocked_ns: 70
            }
        );
        assert_eq!(
            get(8, 9),
            WakerCounters {
                wakeups: 2,
                blocked_ns: 10
            }
        );
        assert_eq!(totals.len(), 2);
    }
}
