//! `cargo xtask bench overhead`: what always-on accounting costs a
//! switch-heavy workload, side by side with bpftrace doing the same job.
//!
//! `perf bench sched pipe` pinned to CPU 0 (cross-CPU wakeups on shared VMs
//! swamp everything otherwise), with rounds interleaved: nothing attached,
//! `vitalsd record` (tp_btf where the kernel has BTF), the same without
//! runqueue wait, the same on classic tracepoints (what Android's bpfloader
//! attaches), and bpftrace summing on-CPU ns per pid. Then, in separate
//! rounds because the stats themselves cost, each program's run_time_ns /
//! run_cnt from kernel.bpf_stats_enabled.

use std::{
    collections::{HashMap, HashSet},
    io::{BufRead, BufReader},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};

use crate::util::{bpf_progs, output, set_bpf_stats, workspace_root, ProgStat};

const BPFTRACE_PROG: &str = "tracepoint:sched:sched_switch { if (@start[args->prev_pid] > 0) { @oncpu[args->prev_pid] += nsecs - @start[args->prev_pid]; } @start[args->next_pid] = nsecs; }";

#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
enum Config {
    Nothing,
    Vitalsd,
    /// vitalsd without runqueue-wait accounting: on-CPU time, switches and
    /// faults, i.e. a superset of what the bpftrace program does.
    VitalsdNoWait,
    /// vitalsd without off-CPU accounting (no sched_waking program): the
    /// default's difference to it is what off-CPU accounting costs.
    VitalsdNoOffcpu,
    /// vitalsd on classic tracepoints, as Android's bpfloader attaches
    /// them (the default uses tp_btf where the kernel has BTF).
    VitalsdClassic,
    Bpftrace,
    /// `--baseline BIN`: another build's `vitalsd record` (defaults), in
    /// the same interleaved rounds, so a change is compared before/after
    /// in one run instead of across two runs' drift.
    Baseline,
}

/// The other build `--baseline` names.
static BASELINE: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();

impl Config {
    fn name(self) -> &'static str {
        match self {
            Config::Nothing => "nothing attached",
            Config::Vitalsd => "vitalsd record",
            Config::VitalsdNoWait => "vitalsd --no-runq-wait",
            Config::VitalsdNoOffcpu => "vitalsd --no-offcpu",
            Config::VitalsdClassic => "vitalsd --classic-tracepoints",
            Config::Bpftrace => "bpftrace",
            Config::Baseline => "baseline vitalsd record",
        }
    }
}

struct Tool {
    child: Child,
    /// vitalsd's stdout (its summary at exit), read to its end.
    summary: Option<std::thread::JoinHandle<String>>,
}

