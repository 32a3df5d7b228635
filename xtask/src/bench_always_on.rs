//! `cargo xtask bench always-on`: what the always-on tier costs in each
//! tier, against what Perfetto itself ships for the same question, all
//! running at once in one run over the same population (1000 sleeping
//! processes and 5000 parked threads, as `bench scan`):
//!
//! - `vitalsd run` in the CTS tier (`accounting = "proc"`: per-thread
//!   schedstat and status), 1 s sampling;
//! - `vitalsd run` in the eBPF tier, 1 s sampling; its programs' kernel
//!   time (kernel.bpf_stats_enabled, which its process CPU excludes) is
//!   added;
//! - traced_probes with `linux.process_stats` (1 s poll,
//!   `record_process_runtime`) and `linux.sys_stats` (/proc/stat and PSI
//!   every 1 s) in one session.
//!
//! Neither vitalsd has its Perfetto producer on, so each is its always-on
//! sampling alone. CPU is utime+stime from /proc/<pid>/stat over `rounds`
//! windows of `seconds`; the median window is reported per 10 s.
//!
//! Then, without the population: what a rule's ring prelude costs a
//! switch-heavy workload (`perf bench sched pipe` pinned to CPU 0, as
//! `bench overhead`), rounds interleaved between nothing running and the
//! ring session vitalsd keeps for such a rule (linux.ftrace with the sched
//! events and compact_sched, process_stats and sys_stats, in a RING_BUFFER
//! waiting for its trigger).

use std::{
    collections::HashSet,
    time::{Duration, Instant},
};

use anyhow::Result;

use crate::{
    bench_idle::{bpf_run_time_ns, clk_tck, cost, start_vitalsd},
    bench_overhead::{median, perf_bench},
    bench_scan::spawn_load,
    traced::Traced,
    util::{bpf_progs, set_bpf_stats},
};

