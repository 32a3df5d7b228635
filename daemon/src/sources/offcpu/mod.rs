//! The off-CPU room (issue #24, part 1): blocked time in S and D, long
//! blocks and who ended them, from the programs' off-CPU accounting
//! (`ebpf-programs/src/offcpu.rs`; on when `sampling.offcpu` is). The
//! eBPF room reads the maps once a tick: the per-task counters arrive
//! folded per process in the tick's rows and deltas, the (wakee, waker)
//! pairs in `Tick::wakers`; this room takes the pairs' window deltas,
//! has the pairs of ended wakees forgotten (`Accounting::forget_wakers`),
//! and offers the columns, the figures rules read, the top pairs in status
//! and the recording summary. Registered after the eBPF room (it reads what that
//! room put in the tick).

#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, HashMap};

use vitals_common::{WakerCounters, WakerKey};

use super::{ebpf::Programs, tasks::TaskWindow, Source, Tick};
use crate::{
    bpf::OffcpuSettings,
    control::protocol::{TopOffcpu, TopRow},
    figures::ProcessFigures,
};

/// How many pairs status and the summary show.
pub const TOP_PAIRS: usize = 8;

/// The figures this room offers to history and the rules.
pub mod figures {
    use crate::figures::Figure;

    /// Blocks of at least `sampling.long_block` of the process's main
    /// thread (tid == tgid), cumulative: a rule watches its growth over
    /// its window. (The process-wide count is in the columns and tracks;
    /// a history record has room for one figure more, not two.)
    pub static MAIN_THREAD_LONG_BLOCKS: Figure = Figure {
        name: "offcpu.main_thread_long_blocks",
    };
}

/// One (wakee, waker) pair's figures over some span.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WakerPair {
    pub key: WakerKey,
    pub wakeups: u64,
    pub blocked_ns: u64,
}

/// The room.
pub struct Offcpu {
    /// The programs, to forget ended wakees' pairs (None in unit tests).
    programs: Option<Programs>,
    settings: OffcpuSettings,
    /// The pairs' cumulative counters at the last read.
    prev: HashMap<WakerKey, WakerCounters>,
    /// The pairs' deltas over the last window, most wakeups first.
    window: Vec<WakerPair>,
    /// Summed deltas since the room opened (a recording's summary).
    since_open: HashMap<WakerKey, WakerCounters>,
    /// Cumulative long blocks of the main thread by tgid, this tick.
    long_blocks: HashMap<u32, u64>,
}

impl Offcpu {
    pub fn new(programs: Option<Programs>, settings: OffcpuSettings) -> Self {
        Self {
            programs,
            settings,
            prev: HashMap::new(),
            window: Vec::new(),
            since_open: HashMap::new(),
            long_blocks: HashMap::new(),
        }
    }

    pub fn settings(&self) -> OffcpuSettings {
        self.settings
    }

    /// The last window's pairs, most wakeups first.
    pub fn window_pairs(&self) -> &[WakerPair] {
        &self.window
    }

    /// The pairs since the room opened, most wakeups first.
    pub fn pairs_since_open(&self) -> Vec<WakerPair> {
        sorted(self.since_open.iter().map(|(k, v)| (*k, *v)))
    }
}

/// Pairs by wakeups, then blocked time, then key (a stable order).
fn sorted(pairs: impl Iterator<Item = (WakerKey, WakerCounters)>) -> Vec<WakerPair> {
    let mut out: Vec<WakerPair> = pairs
        .filter(|(_, v)| v.wakeups != 0)
        .map(|(key, v)| WakerPair {
            key,
            wakeups: v.wakeups,
            blocked_ns: v.blocked_ns,
        })
        .collect();
    out.sort_by(|a, b| (b.wakeups, b.blocked_ns, a.key).cmp(&(a.wakeups, a.blocked_ns, b.key)));
    out
}

