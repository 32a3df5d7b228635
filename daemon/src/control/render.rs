//! The human renderings of the protocol's replies, as `vitalsctl` prints
//! them: every string the daemon relays from elsewhere (process names, rule
//! names, errors) goes through [`printable`].

use std::fmt::Write;

use super::{
    printable,
    protocol::{Status, TopReply, TopRow},
};
use crate::store::EntryMeta;

/// A map of counters as JSON (`{"name":n,...}`), as status shows them.
fn counters<T: serde::Serialize>(m: &T) -> String {
    serde_json::to_string(m).unwrap_or_default()
}

fn busy(pct: Option<f64>) -> String {
    pct.map(|p| format!("{p:.1}%"))
        .unwrap_or_else(|| "-".into())
}

fn loadavg(l: Option<[f32; 3]>) -> String {
    match l {
        Some(a) => a
            .iter()
            .map(|x| format!("{x:.2}"))
            .collect::<Vec<_>>()
            .join(" "),
        None => "-".into(),
    }
}

/// `vitalsctl status`: sampling, drops, triggers, store, running capture.
pub fn status(s: &Status) -> String {
    let v = &s.daemon;
    let st = &s.store;
    format!(
        "vitalsd {}: {} samples every {} ms, faults from {}\naccounting: {}, captures on {}\ntier: {} ({}){}\ncapabilities: {}\ncpu busy {}  loadavg {}\ntriggers fired {}, skipped {}\nbpf drops {}\nprocfs drops {}\nperfetto producer {}{}\nstore {}: {} captures, {} bytes; newest {}\n{}",
        printable(&v.version),
        v.samples,
        v.interval_ms,
        printable(&v.fault_source),
        printable(&v.accounting),
        printable(&v.capture_backend),
        printable(&v.tier),
        printable(&v.tier_gives),
        if v.sched_procfs.is_empty() {
            String::new()
        } else {
            format!("\nschedstat source {}", counters(&v.sched_procfs))
        } + &if v.offcpu.is_empty() {
            String::new()
        } else {
            format!(
                "\noff-CPU {}\noff-CPU wakers (wakee<-waker, last window) {}",
                counters(&v.offcpu),
                counters(&v.offcpu_wakers)
            )
        },
        printable(&v.capabilities),
        busy(v.local_busy_pct),
        loadavg(v.loadavg),
        v.triggers_fired,
        printable(&counters(&v.triggers_skipped)),
        counters(&v.bpf_drops),
        counters(&v.procfs_drops),
        counters(&v.producer),
        v.producer_error
            .as_deref()
            .map(|e| format!(" (last error: {})", printable(e)))
            .unwrap_or_default(),
        printable(&st.dir.to_string_lossy()),
        st.captures,
        st.bytes,
        printable(st.newest.as_deref().unwrap_or("-")),
        match &v.capture {
            None => "no capture running".to_string(),
            Some(cap) => format!(
                "capture running: {} ({})",
                printable(&cap.id),
                printable(&cap.rule)
            ),
        }
    )
}

/// The `top` table's header line.
pub const TOP_HEADER: [&str; 14] = [
    "PID", "PROCESS", "CORE_EQ%", "MACHINE%", "ONCPU_MS", "RUNQ_MS", "VOL_SW", "INV_SW", "MINFLT",
    "MAJFLT", "RSS_KB", "BLK_S_MS", "BLK_D_MS", "LONG_BLK",
];

/// One `top` row's cells, in [`TOP_HEADER`]'s order; eBPF columns "-" on a
/// process's first window.
pub fn top_cells(p: &TopRow) -> [String; 14] {
    let e = p.ebpf.as_ref();
    let o = p.offcpu.as_ref();
    let ms = |v: Option<f64>| v.map(|v| format!("{v:.1}")).unwrap_or_else(|| "-".into());
    let n = |v: Option<u64>| v.map(|v| v.to_string()).unwrap_or_else(|| "-".into());
    [
        p.pid.to_string(),
        printable(&p.name).chars().take(24).collect(),
        format!("{:.1}", p.core_equivalent_pct),
        format!("{:.1}", p.machine_share_pct),
        ms(e.map(|e| e.oncpu_ms)),
        ms(e.map(|e| e.runq_wait_ms)),
        n(e.map(|e| e.voluntary_switches)),
        n(e.map(|e| e.involuntary_switches)),
        p.minflt.to_string(),
        p.majflt.to_string(),
        n(p.rss_kb),
        ms(o.map(|o| o.blocked_s_ms)),
        ms(o.map(|o| o.blocked_d_ms)),
        n(o.map(|o| o.long_blocks)),
    ]
}

/// Column widths of the `top` table; PROCESS left-aligned, the rest right.
const TOP_WIDTHS: [usize; 14] = [7, 24, 9, 9, 9, 8, 7, 7, 8, 8, 10, 9, 9, 8];