pub fn run(seconds: u64, rounds: usize, loops: u64) -> Result<()> {
    let dir = std::env::temp_dir().join(format!("vitalsd-bench-always-on-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let load = spawn_load()?;
    let quiet = "[producer]\nenabled = false\n[sampling]\ninterval = \"1s\"";
    let mut cts = start_vitalsd(
        &dir.join("cts"),
        &format!("{quiet}\naccounting = \"proc\""),
        &[],
    )?;
    let before: HashSet<u64> = bpf_progs()?.into_keys().collect();
    let mut ebpf = start_vitalsd(&dir.join("ebpf"), quiet, &[])?;
    let ours: HashSet<u64> = bpf_progs()?
        .into_keys()
        .filter(|id| !before.contains(id))
        .collect();
    let traced = Traced::start(&dir.join("traced"), true)?;
    let config = format!(
        r#"
buffers {{ size_kb: 65536 fill_policy: RING_BUFFER }}
data_sources {{ config {{ name: "linux.process_stats" process_stats_config {{
    scan_all_processes_on_start: true proc_stats_poll_ms: 1000 record_process_runtime: true }} }} }}
data_sources {{ config {{ name: "linux.sys_stats" sys_stats_config {{
    stat_period_ms: 1000 stat_counters: STAT_CPU_TIMES psi_period_ms: 1000 }} }} }}
duration_ms: {}
"#,
        (seconds * rounds as u64 + 20) * 1000
    );
    let mut session = traced.session(&config, &dir.join("session.pftrace"))?;
    let probes = traced.probes.as_ref().map_or(0, |g| g.0.id());
    let pids = [cts.id(), ebpf.id(), probes];
    println!(
        "bench always-on: 1000 sleeping processes + 5000 parked threads; {rounds} windows of {seconds} s; all three at once"
    );
    // Past start-up: loads, first scans, process_stats' initial dump.
    std::thread::sleep(Duration::from_secs(5));
    set_bpf_stats(true)?;
    let measured = (|| -> Result<Vec<[f64; 4]>> {
        let mut windows = Vec::new();
        for _ in 0..rounds {
            let c0: Vec<u64> = pids
                .iter()
                .map(|p| cost(*p).map(|c| c.cpu_ticks))
                .collect::<Result<_>>()?;
            let k0 = bpf_run_time_ns(&ours)?;
            let t0 = Instant::now();
            std::thread::sleep(Duration::from_secs(seconds));
            let c1: Vec<u64> = pids
                .iter()
                .map(|p| cost(*p).map(|c| c.cpu_ticks))
                .collect::<Result<_>>()?;
            let k1 = bpf_run_time_ns(&ours)?;
            let per10 = 10.0 / t0.elapsed().as_secs_f64();
            let s = |i: usize| (c1[i] - c0[i]) as f64 / clk_tck() * per10 * 1e3;
            windows.push([s(0), s(1), (k1 - k0) as f64 / 1e6 * per10, s(2)]);
        }
        Ok(windows)
    })();
    set_bpf_stats(false)?;
    let windows = measured?;
    let col = |i: usize| median(windows.iter().map(|w| w[i]).collect());
    let (cts_ms, ebpf_user_ms, ebpf_kernel_ms, probes_ms) = (col(0), col(1), col(2), col(3));
    let ebpf_ms = median(windows.iter().map(|w| w[1] + w[2]).collect());
    println!("\n{:<58} {:>14}", "ALWAYS-ON COLLECTOR", "CPU ms / 10 s");
    println!(
        "{:<58} {:>14.1}",
        "vitalsd run, CTS tier (schedstat, no eBPF)", cts_ms
    );
    println!(
        "{:<58} {:>14.1}",
        "vitalsd run, eBPF tier (process + programs)", ebpf_ms
    );
    println!("{:<58} {:>14.1}", "  process", ebpf_user_ms);
    println!(
        "{:<58} {:>14.1}",
        "  eBPF programs in the kernel (bpf_stats)", ebpf_kernel_ms
    );
    println!(
        "{:<58} {:>14.1}",
        "traced_probes: process_stats (1 s, runtime) + sys_stats", probes_ms
    );
    println!(
        "(median of {rounds} windows; one USER_HZ tick is {:.0} ms per window, {:.1} ms per 10 s)",
        1e3 / clk_tck(),
        1e3 / clk_tck() * 10.0 / seconds as f64
    );
    let r_cts = cts_ms / probes_ms.max(1e-9);
    let r_ebpf = ebpf_ms / cts_ms.max(1e-9);
    println!(
        "CTS tier / traced_probes: {r_cts:.2}x (target <= 0.33: {})",
        if r_cts <= 1.0 / 3.0 { "met" } else { "MISSED" }
    );
    println!(
        "eBPF tier / CTS tier: {r_ebpf:.2}x (target < 1: {})",
        if r_ebpf < 1.0 { "met" } else { "MISSED" }
    );
    println!(
        "windows (CTS, eBPF process, eBPF programs, traced_probes): {:?}",
        windows
            .iter()
            .map(|w| w.map(|v| (v * 10.0).round() / 10.0))
            .collect::<Vec<_>>()
    );
    let _ = session.0.kill();
    for d in [&mut cts, &mut ebpf] {
        unsafe { libc::kill(d.id() as i32, libc::SIGTERM) };
        let _ = d.wait();
    }
    drop(traced);
    drop(load);
    ring_session_cost(&dir.join("ring"), rounds, loops)?;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// The ring prelude's session (perfetto_capture::ring's shape, as text).
const RING_SESSION: &str = r#"
buffers { size_kb: 16384 fill_policy: RING_BUFFER }
data_sources { config { name: "linux.ftrace" ftrace_config {
    ftrace_events: "sched/sched_switch" ftrace_events: "sched/sched_waking"
    ftrace_events: "sched/sched_wakeup_new" ftrace_events: "task/task_newtask"
    ftrace_events: "task/task_rename" ftrace_events: "sched/sched_process_exit"
    ftrace_events: "sched/sched_process_free" compact_sched { enabled: true } } } }
data_sources { config { name: "linux.process_stats" process_stats_config {
    scan_all_processes_on_start: true record_thread_names: true proc_stats_poll_ms: 1000 } } }
data_sources { config { name: "linux.sys_stats" sys_stats_config {
    stat_period_ms: 1000 stat_counters: STAT_CPU_TIMES stat_counters: STAT_FORK_COUNT } } }
trigger_config { trigger_mode: STOP_TRACING trigger_timeout_ms: 3600000
    triggers { name: "vitalsd.bench" stop_delay_ms: 1000 } }
"#;

/// `perf bench sched pipe` throughput with nothing running and with the
/// ring session running, `rounds` interleaved pairs.
fn ring_session_cost(dir: &std::path::Path, rounds: usize, loops: u64) -> Result<()> {
    let traced = Traced::start(dir, true)?;
    println!("\nring prelude session under perf bench sched pipe -l {loops}, taskset -c 0, {rounds} interleaved rounds");
    let (mut nothing, mut ring) = (Vec::new(), Vec::new());
    for i in 0..rounds {
        nothing.push(perf_bench(loops)?);
        let mut session = traced.session(RING_SESSION, &dir.join(format!("ring-{i}.pftrace")))?;
        // ftrace set up and the initial process scan done.
        std::thread::sleep(Duration::from_secs(3));
        ring.push(perf_bench(loops)?);
        session.signal(libc::SIGTERM);
        let _ = session.0.wait();
    }
    let (n, r) = (median(nothing.clone()), median(ring.clone()));
    println!("{:<40} {:>14}", "PIPE BENCHMARK", "ops/s (median)");
    println!("{:<40} {:>14.0}", "nothing running", n);
    println!("{:<40} {:>14.0}", "ring prelude session running", r);
    println!(
        "throughput loss of the ring session: {:.1} % (per round: nothing {:?}, ring {:?})",
        (1.0 - r / n) * 100.0,
        nothing.iter().map(|v| v.round()).collect::<Vec<_>>(),
        ring.iter().map(|v| v.round()).collect::<Vec<_>>()
    );
    Ok(())
}
