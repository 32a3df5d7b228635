//! `cargo xtask bench idle`: what leaving vitalsd on costs. vitalsd run
//! (1 s sampling, default rules) side by side with the tools a user would
//! leave running instead, `top -b -d 1` and `pidstat -u -r 1`, and with a
//! second vitalsd run whose Perfetto producer is off (the first one is
//! connected to a traced of its own with no session: the producer's idle
//! cost is the difference), and with a third attaching the programs and
//! maps `vitalsd pin` pinned (the pins path of Android user builds), all
//! over the same window: CPU (utime+stime from /proc/<pid>/stat) as % of one
//! core, and RSS (VmRSS at the end, VmHWM peak, and their ratio: start-up's
//! cost above the steady state). Then, in a separate phase
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

pub(crate) struct Cost {
    pub cpu_ticks: u64,
    pub rss_kb: u64,
    pub hwm_kb: u64,
    /// RSS split: anonymous memory (heap, stacks, mapped buffers) and
    /// file pages (mostly the binary's own code, shared with other copies).
    pub anon_kb: u64,
    pub file_kb: u64,
}

pub(crate) fn clk_tck() -> f64 {
    (unsafe { libc::sysconf(libc::_SC_CLK_TCK) }) as f64
}

pub(crate) fn cost(pid: u32) -> Result<Cost> {
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
        anon_kb: kb("RssAnon:"),
        file_kb: kb("RssFile:"),
    })
}

/// Kernel memory of the BPF maps `pid` holds open, in KiB: the `memlock`
/// the kernel reports in each map fd's fdinfo, once per map (`map_id`:
/// vitalsd holds a second fd of some maps, e.g. the rings it consumes).
/// Not in any RSS (the capture ring buffer is in it whether mapped or not).
fn bpf_map_kernel_kb(pid: u32) -> Result<u64> {
    let mut bytes = 0u64;
    let mut seen = HashSet::new();
    for e in std::fs::read_dir(format!("/proc/{pid}/fd")).context("reading fds")? {
        let e = e?;
        let is_map = std::fs::read_link(e.path())
            .map(|t| t.to_string_lossy() == "anon_inode:bpf-map")
            .unwrap_or(false);
        if !is_map {
            continue;
        }
        let info = std::fs::read_to_string(format!(
            "/proc/{pid}/fdinfo/{}",
            e.file_name().to_string_lossy()
        ))
        .unwrap_or_default();
        let id = info.lines().find_map(|l| l.strip_prefix("map_id:"));
        if id.is_some_and(|id| !seen.insert(id.trim().to_owned())) {
            continue;
        }
        bytes += info
            .lines()
            .find_map(|l| l.strip_prefix("memlock:"))
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(0);
    }
    Ok(bytes / 1024)
}

