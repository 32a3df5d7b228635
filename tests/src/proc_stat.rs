//! /proc/stat as the tests' reference, parsed here so it is independent of
//! vitalsd's own parser: per-CPU and machine-wide times in USER_HZ ticks,
//! and the bound on interrupt and steal time that eBPF slices include and
//! the kernel's task runtime leaves out (README "Kernel support").

use std::collections::{BTreeMap, HashMap};

use crate::clk_tck;

/// The fields of a `cpu` line, in order.
pub const FIELDS: [&str; 8] = [
    "user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal",
];

/// One `cpu` line's times in ticks, by field name.
pub type Ticks = HashMap<&'static str, u64>;

/// One reading of /proc/stat.
#[derive(Debug, Clone)]
pub struct ProcStat {
    /// The aggregate `cpu` line.
    pub total: Ticks,
    /// The `cpuN` lines (the online CPUs), by N.
    pub per_cpu: BTreeMap<u32, Ticks>,
}

impl ProcStat {
    pub fn read() -> Self {
        let text = std::fs::read_to_string("/proc/stat").unwrap();
        let mut total = None;
        let mut per_cpu = BTreeMap::new();
        for line in text.lines() {
            let mut f = line.split_whitespace();
            let Some(cpu) = f.next().and_then(|l| l.strip_prefix("cpu")) else {
                continue;
            };
            let ticks: Ticks = FIELDS
                .iter()
                .zip(f)
                .map(|(n, v)| (*n, v.parse().unwrap()))
                .collect();
            match cpu {
                "" => total = Some(ticks),
                n => {
                    per_cpu.insert(n.parse().unwrap(), ticks);
                }
            }
        }
        Self {
            total: total.expect("no aggregate cpu line in /proc/stat"),
            per_cpu,
        }
    }

    /// irq + softirq + steal ticks of `cpu` (None: all CPUs) since boot:
    /// time on it that is in no task's runtime.
    pub fn excluded_ticks(&self, cpu: Option<u32>) -> u64 {
        let t = match cpu {
            None => &self.total,
            Some(c) => self
                .per_cpu
                .get(&c)
                .unwrap_or_else(|| panic!("no cpu{c} line in /proc/stat")),
        };
        t["irq"] + t["softirq"] + t["steal"]
    }

    /// The most irq, softirq and steal time `cpu` (None: all CPUs) can
    /// have had since this reading, in ns: the ticks since, plus one tick
    /// of rounding per CPU. 0 where the kernel accounts none of it at all
    /// (bare metal without IRQ time accounting): there the task's runtime
    /// includes it too.
    pub fn excluded_ns_since(&self, cpu: Option<u32>) -> f64 {
        let now = Self::read();
        if now.excluded_ticks(cpu) == 0 {
            return 0.0;
        }
        let rounding = match cpu {
            None => now.per_cpu.len() as u64,
            Some(_) => 1,
        };
        let ticks = now.excluded_ticks(cpu) - self.excluded_ticks(cpu) + rounding;
        ticks as f64 * 1e9 / clk_tck() as f64
    }
}
