//! `vitalsd snapshot`: two samples an interval apart, rendered as one table
//! in the spirit of `dumpsys cpuinfo`, with every share named by its formula.

use std::fmt::Write;
use std::path::PathBuf;
use std::time::Duration;

use thiserror::Error;

use crate::procfs::stat::{LOCAL_BUSY_FORMULA, TOTAL_FORMULA};
use crate::procfs::{PsiResource, PsiState, SampleOptions, Sampler, SamplerError};
use crate::sources::{
    system::ANDROID_LEGACY_TOTAL_FORMULA,
    tasks::{TaskWindow, Window, Windows, CORE_EQUIVALENT_FORMULA, MACHINE_SHARE_FORMULA},
};
use crate::system::SystemError;

pub use crate::procfs::{scan_once, scan_repeat, ScanStats};

#[derive(Debug, Error)]
pub enum SnapshotError {
    #[error(transparent)]
    Sampler(#[from] SamplerError),
    #[error(transparent)]
    System(#[from] SystemError),
    #[error("the second sample produced no window")]
    NoWindow,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotOptions {
    pub proc_root: PathBuf,
    pub interval: Duration,
    /// Also show per-thread rows under each process.
    pub threads: bool,
    /// USER_HZ; None = sysconf(_SC_CLK_TCK).
    pub hz: Option<u64>,
}

impl Default for SnapshotOptions {
    fn default() -> Self {
        SnapshotOptions {
            proc_root: PathBuf::from(crate::procfs::DEFAULT_PROC_ROOT),
            interval: Duration::from_secs(1),
            threads: false,
            hz: None,
        }
    }
}

/// Samples twice, `interval` apart, and renders the window.
pub fn run_snapshot(opts: &SnapshotOptions) -> Result<String, SnapshotError> {
    let hz = match opts.hz {
        Some(hz) => hz,
        None => crate::system::clock_ticks_per_second()?,
    };
    let mut sampler = Sampler::new(
        &opts.proc_root,
        SampleOptions {
            threads: opts.threads,
            status: true,
            cmdline: true,
        },
    );
    let mut tracker = Windows::new(hz);
    tracker.update(&sampler.sample()?);
    std::thread::sleep(opts.interval);
    let w = tracker
        .update(&sampler.sample()?)
        .ok_or(SnapshotError::NoWindow)?;
    Ok(render(&w))
}

/// dumpsys-style percentage: one decimal below 10, whole numbers above.
fn pct(v: f64) -> String {
    if v < 10.0 {
        format!("{v:.1}%")
    } else {
        format!("{v:.0}%")
    }
}

fn opt_pct(v: Option<f64>) -> String {
    v.map(pct).unwrap_or_else(|| "-".into())
}

fn task_line(out: &mut String, w: &Window, t: &TaskWindow, indent: &str, label: &str) {
    let sign = if t.added {
        "+"
    } else if t.removed {
        "-"
    } else {
        " "
    };
    let share = |ticks: u64| w.system.as_ref().map(|s| s.share_pct(ticks));
    let (user, kernel, minflt, majflt) = match t.delta {
        Some(d) => (
            opt_pct(share(d.utime_ticks)),
            opt_pct(share(d.stime_ticks)),
            d.minflt.to_string(),
            d.majflt.to_string(),
        ),
        None => ("-".into(), "-".into(), "-".into(), "-".into()),
    };
    let _ = writeln!(
        out,
        "{indent}{sign}{share} {pid}/{label}: {user} user + {kernel} kernel / faults: {minflt} minor {majflt} major  [core-equiv {core}]",
        share = opt_pct(t.machine_share_pct),
        pid = t.pid,
        core = opt_pct(t.core_equivalent_pct),
    );
}

/// Renders a window as a table.
pub fn render(w: &Window) -> String {
    let mut out = String::new();
    match &w.loadavg {
        Some(l) => {
            let _ = writeln!(
                out,
                "Load: {:.2} / {:.2} / {:.2}  (runnable/total tasks {}/{}, last pid {})",
                l.load1, l.load5, l.load15, l.runnable_tasks, l.total_tasks, l.last_pid
            );
        }
        None => out.push_str("Load: unavailable\n"),
    }
    let secs = |ns: Option<u64>| {
        ns.map(|n| format!("{:.3}s", n as f64 / 1e9))
            .unwrap_or_else(|| "not advancing".into())
    };
    let _ = writeln!(
        out,
        "CPU usage over CLOCK_BOOTTIME {} / CLOCK_MONOTONIC {} (USER_HZ {}):",
        secs(w.clocks.boottime_ns),
        secs(w.clocks.monotonic_ns),
        w.hz
    );
    let _ = writeln!(
        out,
        "  first column: machine share = {MACHINE_SHARE_FORMULA}\n  core-equiv   = {CORE_EQUIVALENT_FORMULA} (may exceed 100%)\n  % total = user + kernel; + added, - removed this window"
    );

    let mut rows: Vec<&TaskWindow> = w.working_processes().collect();
    let cpu = |t: &TaskWindow| t.delta.map(|d| d.cpu_ticks()).unwrap_or(0);
    rows.sort_by(|a, b| cpu(b).cmp(&cpu(a)).then(a.pid.cmp(&b.pid)));
    for p in rows {
        task_line(&mut out, w, p, "  ", &p.name());
        if !w.threads.is_empty() {
            let mut threads: Vec<&TaskWindow> = w
                .threads
                .iter()
                .filter(|t| t.tgid == p.pid && t.working)
                .collect();
            threads.sort_by(|a, b| cpu(b).cmp(&cpu(a)).then(a.pid.cmp(&b.pid)));
            for t in threads {
                task_line(&mut out, w, t, "      ", &t.comm.to_string_lossy());
            }
        }
    }

    match &w.system {
        Some(s) => {
            let d = &s.delta;
            let _ = writeln!(
                out,
                "{} TOTAL local busy: {} user + {} kernel + {} irq + {} softirq; not busy: {} iowait + {} steal + {} idle",
                pct(s.local_busy_pct),
                pct(s.share_pct(d.user_ticks + d.nice_ticks)),
                pct(s.share_pct(d.system_ticks)),
                pct(s.share_pct(d.irq_ticks)),
                pct(s.share_pct(d.softirq_ticks)),
                pct(s.share_pct(d.iowait_ticks)),
                pct(s.share_pct(d.steal_ticks)),
                pct(s.share_pct(d.idle_ticks)),
            );
            let _ = writeln!(
                out,
                "  local busy % = ({LOCAL_BUSY_FORMULA}) / ({TOTAL_FORMULA}) over {} ticks, {} CPUs online{}",
                s.total_ticks,
                s.online_cpus.len(),
                if s.cpus_onlined.is_empty() && s.cpus_offlined.is_empty() {
                    String::new()
                } else {
                    format!(" (hotplug: +{:?} -{:?})", s.cpus_onlined, s.cpus_offlined)
                }
            );
            let _ = writeln!(
                out,
                "  ProcessCpuTracker.getTotalCpuPercent = {ANDROID_LEGACY_TOTAL_FORMULA} = {} (for comparison)",
                opt_pct(s.android_legacy_total_cpu_pct)
            );
        }
        None => out.push_str("TOTAL: unavailable this window (see drops)\n"),
    }

    out.push_str("PSI some avg10:");
    for (res, state) in PsiResource::ALL.iter().zip(&w.pressure) {
        let v = match state {
            Some(PsiState::Available(p)) => format!("{:.2}%", p.some.avg10_pct),
            Some(PsiState::Unavailable) => "unavailable".into(),
            None => "read failed".into(),
        };
        let _ = write!(out, " {} {v}", res.file_name());
    }
    out.push('\n');
    let d = &w.drops;
    let _ = writeln!(
        out,
        "Dropped this window: read_failures={} vanished_pids={} vanished_tids={} negative_deltas={} clock_not_advancing={} starttime_changes={}",
        d.read_failures, d.vanished_pids, d.vanished_tids, d.negative_deltas, d.clock_not_advancing, d.starttime_changes
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::procfs::testutil::{FakeProc, Task};

    #[test]
    fn renders_a_fake_tree() {
        let fake = FakeProc::new();
        let c = [100, 0, 50, 1000, 10, 0, 5, 0, 0, 0];
        fake.set_stat(c, &[(0, c)]);
        let t = Task {
            pid: 42,
            comm: "surfaceflinger",
            minflt: 10,
            majflt: 1,
            utime: 10,
            stime: 10,
            starttime: 5,
        };
        fake.set_process(&t);
        let mut sampler = Sampler::new(
            fake.root(),
            SampleOptions {
                threads: true,
                status: true,
                cmdline: true,
            },
        );
        let mut tracker = Windows::new(100);
        let mut s = sampler.sample().unwrap();
        s.clock = Some(crate::clock::ClockPair {
            boottime_ns: 1_000_000_000,
            monotonic_ns: 1_000_000_000,
        });
        tracker.update(&s);
        fake.set_process(&Task {
            utime: 40,
            stime: 20,
            minflt: 15,
            ..t
        });
        let c2 = [130, 0, 60, 1060, 10, 0, 5, 0, 0, 0];
        fake.set_stat(c2, &[(0, c2)]);
        let mut s = sampler.sample().unwrap();
        s.clock = Some(crate::clock::ClockPair {
            boottime_ns: 2_000_000_000,
            monotonic_ns: 2_000_000_000,
        });
        let text = render(&tracker.update(&s).unwrap());
        assert!(text.starts_with("Load: 1.50 / 0.75 / 0.25"), "{text}");
        // 40 of 100 ticks: 30 user, 10 kernel; 40 ticks over 1 s = 40% core.
        assert!(
            text.contains(" 40% 42/surfaceflinger: 30% user + 10% kernel / faults: 5 minor 0 major  [core-equiv 40%]"),
            "{text}"
        );
        assert!(
            text.contains("40% TOTAL local busy: 30% user + 10% kernel"),
            "{text}"
        );
        assert!(text.contains(MACHINE_SHARE_FORMULA) && text.contains(CORE_EQUIVALENT_FORMULA));
        assert!(text.contains("negative_deltas=0"), "{text}");
    }

    #[test]
    fn snapshot_of_real_proc() {
        let text = run_snapshot(&SnapshotOptions {
            interval: Duration::from_millis(100),
            ..SnapshotOptions::default()
        })
        .unwrap();
        assert!(text.contains("TOTAL local busy"), "{text}");
    }
}
