//! What `vitalsd record` prints at the end: the summary and its top table.

use std::path::PathBuf;

use crate::{accounting::Tier, bpf::FaultSource, events::EventStats};

/// One process's figures over the recording.
#[derive(Debug, Clone, PartialEq)]
pub struct SummaryRow {
    pub pid: u32,
    pub name: String,
    pub oncpu_ns: u64,
    /// oncpu_ns / wall time of the recording (CLOCK_MONOTONIC); may exceed 100%.
    pub core_equivalent_pct: f64,
    pub voluntary_switches: u64,
    pub involuntary_switches: u64,
    /// None when runqueue wait was not accounted (--no-runq-wait).
    pub runq_wait_ns: Option<u64>,
    pub faults: u64,
    pub ended: bool,
}

#[derive(Debug, Clone)]
pub struct RecordSummary {
    /// "ebpf" or "proc-only (…)" (`accounting_mode`).
    pub accounting: String,
    /// The tier the per-task figures come from.
    pub tier: crate::accounting::Tier,
    /// The sources' own lines (the CTS tier's schedstat source: what it
    /// read and could not see).
    pub sources: Vec<String>,
    pub trace_path: PathBuf,
    pub fault_source: FaultSource,
    pub wall_monotonic_ns: u64,
    pub rows: Vec<SummaryRow>,
    pub drops: Vec<(&'static str, u64)>,
    pub capabilities_after_attach: Option<String>,
    pub packets_written: u64,
    pub bytes_written: u64,
    pub samples: u64,
    pub capture: Option<EventStats>,
    /// The recording stopped early because the trace reached `max_bytes`.
    pub cut_at_max_bytes: bool,
}

impl RecordSummary {
    /// The top table: `limit` rows (0 = all), then drops.
    pub fn render(&self, limit: usize) -> String {
        use std::fmt::Write;
        let mut s = String::new();
        let wall_s = self.wall_monotonic_ns as f64 / 1e9;
        let _ = writeln!(
            s,
            "vitalsd record: {:.2} s, {} samples, faults from {}",
            wall_s,
            self.samples,
            match self.tier {
                Tier::Ebpf => self.fault_source.describe(),
                _ => crate::accounting::PROC_FAULT_SOURCE,
            }
        );
        let _ = writeln!(s, "accounting: {}", self.accounting);
        let _ = writeln!(s, "tier: {} ({})", self.tier.name(), self.tier.gives());
        if self.tier != Tier::Ticks {
            self.render_table(&mut s, limit);
        } else {
            // No per-task table rather than one of zeros; the trace has
            // the /proc counters.
            let _ = writeln!(
                s,
                "no per-process table: {} unavailable",
                crate::bpf::denied::PROC_ONLY_MISSING
            );
        }
        for line in &self.sources {
            let _ = writeln!(s, "{line}");
        }
        if let Some(c) = &self.capabilities_after_attach {
            let _ = writeln!(s, "capabilities after attach: {c}");
        }
        if let Some(c) = &self.capture {
            let _ = writeln!(s, "{}", c.render());
            if c.switch_events > 0 {
                // Only the classic sched_switch programs can be blind.
                let _ = writeln!(
                    s,
                    "blind windows: {} ({} switches unseen; {} only the context-switch counter shows), track \"{}\"",
                    c.blind_windows,
                    c.unseen_switches,
                    c.blind_windows_counter_only,
                    crate::perfetto::blind_windows::PARENT_TRACK_NAME
                );
                let _ = writeln!(
                    s,
                    "switches after an unseen one: {} ({} written after a synthetic switch to their real prev; the task that had the CPU shows preempted)",
                    c.switch_gaps,
                    c.synthetic_switches
                );
            }
        }
        let _ = writeln!(
            s,
            "trace: {} ({} packets, {} bytes)",
            self.trace_path.display(),
            self.packets_written,
            self.bytes_written
        );
        s
    }

    /// The eBPF rows and the map drops.
    fn render_table(&self, s: &mut String, limit: usize) {
        use std::fmt::Write;
        let _ = writeln!(
            s,
            "{:>7} {:<20} {:>12} {:>9} {:>9} {:>9} {:>11} {:>9}",
            "PID", "PROCESS", "ONCPU_MS", "CORE_EQ%", "VOL_SW", "INVOL_SW", "RUNQ_MS", "FAULTS"
        );
        let n = if limit == 0 {
            self.rows.len()
        } else {
            limit.min(self.rows.len())
        };
        for r in &self.rows[..n] {
            let mut name: String = r.name.chars().take(20).collect();
            if r.ended {
                name = format!("{}*", name.chars().take(19).collect::<String>());
            }
            let _ = writeln!(
                s,
                "{:>7} {:<20} {:>12.3} {:>9.1} {:>9} {:>9} {:>11} {:>9}",
                r.pid,
                name,
                r.oncpu_ns as f64 / 1e6,
                r.core_equivalent_pct,
                r.voluntary_switches,
                r.involuntary_switches,
                r.runq_wait_ns
                    .map(|ns| format!("{:.3}", ns as f64 / 1e6))
                    .unwrap_or_else(|| "-".into()),
                r.faults
            );
        }
        let _ = writeln!(s, "(* = exited during the recording; CORE_EQ% = on-CPU time / wall time, may exceed 100%)");
        if self.tier == Tier::Ebpf {
            let drops: Vec<String> = self.drops.iter().map(|(n, v)| format!("{n}={v}")).collect();
            let _ = writeln!(s, "map drops: {}", drops.join(" "));
        }
    }
}
