//! Where each tool's loss goes, after the timed rounds: one more run of
//! each tool with `kernel.bpf_stats_enabled=1`, printing every program's
//! run time per event and, summed, the BPF time per `perf bench` op. What
//! the programs do not account for of a loss is the attach's own dispatch
//! (a kprobe's ftrace and kprobe handlers, a tracepoint's perf hook) and
//! the tool's own process, whose CPU during the timed rounds `guest.rs`
//! prints beside the loss. The kernel's kprobe list says whether a kprobe
//! went through ftrace (`[FTRACE]`) or a breakpoint.

use std::{collections::HashSet, path::Path};

use anyhow::Result;

use super::guest::{Config, Tool};
use crate::bench_overhead::perf_bench;
use crate::util::{bpf_progs, set_bpf_stats, ProgStat};

const KPROBE_LIST: &str = "/sys/kernel/debug/kprobes/list";

pub(super) fn report(
    configs: &[Config],
    loops: u64,
    vitalsd: &Path,
    baseline: Option<&Path>,
) -> Result<()> {
    println!("\nper-program cost (kernel.bpf_stats_enabled=1, one more run each; run_time_ns / run_cnt):");
    set_bpf_stats(true)?;
    let result = (|| -> Result<()> {
        for &cfg in configs {
            let before: HashSet<u64> = bpf_progs()?.into_keys().collect();
            let Some((tool, _)) = Tool::start(cfg, vitalsd, baseline)? else {
                continue;
            };
            let kprobes = std::fs::read_to_string(KPROBE_LIST).unwrap_or_default();
            let ops_per_s = perf_bench(loops)?;
            let after = bpf_progs()?;
            tool.stop()?;
            let mut new: Vec<(u64, ProgStat)> = after
                .into_iter()
                .filter(|(id, p)| !before.contains(id) && p.run_cnt > 0)
                .collect();
            new.sort_by_key(|(id, _)| *id);
            let bpf_ns: u64 = new.iter().map(|(_, p)| p.run_time_ns).sum();
            // The programs also ran outside perf bench (start-up, SETTLE):
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
        }
        Ok(())
    })();
    set_bpf_stats(false)?;
    result
}