/// `vitalsd run` (release) with its store and socket in `dir`, `extra`
/// appended to its config and `env` in its environment.
pub(crate) fn start_vitalsd(
    dir: &Path,
    extra: &str,
    env: &[(&'static str, std::path::PathBuf)],
) -> Result<Child> {
    start_vitalsd_bin(
        &workspace_root().join("target/release/vitalsd"),
        dir,
        extra,
        env,
    )
}

/// `start_vitalsd` with another build's binary (`bench idle --baseline`).
pub(crate) fn start_vitalsd_bin(
    bin: &Path,
    dir: &Path,
    extra: &str,
    env: &[(&'static str, std::path::PathBuf)],
) -> Result<Child> {
    std::fs::create_dir_all(dir)?;
    let cfg = dir.join("vitalsd.toml");
    std::fs::write(
        &cfg,
        format!(
            "[store]\ndir = \"{}\"\n[control]\nsocket = \"{}\"\n{extra}\n",
            dir.join("store").display(),
            dir.join("vitalsd.sock").display()
        ),
    )?;
    let child = Command::new(bin)
        .args(["run", "--config"])
        .arg(&cfg)
        .envs(env.iter().cloned())
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
pub(crate) fn bpf_run_time_ns(ids: &HashSet<u64>) -> Result<u64> {
    Ok(bpf_progs()?
        .iter()
        .filter(|(id, _)| ids.contains(id))
        .map(|(_, p)| p.run_time_ns)
        .sum())
}

/// `baseline`: another vitalsd build measured beside this one (before/after).
pub fn run(seconds: u64, baseline: Option<std::path::PathBuf>) -> Result<()> {
    let dir = tempfile_dir()?;
    let before: HashSet<u64> = bpf_progs()?.into_keys().collect();
    let traced = crate::traced::Traced::start(&dir.join("traced"), false)?;
    let mut vitalsd = start_vitalsd(&dir.join("with"), "", &traced.env())?;
    traced.wait_for("linux.vitals", Duration::from_secs(20))?;
    let ours: HashSet<u64> = bpf_progs()?
        .into_keys()
        .filter(|id| !before.contains(id))
        .collect();
    let mut without = start_vitalsd(
        &dir.join("without"),
        "[producer]\nenabled = false",
        &traced.env(),
    )?;
    let mut before_change = match &baseline {
        Some(bin) => {
            anyhow::ensure!(bin.is_file(), "--baseline {}: no such file", bin.display());
            Some(start_vitalsd_bin(
                bin,
                &dir.join("baseline"),
                "",
                &traced.env(),
            )?)
        }
        None => None,
    };
    // The pins path (Android user builds: bpfloader's pins, no BTF parse):
    // a third vitalsd attaching what `vitalsd pin` pinned on a bpffs.
    let pins = PinsPath::start(&dir, &traced.env())?;
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
    let mut tools = vec![
        ("vitalsd run", vitalsd.id()),
        ("  no producer", without.id()),
        ("top -b -d 1", top.id()),
        ("pidstat -u -r 1", pidstat.id()),
    ];
    if let Some(b) = &before_change {
        tools.push(("baseline build", b.id()));
    }
    let pins_row = tools.len();
    tools.push(("  pins path", pins.vitalsd.id()));
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
        "\n{:<18} {:>12} {:>10} {:>10} {:>10} {:>10}",
        "TOOL", "CPU % 1 CORE", "RSS MiB", "ANON MiB", "FILE MiB", "PEAK MiB"
    );
    let mut pct = Vec::new();
    let mut rss = Vec::new();
    for (i, (name, _)) in tools.iter().enumerate() {
        let cpu_s = (end[i].cpu_ticks - start[i].cpu_ticks) as f64 / clk_tck();
        let p = cpu_s * 100.0 / wall;
        pct.push(p);
        rss.push(end[i].rss_kb as f64 / 1024.0);
        let mib = |kb: u64| kb as f64 / 1024.0;
        println!(
            "{:<18} {:>12.3} {:>10.1} {:>10.1} {:>10.1} {:>10.1}",
            name,
            p,
            mib(end[i].rss_kb),
            mib(end[i].anon_kb),
            mib(end[i].file_kb),
            mib(end[i].hwm_kb)
        );
    }
    println!(
        "vitalsd / top: CPU {:.2}x, RSS {:.2}x;  vitalsd / pidstat: CPU {:.2}x, RSS {:.2}x",
        pct[0] / pct[2].max(1e-9),
        rss[0] / rss[2].max(1e-9),
        pct[0] / pct[3].max(1e-9),
        rss[0] / rss[3].max(1e-9)
    );
    println!(
        "Perfetto producer, connected, no session: CPU {:+.3} points of one core ({:.2}x), RSS {:+.1} MiB (CPU is counted in USER_HZ ticks: {:.3} points is one tick over this window)",
        pct[0] - pct[1],
        pct[0] / pct[1].max(1e-9),
        rss[0] - rss[1],
        100.0 / clk_tck() / wall
    );
    if before_change.is_some() {
        // CPU is counted in ticks: a baseline with none has no ratio.
        let cpu = match pct[4] > 0.0 {
            true => format!("{:.2}x", pct[0] / pct[4]),
            false => "n/a (the baseline used no whole tick)".into(),
        };
        println!(
            "this build / the baseline build: CPU {cpu}, RSS {:.2}x (1.00: no worse)",
            rss[0] / rss[4].max(1e-9)
        );
    }
    // VmHWM against the end's VmRSS: what start-up (the load, BTF
    // lookups, the first scans) costs above the steady state.
    let peak = |i: usize| end[i].hwm_kb as f64 / end[i].rss_kb.max(1) as f64;
    println!(
        "start-up peak / steady RSS: vitalsd run {:.2}x (tp_btf programs where the kernel's BTF allows), pins path {:.2}x (target <= 1.5x)",
        peak(0),
        peak(pins_row)
    );
    println!(
        "vitalsd's BPF maps in kernel memory (fdinfo memlock, in no RSS): {:.1} MiB",
        bpf_map_kernel_kb(vitalsd.id())? as f64 / 1024.0
    );
    println!(
        "targets: CPU < 0.5% of one core ({}), RSS < 20 MiB ({})",
        if pct[0] < 0.5 { "met" } else { "MISSED" },
        if rss[0] < 20.0 { "met" } else { "MISSED" }
    );

    let kernel = kernel_side(&ours);
    drop(pins);
    for d in [
        Some(&mut vitalsd),
        Some(&mut without),
        before_change.as_mut(),
    ]
    .into_iter()
    .flatten()
    {
        unsafe { libc::kill(d.id() as i32, libc::SIGTERM) };
        let _ = d.wait();
    }
    drop(traced);
    let _ = std::fs::remove_dir_all(&dir);
    kernel
}

/// Kernel side: the first vitalsd's eBPF programs, with stats on for 10 s.
fn kernel_side(ours: &HashSet<u64>) -> Result<()> {
    set_bpf_stats(true)?;
    let t = Instant::now();
    let measured = (|| -> Result<(u64, u64)> {
        let r0 = bpf_run_time_ns(ours)?;
        std::thread::sleep(Duration::from_secs(10));
        Ok((r0, bpf_run_time_ns(ours)?))
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
    Ok(())
}

/// `vitalsd run` attaching the programs and maps `vitalsd pin` pinned on
/// a bpffs of its own; dropping it ends that daemon and unmounts the bpffs
/// (which releases the pins).
struct PinsPath {
    vitalsd: Child,
    bpffs: std::path::PathBuf,
}

impl PinsPath {
    fn start(dir: &Path, env: &[(&'static str, std::path::PathBuf)]) -> Result<Self> {
        let bpffs = dir.join("bpffs");
        std::fs::create_dir_all(&bpffs)?;
        let mounted = Command::new("mount")
            .args(["-t", "bpf", "bpf"])
            .arg(&bpffs)
            .status()
            .context("mounting a bpffs for the pins path")?;
        anyhow::ensure!(mounted.success(), "mount -t bpf: {mounted}");
        let unmount = |e: anyhow::Error| {
            let _ = Command::new("umount").arg(&bpffs).status();
            e
        };
        let pinned = Command::new(workspace_root().join("target/release/vitalsd"))
            .args(["pin", "--dir"])
            .arg(&bpffs)
            .stdout(Stdio::null())
            .status()
            .context("vitalsd pin")
            .map_err(unmount)?;
        if !pinned.success() {
            return Err(unmount(anyhow::anyhow!("vitalsd pin: {pinned}")));
        }
        let extra = format!(
            "[producer]\nenabled = false\n[sampling]\npin_dir = \"{}\"",
            bpffs.display()
        );
        let vitalsd = start_vitalsd(&dir.join("pins"), &extra, env).map_err(unmount)?;
        Ok(Self { vitalsd, bpffs })
    }
}

impl Drop for PinsPath {
    fn drop(&mut self) {
        unsafe { libc::kill(self.vitalsd.id() as i32, libc::SIGTERM) };
        let _ = self.vitalsd.wait();
        let _ = Command::new("umount").arg(&self.bpffs).status();
    }
}

fn tempfile_dir() -> Result<std::path::PathBuf> {
    let d = std::env::temp_dir().join(format!("vitalsd-bench-idle-{}", std::process::id()));
    std::fs::create_dir_all(&d)?;
    Ok(d)
}
