//! Where each tool's loss goes, after the timed rounds: one more run of
//! each tool with `kernel.bpf_stats_enabled=1`, printing every program's
//! run time per event and, summed, the BPF time per `perf bench` op. What
//! the programs do not account for of a loss is the attach's own dispatch
//! (a kprobe's ftrace and kprobe handlers, a tracepoint's perf hook) and
//! the tool's own process, whose CPU during the timed rounds `guest.rs`
//! prints beside the loss. The kernel's kprobe list says whether a kprobe
//! went through ftrace (`[FTRACE]`) or a breakpoint.

use std::{
    collections::{BTreeMap, HashSet},
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use anyhow::{Context, Result};

use super::guest::{cpu_ms_of, Config, Tool, SUMMARY};
use crate::bench_overhead::perf_bench;
use crate::util::{bpf_progs, set_bpf_stats, Group, ProgStat};

const KPROBE_LIST: &str = "/sys/kernel/debug/kprobes/list";
/// The profile's top symbols printed per tool.
const PROFILE_LINES: usize = 40;

fn tempfile_path(cfg: Config) -> PathBuf {
    PathBuf::from(format!("/tmp/bench-offcpu-{:?}.perf", cfg))
}

/// Each thread of `pid`: its name and CPU so far (ms); none once the
/// process is gone.
fn thread_cpu_ms(pid: u32) -> BTreeMap<u32, (String, f64)> {
    let Ok(tasks) = procfs::process::Process::new(pid as i32).and_then(|p| p.tasks()) else {
        return BTreeMap::new();
    };
    tasks
        .flatten()
        .filter_map(|t| t.stat().ok())
        .map(|st| (st.pid as u32, (st.comm.clone(), cpu_ms_of(&st))))
        .collect()
}

pub(super) fn report(
    configs: &[Config],
    loops: u64,
    vitalsd: &Path,
    baseline: Option<&Path>,
    settle: std::time::Duration,
) -> Result<()> {
    println!("\nper-program cost (kernel.bpf_stats_enabled=1, one more run each; run_time_ns / run_cnt):");
    set_bpf_stats(true)?;
    let result = (|| -> Result<()> {
        for &cfg in configs {
            let before: HashSet<u64> = bpf_progs()?.into_keys().collect();
            let Some((tool, ..)) = Tool::start(cfg, vitalsd, baseline, settle)? else {
                continue;
            };
            let kprobes = std::fs::read_to_string(KPROBE_LIST).unwrap_or_default();
            let pid = tool.pid();
            let threads_before = thread_cpu_ms(pid);
            // A profile of the tool's own process meanwhile, with callers
            // (DWARF: the release build keeps no frame pointers), so each
            // function's share includes what it called.
            let profile = tempfile_path(cfg);
            let mut perf = Group::spawn(
                Command::new("perf")
                    .args(["record", "-q", "-F", "999", "--call-graph", "fp"])
                    .args(["-p", &pid.to_string(), "-o"])
                    .arg(&profile)
                    .stdout(Stdio::null())
                    .stderr(Stdio::null()),
            )
            .context("starting perf record")?;
            let ops_per_s = perf_bench(loops)?;
            perf.signal(libc::SIGINT);
            let _ = perf.0.wait();
            let threads_after = thread_cpu_ms(pid);
            let after = bpf_progs()?;
            tool.stop()?;
            let mut new: Vec<(u64, ProgStat)> = after
                .into_iter()
                .filter(|(id, p)| !before.contains(id) && p.run_cnt > 0)
                .collect();
            new.sort_by_key(|(id, _)| *id);
            let bpf_ns: u64 = new.iter().map(|(_, p)| p.run_time_ns).sum();
            // The programs also ran outside perf bench (start-up, settling):
            // an upper bound on what they took from it.
            println!(
                "  {} ({ops_per_s:.0} ops/s): {:.0} ns of BPF per perf bench op, at most",
                cfg.name(),
                bpf_ns as f64 / loops as f64
            );
            for (_, p) in &new {
                println!(
                    "    {:<24} {:>8.1} ns/event over {} events",
                    p.name,
                    p.run_time_ns as f64 / p.run_cnt as f64,
                    p.run_cnt
                );
            }
            for line in kprobes.lines() {
                println!("    kprobe: {line}");
            }
            for (tid, (comm, ms)) in &threads_after {
                let before = threads_before.get(tid).map_or(0.0, |(_, b)| *b);
                if ms - before > 0.0 {
                    println!("    thread {tid} {comm}: {:.0} ms CPU", ms - before);
                }
            }
            let report = Command::new("perf")
                .args(["report", "--stdio", "-q", "--children", "-g", "none"])
                .args(["--percent-limit", "3", "--sort", "sym", "-i"])
                .arg(&profile)
                .output();
            if let Ok(out) = report {
                for line in String::from_utf8_lossy(&out.stdout)
                    .lines()
                    .filter(|l| !l.trim().is_empty())
                    .take(PROFILE_LINES)
                {
                    println!("    profile: {}", line.trim());
                }
            }
            let _ = std::fs::remove_file(&profile);
            if cfg.vitalsd_args().is_some() {
                let summary = std::fs::read_to_string(SUMMARY).unwrap_or_default();
                for line in summary.lines().filter(|l| l.starts_with("capture:")) {
                    println!("    {line}");
                }
            }
        }
        Ok(())
    })();
    set_bpf_stats(false)?;
    result
}
