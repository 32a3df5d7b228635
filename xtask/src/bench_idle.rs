//! `cargo xtask bench idle`: what leaving vitalsd on costs. vitalsd run
//! (1 s sampling, default rules) side by side with the tools a user would
//! leave running instead, `top -b -d 1` and `pidstat -u -r 1`, all over
//! the same window: CPU (utime+stime from /proc/<pid>/stat) as % of one
//! core, and RSS (VmRSS at the end, VmHWM peak). Then, in a separate phase
//! because the stats themselves cost, the kernel-side time of vitalsd's
//! eBPF programs (kernel.bpf_stats_enabled), which its process CPU excludes.

use std::{
    collections::HashSet,
    path::Path,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};

use crate::util::{bpf_progs, set_bpf_stats, workspace_root};

struct Cost {
    cpu_ticks: u64,
    rss_kb: u64,
    hwm_kb: u64,
}

fn clk_tck() -> f64 {
    (unsafe { libc::sysconf(libc::_SC_CLK_TCK) }) as f64
}

fn cost(pid: u32) -> Result<Cost> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).context("reading stat")?;
    let rest = &stat[stat.rfind(')').context("stat")? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // Fields 14 and 15 (1-based) are utime, stime; `rest` starts at field 3.
    let cpu_ticks = f[11].parse::<u64>()? + f[12].parse::<u64>()?;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kb = |key: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    Ok(Cost {
        cpu_ticks,
        rss_kb: kb("VmRSS:"),
        hwm_kb: kb("VmHWM:"),
    })
}

fn start_vitalsd(dir: &Path) -> Result<Child> {
    let cfg = dir.join("vitalsd.toml");
    std::fs::write(
        &cfg,
        format!(
            "[store]\ndir = \"{}\"\n[control]\nsocket = \"{}\"\n",
            dir.join("store").display(),
            dir.join("vitalsd.sock").display()
        ),
    )?;
    let child = Command::new(workspace_root().join("target/release/vitalsd"))
        .args(["run", "--config"])
        .arg(&cfg)
        .stderr(Stdio::null())
        .spawn()
        .context("starting vitalsd run")?;
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::os::unix::net::UnixStream::connect(dir.join("vitalsd.sock")).is_err() {
        if Instant::now() > deadline {
            bail!("vitalsd did not start");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(child)
}

/// Total kernel run time of the programs `ids`.
fn bpf_run_time_ns(ids: &HashSet<u64>) -> Result<u64> {
    Ok(bpf_progs()?
        .iter()
        .filter(|(id, _)| ids.contains(id))
        .map(|(_, p)| p.run_time_ns)
        .sum())
}

pub fn run(seconds: u64) -> Result<()> {
    let dir = tempfile_dir()?;
    let before: HashSet<u64> = bpf_progs()?.into_keys().collect();
    let mut vitalsd = start_vitalsd(&dir)?;
    let ours: HashSet<u64> = bpf_progs()?
        .into_keys()
        .filter(|id| !before.contains(id))
        .collect();
    // Let start-up (load, first scans) settle before measuring.
    std::thread::sleep(Duration::from_secs(2));
    let n = (seconds + 5).to_string();
    let mut top = Command::new("top")
        .args(["-b", "-d", "1", "-n", &n])
        .stdout(Stdio::null())
        .spawn()
        .context("starting top")?;
    let mut pidstat = Command::new("pidstat")
        .args(["-u", "-r", "1", &n])
        .stdout(Stdio::null())
        .spawn()
        .context("starting pidstat")?;
    std::thread::sleep(Duration::from_secs(2));
    let tools = [
        ("vitalsd run", vitalsd.id()),
        ("top -b -d 1", top.id()),
        ("pidstat -u -r 1", pidstat.id()),
    ];
    let start: Vec<Cost> = tools.iter().map(|(_, p)| cost(*p)).collect::<Result<_>>()?;
    let t0 = Instant::now();
    println!("measuring {seconds} s of always-on sampling at 1 s...");
    std::thread::sleep(Duration::from_secs(seconds));
    let wall = t0.elapsed().as_secs_f64();
    let end: Vec<Cost> = tools.iter().map(|(_, p)| cost(*p)).collect::<Result<_>>()?;
    let _ = top.kill();
    let _ = pidstat.kill();
    let _ = top.wait();
    let _ = pidstat.wait();

    println!(
        "\n{:<18} {:>12} {:>10} {:>10}",
        "TOOL", "CPU % 1 CORE", "RSS MiB", "PEAK MiB"
    );
    let mut pct = Vec::new();
    let mut rss = Vec::new();
    for (i, (name, _)) in tools.iter().enumerate() {
        let cpu_s = (end[i].cpu_ticks - start[i].cpu_ticks) as f64 / clk_tck();
        let p = cpu_s * 100.0 / wall;
        pct.push(p);
        rss.push(end[i].rss_kb as f64 / 1024.0);
        println!(
            "{:<18} {:>12.3} {:>10.1} {:>10.1}",
            name,
            p,
            end[i].rss_kb as f64 / 1024.0,
            end[i].hwm_kb as f64 / 1024.0
        );
    }
    println!(
        "vitalsd / top: CPU {:.2}x, RSS {:.2}x;  vitalsd / pidstat: CPU {:.2}x, RSS {:.2}x",
        pct[0] / pct[1].max(1e-9),
        rss[0] / rss[1].max(1e-9),
        pct[0] / pct[2].max(1e-9),
        rss[0] / rss[2].max(1e-9)
    );
    println!(
        "targets: CPU < 0.5% of one core ({}), RSS < 20 MiB ({})",
        if pct[0] < 0.5 { "met" } else { "MISSED" },
        if rss[0] < 20.0 { "met" } else { "MISSED" }
    );

    // Kernel side: vitalsd's eBPF programs, with stats on for 10 s.
    set_bpf_stats(true)?;
    let t = Instant::now();
    let measured = (|| -> Result<(u64, u64)> {
        let r0 = bpf_run_time_ns(&ours)?;
        std::thread::sleep(Duration::from_secs(10));
        Ok((r0, bpf_run_time_ns(&ours)?))
    })();
    let secs = t.elapsed().as_secs_f64();
    set_bpf_stats(false)?;
    let (r0, r1) = measured?;
    println!(
        "vitalsd eBPF programs in the kernel: {:.3}% of one core on this idle machine ({} programs, bpf_stats over {:.0} s)",
        (r1.saturating_sub(r0)) as f64 / 1e9 * 100.0 / secs,
        ours.len(),
        secs
    );
    unsafe { libc::kill(vitalsd.id() as i32, libc::SIGTERM) };
    let _ = vitalsd.wait();
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

fn tempfile_dir() -> Result<std::path::PathBuf> {
    let d = std::env::temp_dir().join(format!("vitalsd-bench-idle-{}", std::process::id()));
    std::fs::create_dir_all(&d)?;
    Ok(d)
}