impl Tool {
    /// Starts the tool and waits until its programs are attached.
    fn start(cfg: Config) -> Result<Option<Tool>> {
        let mut child = match cfg {
            Config::Nothing => return Ok(None),
            Config::Vitalsd
            | Config::VitalsdNoWait
            | Config::VitalsdNoOffcpu
            | Config::VitalsdClassic
            | Config::Baseline => {
                let bin = match cfg {
                    Config::Baseline => BASELINE.get().cloned().context("no --baseline")?,
                    _ => workspace_root().join("target/release/vitalsd"),
                };
                Command::new(bin)
                    .args(["record", "--duration", "1h", "--interval", "1s", "--out"])
                    .arg(workspace_root().join("target/bench-overhead.pftrace"))
                    .args(match cfg {
                        Config::VitalsdNoWait => &["--no-runq-wait"][..],
                        Config::VitalsdNoOffcpu => &["--no-offcpu"][..],
                        Config::VitalsdClassic => &["--classic-tracepoints"][..],
                        _ => &[][..],
                    })
                    .env("RUST_LOG", "info")
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped())
                    .spawn()
                    .context("starting vitalsd")?
            }
            Config::Bpftrace => Command::new("bpftrace")
                .args(["-e", BPFTRACE_PROG])
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()
                .context("starting bpftrace")?,
        };
        let (reader, marker): (Box<dyn std::io::Read + Send>, &str) = match cfg {
            Config::Vitalsd
            | Config::VitalsdNoWait
            | Config::VitalsdNoOffcpu
            | Config::VitalsdClassic
            | Config::Baseline => (
                Box::new(child.stderr.take().unwrap()),
                "eBPF accounting attached",
            ),
            _ => (Box::new(child.stdout.take().unwrap()), "Attaching"),
        };
        let (rx, _drain) = watch_for_marker(reader, marker);
        if rx.recv_timeout(Duration::from_secs(60)).is_err() {
            let _ = child.kill();
            bail!("{} did not attach within 60 s", cfg.name());
        }
        // vitalsd prints its summary (with the map drops line) at exit.
        let summary = child.stdout.take().map(|mut out| {
            std::thread::spawn(move || {
                let mut s = String::new();
                let _ = std::io::Read::read_to_string(&mut out, &mut s);
                s
            })
        });
        // bpftrace prints "Attaching" just before attaching.
        std::thread::sleep(Duration::from_millis(500));
        Ok(Some(Tool { child, summary }))
    }

    /// Ends the tool; for vitalsd, the run's `switch_missed` from its
    /// summary's map drops line (None: not printed).
    fn stop(mut self) -> Result<Option<u64>> {
        unsafe { libc::kill(self.child.id() as i32, libc::SIGINT) };
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.child.try_wait()?.is_none() {
            if Instant::now() > deadline {
                let _ = self.child.kill();
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.wait();
        let summary = self.summary.take().and_then(|h| h.join().ok());
        Ok(summary.as_deref().and_then(switch_missed))
    }
}

/// `switch_missed=N` of a vitalsd summary's `map drops:` line.
fn switch_missed(summary: &str) -> Option<u64> {
    let line = summary.lines().find(|l| l.starts_with("map drops:"))?;
    let v = line
        .split_whitespace()
        .find_map(|w| w.strip_prefix("switch_missed="))?;
    v.parse().ok()
}

/// Reads `out` to its end on a thread of its own (so the tool never
/// blocks on a full pipe: offwaketime prints all its stacks at the end),
/// and sends once on the receiver when a line holds `marker`.
pub(crate) fn watch_for_marker(
    out: Box<dyn std::io::Read + Send>,
    marker: &'static str,
) -> (std::sync::mpsc::Receiver<()>, std::thread::JoinHandle<()>) {
    let (tx, rx) = std::sync::mpsc::channel();
    let drain = std::thread::spawn(move || {
        let mut r = BufReader::new(out);
        let mut line = String::new();
        let mut told = false;
        while r.read_line(&mut line).unwrap_or(0) > 0 {
            if !told && line.contains(marker) {
                let _ = tx.send(());
                told = true;
            }
            line.clear();
        }
    });
    (rx, drain)
}

pub(crate) fn perf_bench(loops: u64) -> Result<f64> {
    let out = output(Command::new("taskset").args([
        "-c",
        "0",
        "perf",
        "bench",
        "sched",
        "pipe",
        "-l",
        &loops.to_string(),
    ]))?;
    out.lines()
        .find(|l| l.contains("ops/sec"))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .with_context(|| format!("no ops/sec in perf output: {out}"))
}

pub(crate) fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// `baseline`: another vitalsd build run in the same rounds (before/after).
pub fn run(rounds: usize, loops: u64, baseline: Option<std::path::PathBuf>) -> Result<()> {
    let mut configs = vec![
        Config::Nothing,
        Config::Vitalsd,
        Config::VitalsdNoWait,
        Config::VitalsdNoOffcpu,
        Config::VitalsdClassic,
        Config::Bpftrace,
    ];
    let mut ours = vec![
        Config::Vitalsd,
        Config::VitalsdNoWait,
        Config::VitalsdNoOffcpu,
        Config::VitalsdClassic,
    ];
    if let Some(b) = baseline {
        anyhow::ensure!(b.is_file(), "--baseline {}: no such file", b.display());
        println!("baseline build: {}", b.display());
        let _ = BASELINE.set(b);
        configs.push(Config::Baseline);
        ours.push(Config::Baseline);
    }
    let mut results: HashMap<Config, Vec<f64>> = HashMap::new();
    // Per round, each config's loss against that round's nothing-attached
    // run divided by bpftrace's loss in the same round: pairing within a
    // round cancels the drift between rounds on a shared VM.
    let mut paired: HashMap<Config, Vec<f64>> = HashMap::new();
    // Each vitalsd run's switch_missed, per config (#22: by program kind).
    let mut missed: HashMap<Config, Vec<Option<u64>>> = HashMap::new();
    set_bpf_stats(false)?;
    println!("perf bench sched pipe -l {loops}, taskset -c 0, {rounds} interleaved rounds");
    for round in 0..rounds {
        // Rotate the order so drift on the shared VM hits every config alike.
        for i in 0..configs.len() {
            let cfg = configs[(i + round) % configs.len()];
            let tool = Tool::start(cfg)?;
            let ops = perf_bench(loops)?;
            if let Some(t) = tool {
                if ours.contains(&cfg) {
                    missed.entry(cfg).or_default().push(t.stop()?);
                } else {
                    t.stop()?;
                }
            }
            println!("  round {round}: {:<30} {:>10.0} ops/s", cfg.name(), ops);
            results.entry(cfg).or_default().push(ops);
        }
        let this = |c: Config| results[&c][round];
        let bt_loss = 1.0 - this(Config::Bpftrace) / this(Config::Nothing);
        for &c in &ours {
            let l = 1.0 - this(c) / this(Config::Nothing);
            paired.entry(c).or_default().push(l / bt_loss.max(1e-9));
        }
    }
    println!("\nswitch_missed per run (vitalsd's summary; - where it printed none):");
    for &c in &ours {
        let runs: Vec<String> = missed[&c]
            .iter()
            .map(|m| m.map_or("-".into(), |n| n.to_string()))
            .collect();
        println!("  {:<30} {}", c.name(), runs.join(" "));
    }
    let med = |c: Config| median(results[&c].clone());
    let base = med(Config::Nothing);
    let loss = |x: f64| (1.0 - x / base) * 100.0;
    let bt_loss = loss(med(Config::Bpftrace));
    println!("\nmedian ops/s and throughput loss against nothing attached ({base:.0} ops/s):");
    for &c in ours.iter().chain([&Config::Bpftrace]) {
        let l = loss(med(c));
        println!(
            "  {:<30} {:>10.0} ops/s  loss {:>5.1}%  loss ratio to bpftrace {:.2}",
            c.name(),
            med(c),
            l,
            l / bt_loss.max(1e-9)
        );
    }
    println!("\nloss ratio to bpftrace paired within each round (median, and quartiles):");
    for &c in &ours {
        let mut v = paired[&c].clone();
        v.sort_by(|a, b| a.partial_cmp(b).unwrap());
        let q = |f: f64| v[((v.len() - 1) as f64 * f).round() as usize];
        println!(
            "  {:<30} {:.2}  ({:.2} .. {:.2})",
            c.name(),
            median(v.clone()),
            q(0.25),
            q(0.75)
        );
    }
    println!("  (target: vitalsd's loss at most half of bpftrace's, ratio <= 0.50)");
    // One sched_waking per wakeup, two a round trip: this workload's worst case.
    let offcpu_cost: Vec<f64> = (0..rounds)
        .map(|r| {
            let this = |c: Config| results[&c][r];
            (this(Config::VitalsdNoOffcpu) - this(Config::Vitalsd)) / this(Config::Nothing) * 100.0
        })
        .collect();
    println!(
        "off-CPU accounting's cost (--no-offcpu minus default, % of nothing-attached ops/s, paired within each round): median {:.1} points",
        median(offcpu_cost)
    );
    if configs.contains(&Config::Baseline) {
        let ratios: Vec<f64> = (0..rounds)
            .map(|r| paired[&Config::Vitalsd][r] / paired[&Config::Baseline][r].max(1e-9))
            .collect();
        println!(
            "this build's loss / the baseline's, paired within each round: median {:.2} (1.00: no worse)",
            median(ratios)
        );
    }

    // Per-event cost from the kernel's BPF stats, in separate rounds.
    println!("\nper-event cost (kernel.bpf_stats_enabled=1, run_time_ns / run_cnt):");
    set_bpf_stats(true)?;
    let result = (|| -> Result<HashMap<Config, f64>> {
        let mut switch_cost = HashMap::new();
        for cfg in ours.iter().copied().chain([Config::Bpftrace]) {
            let before: HashSet<u64> = bpf_progs()?.into_keys().collect();
            let tool = Tool::start(cfg)?.unwrap();
            perf_bench(loops)?;
            let after = bpf_progs()?;
            tool.stop()?;
            let mut new: Vec<(u64, ProgStat)> = after
                .into_iter()
                .filter(|(id, _)| !before.contains(id))
                .collect();
            new.sort_by_key(|(id, _)| *id);
            for (_, p) in &new {
                if p.run_cnt == 0 {
                    continue;
                }
                let per = p.run_time_ns as f64 / p.run_cnt as f64;
                println!(
                    "  {:<30} {:<22} {:>8.1} ns/event over {} events",
                    cfg.name(),
                    p.name,
                    per,
                    p.run_cnt
                );
                if p.name.contains("sched_switch") && !switch_cost.contains_key(&cfg) {
                    switch_cost.insert(cfg, per);
                }
            }
        }
        Ok(switch_cost)
    })();
    set_bpf_stats(false)?;
    let switch_cost = result?;
    if let (Some(v), Some(b)) = (
        switch_cost.get(&Config::Vitalsd),
        switch_cost.get(&Config::Bpftrace),
    ) {
        println!(
            "sched_switch program: vitalsd {v:.1} ns/event vs bpftrace {b:.1} ns/event, ratio {:.2} (target < 1)",
            v / b
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn switch_missed_is_read_from_the_map_drops_line() {
        let summary = "capture: none\nmap drops: task_map_full=0 switch_missed=17 \
                       oncpu_wall_clock=1\ntrace: x";
        assert_eq!(switch_missed(summary), Some(17));
        assert_eq!(switch_missed("map drops: task_map_full=0"), None);
        assert_eq!(switch_missed("no summary"), None);
    }
}
