//! Which captures go, and when: age, count, quota.
//!
//! Order is the persisted sequence number (never the wall clock), and age
//! comes from [`super::clock`], so clock jumps neither expire nor misorder.
//!
//! Policy, applied after each commit and at each periodic pass:
//! 1. captures older than `max_age` go (an age that a clock jump made
//!    unknowable restarts instead, see `clock.rs`);
//! 2. then, while over `max_captures` or `quota_bytes` (which counts
//!    `heapprofd/` too), the oldest capture goes, except:
//!    - the capture just committed;
//!    - the newest other capture, if it fits in half the quota. A capture
//!      keeps at most half the quota (the store cuts it), so these two always
//!      fit together: one capture can never empty the store. Only
//!      `max_captures = 1` evicts it, on count;
//!    - when a manual capture needs room, other manual captures go first
//!      (oldest first), and rule-triggered ones only once no manual one is
//!      left; the protected capture is then the newest rule-triggered one.
//!
//! Eviction stops as soon as the limits hold: a capture never evicts more
//! than it needs. Bytes in `heapprofd/` beyond what eviction may free (a
//! session in flight) leave the store over quota until they are stored or
//! found stale.

use super::{
    clock::{self, Check, ClockReading},
    Store,
};

/// Why a capture was removed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Reason {
    Age,
    Count,
    Quota,
}

impl Store {
    /// The capture eviction must keep besides `new` (an index), as above.
    pub(super) fn protected(&self, new: Option<usize>, manual: bool) -> Option<usize> {
        let others = || {
            (0..self.captures.len())
                .rev()
                .filter(move |&i| Some(i) != new)
        };
        let newest = if manual {
            others()
                .find(|&i| !self.captures[i].trigger.is_manual())
                .or_else(|| others().next())
        } else {
            others().next()
        };
        newest.filter(|&i| self.captures[i].trace_bytes <= self.effective_quota_bytes() / 2)
    }

    /// The next capture to evict, oldest first, manual ones first for a
    /// manual `new`; never `new` or `protected`.
    pub(super) fn next_victim(
        &self,
        new: Option<usize>,
        protected: Option<usize>,
        manual: bool,
    ) -> Option<usize> {
        let mut candidates =
            (0..self.captures.len()).filter(|&i| Some(i) != new && Some(i) != protected);
        if manual {
            let mut manual_ones = candidates
                .clone()
                .filter(|&i| self.captures[i].trigger.is_manual());
            if let Some(i) = manual_ones.next() {
                return Some(i);
            }
        }
        candidates.next()
    }

    /// Removes capture `i`'s files and entry, counting why.
    pub(super) fn evict(&mut self, i: usize, reason: Reason) {
        let id = self.captures[i].id.clone();
        log::info!("store: evicting {id} ({reason:?})");
        self.remove_files(&id);
        self.captures.remove(i);
        self.stamps.remove(i);
        match reason {
            Reason::Age => self.counters.expired += 1,
            Reason::Count => self.counters.evicted_over_count += 1,
            Reason::Quota => self.counters.evicted_over_quota += 1,
        }
    }

    fn index_of(&self, id: Option<&str>) -> Option<usize> {
        id.and_then(|id| self.captures.iter().position(|c| c.id == id))
    }

    /// Bytes the quota counts: traces and `heapprofd/`.
    pub(super) fn used_bytes(&self) -> u64 {
        self.total_trace_bytes().saturating_add(self.spill.bytes)
    }

    /// Applies the policy; `new` is the capture just committed. Returns
    /// whether the index changed.
    pub(super) fn enforce_limits(&mut self, new: Option<&str>) -> bool {
        let now = self.clock.now();
        let mut changed = self.settle_clock(&now);
        let removed = self
            .spill
            .scan(&self.heapprofd_dir(), now.boottime_ms, false);
        self.counters.heapprofd_files_removed += removed;

        let mut i = 0;
        while i < self.captures.len() {
            if Some(self.captures[i].id.as_str()) != new
                && self.age_ms(i, &now) > self.limits.max_age_ms
            {
                self.evict(i, Reason::Age);
                changed = true;
            } else {
                i += 1;
            }
        }

        let manual = self
            .index_of(new)
            .is_some_and(|i| self.captures[i].trigger.is_manual());
        // Eviction frees as much room as it takes from `used`: the quota
        // in force stays what it is now (`space.rs`).
        let quota = self.quota_now(0);
        loop {
            let over_count = self.captures.len() > self.limits.max_captures;
            if !over_count && self.used_bytes() <= quota {
                break;
            }
            let n = self.index_of(new);
            let protected = self.protected(n, manual);
            let victim = self.next_victim(n, protected, manual).or(match over_count {
                // max_captures = 1: the count is a hard limit.
                true => protected,
                false => None,
            });
            let Some(v) = victim else {
                log::info!(
                    "store: {} bytes over the quota of {} ({} in {}/), nothing more to evict",
                    self.used_bytes().saturating_sub(quota),
                    quota,
                    self.spill.bytes,
                    super::HEAPPROFD_DIR,
                );
                break;
            };
            self.evict(
                v,
                if over_count {
                    Reason::Count
                } else {
                    Reason::Quota
                },
            );
            changed = true;
        }
        changed
    }

    /// Capture `i`'s age; 0 when its basis is not (yet) trusted.
    fn age_ms(&self, i: usize, now: &ClockReading) -> u64 {
        let basis = self.stamps[i].basis_or(&self.captures[i]);
        match clock::check(&basis, now) {
            Check::Fine => clock::age_ms(&basis, now),
            Check::Corrected(_) | Check::Unknowable => 0,
        }
    }

    /// Looks for a wall-clock jump (see `clock.rs`): corrects the wall stamp
    /// of this boot's captures, and restarts the age of other boots'
    /// captures when their wall-clock age cannot be trusted. Persists what
    /// changed; returns whether anything did.
    fn settle_clock(&mut self, now: &ClockReading) -> bool {
        let mut jumped = self.jumps.observe(now);
        let mut restart = vec![false; self.captures.len()];
        let mut dirty = vec![false; self.captures.len()];
        for i in 0..self.captures.len() {
            let basis = self.stamps[i].basis_or(&self.captures[i]);
            match clock::check(&basis, now) {
                Check::Fine => {}
                Check::Corrected(b) => {
                    log::warn!(
                        "store: the wall clock moved {} ms against CLOCK_BOOTTIME since {} was stamped; correcting its wall stamp",
                        i128::from(b.unix_ms) - i128::from(basis.unix_ms),
                        self.captures[i].id
                    );
                    self.stamps[i].age_basis = Some(b);
                    dirty[i] = true;
                    jumped = true;
                }
                Check::Unknowable => {
                    restart[i] = true;
                    jumped = true;
                }
            }
        }
        if jumped {
            self.counters.clock_jumps += 1;
            log::warn!(
                "store: wall-clock jump seen (now {} ms); ages of captures from other boots restart now",
                now.unix_ms
            );
            for (i, r) in restart.iter_mut().enumerate() {
                let basis = self.stamps[i].basis_or(&self.captures[i]);
                *r = *r || clock::other_boot(&basis, now);
            }
        }
        for i in 0..self.captures.len() {
            if restart[i] {
                self.stamps[i].age_basis = Some(super::AgeBasis::at(now));
                self.stamps[i].age_restarted = true;
                self.counters.age_restarts += 1;
                dirty[i] = true;
            }
            if dirty[i] {
                if let Err(e) = self.write_record(i) {
                    log::warn!("store: {e}");
                }
            }
        }
        dirty.contains(&true)
    }
}
