//! `cargo xtask bench producer`: what vitalsd's Perfetto data source costs
//! against the one Perfetto itself ships for the same question,
//! traced_probes' `linux.process_stats` with `record_process_runtime`
//! (per-process CPU time from /proc/<pid>/stat), both polled every 1 s, in
//! one session on one machine with 1000 extra processes alive.
//!
//! CPU is utime+stime from /proc/<pid>/stat (all threads) over a window of
//! `seconds`, first with no session (the idle baseline: vitalsd samples
//! every second whether or not anyone traces), then in the session. The
//! data source's own cost is the difference; vitalsd's total in the
//! session is printed too, since its always-on sampling does the procfs
//! and eBPF reading that process_stats does for itself.

use std::time::Duration;

use anyhow::Result;

use crate::{
    bench_idle::{clk_tck, cost, start_vitalsd},
    bench_scan::sleepers,
    traced::Traced,
};

const PROCESSES: usize = 1000;

/// CPU seconds of each pid over `seconds`.
fn cpu_over(pids: &[u32], seconds: u64) -> Result<Vec<f64>> {
    let start: Vec<u64> = pids
        .iter()
        .map(|p| cost(*p).map(|c| c.cpu_ticks))
        .collect::<Result<_>>()?;
    std::thread::sleep(Duration::from_secs(seconds));
    let end: Vec<u64> = pids
        .iter()
        .map(|p| cost(*p).map(|c| c.cpu_ticks))
        .collect::<Result<_>>()?;
    Ok(start
        .iter()
        .zip(end)
        .map(|(a, b)| (b - a) as f64 / clk_tck())
        .collect())
}

pub fn run(seconds: u64) -> Result<()> {
    let dir = std::env::temp_dir().join(format!("vitalsd-bench-producer-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let _load = sleepers(PROCESSES)?;
    let traced = Traced::start(&dir.join("traced"), true)?;
    let mut vitalsd = start_vitalsd(
        &dir.join("vitalsd"),
        "[sampling]\ninterval = \"1s\"",
        &traced.env(),
    )?;
    traced.wait_for("linux.vitals", Duration::from_secs(20))?;
    let probes = traced.probes.as_ref().map(|g| g.0.id()).unwrap_or(0);
    let pids = [vitalsd.id(), probes, traced.traced.0.id()];
    let names = [
        "vitalsd run (linux.vitals)",
        "traced_probes (linux.process_stats)",
        "traced",
    ];
    println!("bench producer: {PROCESSES} extra processes alive; {seconds} s windows");

    // Start-up scans settle first.
    std::thread::sleep(Duration::from_secs(3));
    let idle = cpu_over(&pids, seconds)?;

    let config = format!(
        r#"
buffers {{ size_kb: 65536 fill_policy: RING_BUFFER }}
data_sources {{ config {{ name: "linux.vitals" legacy_config: "interval_ms=1000" }} }}
data_sources {{ config {{ name: "linux.process_stats" process_stats_config {{
    scan_all_processes_on_start: true proc_stats_poll_ms: 1000 record_process_runtime: true }} }} }}
duration_ms: {}
"#,
        (seconds + 6) * 1000
    );
    let mut session = traced.session(&config, &dir.join("session.pftrace"))?;
    // Past both sources' initial dumps of every process.
    std::thread::sleep(Duration::from_secs(3));
    let busy = cpu_over(&pids, seconds)?;
    let _ = session.0.wait();

    println!(
        "\n{:<38} {:>12} {:>12} {:>12}",
        "PROCESS", "IDLE CPU s", "SESSION s", "SOURCE s"
    );
    let per10 = 10.0 / seconds as f64;
    let mut source = Vec::new();
    for i in 0..pids.len() {
        let d = (busy[i] - idle[i]).max(0.0);
        source.push(d);
        println!(
            "{:<38} {:>12.3} {:>12.3} {:>12.3}",
            names[i],
            idle[i] * per10,
            busy[i] * per10,
            d * per10
        );
    }
    println!(
        "(CPU seconds per 10 s; SOURCE = SESSION - IDLE; one USER_HZ tick is {:.3} s)",
        1.0 / clk_tck()
    );
    let ratio = source[0] / source[1].max(1e-9);
    println!(
        "vitalsd data source / process_stats: {:.2}x (target <= 0.33: {})",
        ratio,
        if ratio <= 1.0 / 3.0 { "met" } else { "MISSED" }
    );
    println!(
        "vitalsd in total (always-on sampling included) / traced_probes in the session: {:.2}x",
        busy[0] / busy[1].max(1e-9)
    );
    unsafe { libc::kill(vitalsd.id() as i32, libc::SIGTERM) };
    let _ = vitalsd.wait();
    drop(traced);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
