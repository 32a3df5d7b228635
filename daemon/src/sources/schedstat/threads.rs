//! Reading one process's threads: each thread's schedstat (and its
//! status when it may have switched), with a backoff per thread so quiet
//! threads of a busy process are not re-read every scan.

use super::{
    is_vanished, list_numeric, parse_ctxt_switches, parse_schedstat, ProcessState, SchedProcfs,
    ThreadCounters, ThreadState, ThreadsRead, MAX_BACKOFF_SCANS,
};

impl SchedProcfs {
    /// Reads the threads of `pid`: every one when `full` or when its thread
    /// set changed, else those whose backoff is up. Threads no longer
    /// listed are folded into the process's exited counters.
    pub(super) fn read_threads(
        &mut self,
        pid: u32,
        st: &mut ProcessState,
        full: bool,
    ) -> ThreadsRead {
        let generation = self.generation;
        let mut tids = std::mem::take(&mut self.tids);
        // Split borrows: the path buffer and the dirent buffer, no copy.
        let listed = list_numeric(
            self.path.set(format_args!("/{pid}/task")),
            &mut self.dirent_buf,
            &mut tids,
        );
        if let Err(e) = listed {
            if !is_vanished(&e) {
                log::debug!("listing {}: {e}", self.path.get().display());
            }
            // Unreadable, or gone: keep what is known. (Gone: its stat
            // was read before, so reconciling with it is still right.)
            self.stats.read_failures += u64::from(!is_vanished(&e));
            self.tids = tids;
            return ThreadsRead {
                all: true,
                fresh_oncpu_ns: 0,
                moved: false,
            };
        }
        let set_changed =
            tids.len() != st.threads.len() || tids.iter().any(|t| !st.threads.contains_key(t));
        let full = full || set_changed;
        let mut read = ThreadsRead {
            all: true,
            fresh_oncpu_ns: 0,
            moved: false,
        };
        for &tid in &tids {
            if !full {
                if let Some(th) = st.threads.get_mut(&tid) {
                    if generation - th.read_at < th.backoff {
                        th.seen = generation;
                        self.stats.deferred_threads += 1;
                        read.all = false;
                        continue;
                    }
                }
            }
            let (gained, moved) = self.read_thread(pid, tid, st);
            read.fresh_oncpu_ns += gained;
            read.moved |= moved;
        }
        self.tids = tids;
        let before = st.threads.len();
        let exited = &mut st.exited;
        st.threads.retain(|_, th| {
            let keep = th.seen == generation;
            if !keep {
                exited.add(&th.last);
            }
            keep
        });
        let left = (before - st.threads.len()) as u32;
        st.exited_threads += left;
        self.stats.exited_threads += u64::from(left);
        read.moved |= left > 0;
        read
    }

    /// Reads one thread; returns the on-CPU ns it gained since its last
    /// read (all of it for a thread not seen before), and whether any of
    /// its counters moved (a new thread has).
    fn read_thread(&mut self, pid: u32, tid: u32, st: &mut ProcessState) -> (u64, bool) {
        let generation = self.generation;
        self.set_path(format_args!("/{pid}/task/{tid}/schedstat"));
        self.stats.schedstat_reads += 1;
        let s = match self.read_current() {
            Ok(true) => match parse_schedstat(&self.buf) {
                Ok(s) => s,
                Err(e) => {
                    log::debug!("parsing /{pid}/task/{tid}/schedstat: {e}");
                    self.stats.read_failures += 1;
                    self.keep_unread(st, tid);
                    return (0, false);
                }
            },
            // Exited after the listing: folded as gone by the caller.
            Ok(false) => return (0, false),
            Err(()) => {
                self.keep_unread(st, tid);
                return (0, false);
            }
        };
        let prev = st
            .threads
            .get(&tid)
            .map(|th| (th.last, th.quiescent, th.backoff));
        let prev = match prev {
            Some((last, ..))
                if s.sum_exec_runtime_ns < last.oncpu_ns || s.timeslices < last.timeslices =>
            {
                // The same (pid, tid) with smaller counters: a new thread.
                st.exited.add(&last);
                st.exited_threads += 1;
                self.stats.tid_reuse += 1;
                st.threads.remove(&tid);
                None
            }
            other => other,
        };
        let mut next = ThreadCounters {
            oncpu_ns: s.sum_exec_runtime_ns,
            runq_wait_ns: s.run_delay_ns,
            timeslices: s.timeslices,
            ..prev.map(|(last, ..)| last).unwrap_or_default()
        };
        let mut quiescent = prev.is_some_and(|(_, q, _)| q);
        let switched = prev.is_none_or(|(last, q, _)| !q || last.timeslices != s.timeslices);
        if switched {
            quiescent = self.read_switches(pid, tid, &mut next);
        }
        let moved = prev.is_none_or(|(last, ..)| last != next);
        let backoff = match prev {
            Some((_, _, b)) if !moved => (b * 2).min(MAX_BACKOFF_SCANS),
            _ => 1,
        };
        let gained = next.oncpu_ns - prev.map_or(0, |(last, ..)| last.oncpu_ns);
        st.threads.insert(
            tid,
            ThreadState {
                last: next,
                quiescent,
                seen: generation,
                read_at: generation,
                backoff,
            },
        );
        (gained, moved)
    }

    /// Reads a thread's switch counts from its status into `next`; whether
    /// it was off a CPU then (so no switch happens unless pcount moves).
    fn read_switches(&mut self, pid: u32, tid: u32, next: &mut ThreadCounters) -> bool {
        self.set_path(format_args!("/{pid}/task/{tid}/status"));
        self.stats.status_reads += 1;
        match self.read_current() {
            Ok(true) => match parse_ctxt_switches(&self.buf) {
                Ok(c) => {
                    next.voluntary_switches = c.voluntary.max(next.voluntary_switches);
                    next.involuntary_switches = c.involuntary.max(next.involuntary_switches);
                    next.quiescent()
                }
                Err(e) => {
                    log::debug!("parsing /{pid}/task/{tid}/status: {e}");
                    self.stats.read_failures += 1;
                    false
                }
            },
            // Exited between the two reads: its schedstat stands.
            Ok(false) | Err(()) => false,
        }
    }

    /// A thread that exists but could not be read this time: keep its
    /// last counters (it is alive, not gone).
    fn keep_unread(&mut self, st: &mut ProcessState, tid: u32) {
        if let Some(th) = st.threads.get_mut(&tid) {
            th.seen = self.generation;
            th.quiescent = false;
        }
    }
}