/// Each pair's change since `prev`. A pair whose counters went backwards
/// was deleted and inserted again (its wakee ended, a new process took the
/// tgid): its counters now are all new.
pub fn pair_deltas(
    prev: &HashMap<WakerKey, WakerCounters>,
    cur: &HashMap<WakerKey, WakerCounters>,
) -> Vec<WakerPair> {
    sorted(cur.iter().map(|(k, c)| {
        let p = prev.get(k).copied().unwrap_or_default();
        let d = match (
            c.wakeups.checked_sub(p.wakeups),
            c.blocked_ns.checked_sub(p.blocked_ns),
        ) {
            (Some(wakeups), Some(blocked_ns)) => WakerCounters {
                wakeups,
                blocked_ns,
            },
            _ => *c,
        };
        (*k, d)
    }))
}

/// "wakee<-waker", the waker 0 (an interrupt over the idle task) as "irq".
pub fn pair_label(key: &WakerKey) -> String {
    match key.waker_tgid {
        0 => format!("{}<-irq", key.wakee_tgid),
        w => format!("{}<-{w}", key.wakee_tgid),
    }
}

impl Source for Offcpu {
    fn read(&mut self, tick: &mut Tick) {
        if tick.bpf_error.is_some() {
            return;
        }
        self.window = pair_deltas(&self.prev, &tick.wakers);
        for p in &self.window {
            let s = self.since_open.entry(p.key).or_default();
            s.wakeups += p.wakeups;
            s.blocked_ns += p.blocked_ns;
        }
        self.prev = tick.wakers.clone();
        self.long_blocks = tick
            .rows
            .iter()
            .filter(|r| !r.ended)
            .map(|r| (r.tgid, r.main_thread_long_blocks))
            .collect();
        // An ended process wakes and is woken no more: its pairs go, so
        // the bounded totals keep room for live ones.
        let ended: Vec<u32> = tick
            .rows
            .iter()
            .filter(|r| r.ended)
            .map(|r| r.tgid)
            .collect();
        if !ended.is_empty() {
            self.prev.retain(|k, _| !ended.contains(&k.wakee_tgid));
            if let Some(p) = &self.programs {
                // Daemon-side only: the kernel's halves are zeroed as read.
                p.with(|acc| acc.forget_wakers(&ended));
            }
        }
    }

    fn columns(&self, tick: &Tick, task: &TaskWindow, row: &mut TopRow) {
        row.offcpu = tick.deltas.get(&(task.pid as u32)).map(|d| TopOffcpu {
            blocked_s_ms: d.blocked_s_ns as f64 / 1e6,
            blocked_d_ms: d.blocked_d_ns as f64 / 1e6,
            long_blocks: d.long_blocks,
        });
    }

    fn process_figures(&self, _tick: &Tick, task: &TaskWindow, out: &mut ProcessFigures) {
        if let Some(&main) = self.long_blocks.get(&(task.pid as u32)) {
            out.set(&figures::MAIN_THREAD_LONG_BLOCKS, main as f64);
        }
    }

    /// `offcpu_wakers`: the last window's busiest (wakee, waker) pairs,
    /// "wakee<-waker.wakeups" and ".blocked_us"; `offcpu`: the settings
    /// and failed deletes.
    fn status(&self, out: &mut BTreeMap<&'static str, BTreeMap<String, u64>>) {
        let mut pairs = BTreeMap::new();
        for p in self.window.iter().take(TOP_PAIRS) {
            let label = pair_label(&p.key);
            pairs.insert(format!("{label}.wakeups"), p.wakeups);
            pairs.insert(format!("{label}.blocked_us"), p.blocked_ns / 1000);
        }
        out.insert("offcpu_wakers", pairs);
        out.insert(
            "offcpu",
            BTreeMap::from([
                (
                    "long_block_us".to_string(),
                    u64::from(self.settings.long_block_us),
                ),
                (
                    "max_waker_pairs".to_string(),
                    u64::from(self.settings.max_waker_pairs),
                ),
            ]),
        );
    }

    fn summary(&self) -> Option<String> {
        let pairs = self.pairs_since_open();
        let top: Vec<String> = pairs
            .iter()
            .take(TOP_PAIRS)
            .map(|p| {
                format!(
                    "{} {} wakeups {:.1} ms",
                    pair_label(&p.key),
                    p.wakeups,
                    p.blocked_ns as f64 / 1e6
                )
            })
            .collect();
        Some(format!(
            "off-CPU wakers (wakee<-waker, {} pairs): {}",
            pairs.len(),
            if top.is_empty() {
                "-".to_string()
            } else {
                top.join("; ")
            }
        ))
    }
}