fn top_line(out: &mut String, cells: &[impl AsRef<str>]) {
    for (i, (c, w)) in cells.iter().zip(TOP_WIDTHS).enumerate() {
        let sep = if i == 0 { "" } else { " " };
        let c = c.as_ref();
        let _ = if i == 1 {
            write!(out, "{sep}{c:<w$}")
        } else {
            write!(out, "{sep}{c:>w$}")
        };
    }
    out.push('\n');
}

/// One `top` answer as a table.
pub fn top(v: &TopReply) -> String {
    let mut out = format!(
        "cpu busy {}  loadavg {}",
        busy(v.local_busy_pct),
        loadavg(v.loadavg)
    );
    if let Some(ms) = v.window_ms {
        out += &format!("  window {ms:.0} ms");
    }
    out.push('\n');
    top_line(&mut out, &TOP_HEADER);
    for p in &v.processes {
        top_line(&mut out, &top_cells(p));
    }
    out
}

/// `vitalsctl list`: one line per stored capture.
pub fn list(entries: &[EntryMeta]) -> String {
    let mut s = format!(
        "{:<40} {:<18} {:>10} {:>9}  {}\n",
        "ID", "RULE", "BYTES", "SECONDS", "STATUS"
    );
    for m in entries {
        s += &format!(
            "{:<40} {:<18} {:>10} {:>9.1}  {}\n",
            printable(&m.id),
            printable(&m.trigger.rule),
            m.trace_bytes,
            m.duration_ms as f64 / 1000.0,
            printable(&m.status.to_string())
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::protocol::{TopEbpf, TopOffcpu};

    /// The table `vitalsctl top` has always printed: fixed columns, "-"
    /// for what a window lacks, a process's name escaped and cut to 24.
    #[test]
    fn top_table_columns() {
        let reply = TopReply {
            local_busy_pct: Some(42.25),
            loadavg: Some([0.5, 1.25, 2.0]),
            window_ms: None,
            processes: vec![
                TopRow {
                    pid: 7,
                    name: "sh\x1b[2J".into(),
                    core_equivalent_pct: 150.04,
                    machine_share_pct: 75.02,
                    minflt: 3,
                    majflt: 1,
                    rss_kb: Some(2048),
                    ebpf: Some(TopEbpf {
                        oncpu_ms: 12.34,
                        runq_wait_ms: 0.05,
                        voluntary_switches: 9,
                        involuntary_switches: 2,
                    }),
                    offcpu: Some(TopOffcpu {
                        blocked_s_ms: 1500.0,
                        blocked_d_ms: 2.25,
                        long_blocks: 3,
                    }),
                },
                TopRow {
                    pid: 123456,
                    name: "a".repeat(30),
                    ..TopRow::default()
                },
            ],
        };
        let expected = [
            "cpu busy 42.2%  loadavg 0.50 1.25 2.00",
            "    PID PROCESS                   CORE_EQ%  MACHINE%  ONCPU_MS  RUNQ_MS  VOL_SW  INV_SW   MINFLT   MAJFLT     RSS_KB  BLK_S_MS  BLK_D_MS LONG_BLK",
            "      7 sh\\x1b[2J                    150.0      75.0      12.3      0.1       9       2        3        1       2048    1500.0       2.2        3",
            " 123456 aaaaaaaaaaaaaaaaaaaaaaaa       0.0       0.0         -        -       -       -        0        0          -         -         -        -",
            "",
        ];
        assert_eq!(top(&reply), expected.join("\n"));
        // The measured window, where the rows carry per-task figures.
        let reply = TopReply {
            window_ms: Some(446.4),
            ..reply
        };
        assert!(top(&reply)
            .starts_with("cpu busy 42.2%  loadavg 0.50 1.25 2.00  window 446 ms\n    PID PROCESS"));
        let empty = TopReply::default();
        assert!(top(&empty).starts_with("cpu busy -  loadavg -\n"));
    }

    /// Off-CPU lines only where off-CPU accounting runs.
    #[test]
    fn status_shows_the_waker_pairs_when_offcpu_runs() {
        use crate::control::protocol::{DaemonStatus, Status};
        let mut s = Status::default();
        assert!(!status(&s).contains("off-CPU"));
        s.daemon = DaemonStatus {
            offcpu: [("long_block_us".to_string(), 16_000)].into(),
            offcpu_wakers: [("7<-irq.wakeups".to_string(), 3)].into(),
            ..Default::default()
        };
        let text = status(&s);
        assert!(
            text.contains("\noff-CPU {\"long_block_us\":16000}\n")
                && text
                    .contains("off-CPU wakers (wakee<-waker, last window) {\"7<-irq.wakeups\":3}"),
            "{text}"
        );
    }
}
