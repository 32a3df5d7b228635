//! `cargo xtask bench overhead --android`: what vitalsd's always-on
//! programs cost on an Android user build, where bpfloader loads them and
//! vitalsd attaches the classic tracepoints from the pins, against the
//! sched_switch program every Android device already runs: Android 11's
//! time_in_state.c.
//!
//! Both objects are loaded by AOSP's own loader (the host bpfloader of
//! android-check 1a) into bpffs mounts of ours, once; each round then
//! attaches one set and runs `perf bench sched pipe` pinned to CPU 0 (as
//! bench_overhead.rs), interleaved with nothing attached:
//! - vitalsd: `vitalsd record --pins` (sched_switch, the wakeups,
//!   sched_process_free, the fault program), i.e. vitalsd's attach path;
//! - time_in_state: tp_sched_switch attached to sched/sched_switch the way
//!   libtimeinstate's bpf_attach_tracepoint does (perf_event_open of the
//!   tracepoint, PERF_EVENT_IOC_SET_BPF), after filling cpu_policy_map,
//!   freq_to_idx_map and policy_freq_idx_map as libtimeinstate does at boot
//!   (from cpufreq's policies, or one synthetic policy where the machine
//!   has no cpufreq), so the program runs its whole per-switch path rather
//!   than returning at the first empty lookup.
//!
//! Then, in separate runs (the stats cost), each program's run_time_ns /
//! run_cnt from kernel.bpf_stats_enabled.

use std::{
    collections::HashMap,
    io::{BufRead, BufReader},
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{bail, ensure, Context, Result};

use super::loader::{self, AospTree, Bpffs};
use crate::{
    bench_overhead::{median, perf_bench},
    suites::Tool,
    util::{bpf_progs, set_bpf_stats, workspace_root},
};

#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
enum Config {
    Nothing,
    Vitalsd,
    TimeInState,
}

impl Config {
    fn name(self) -> &'static str {
        match self {
            Config::Nothing => "nothing attached",
            Config::Vitalsd => "vitalsd (bpfloader pins)",
            Config::TimeInState => "time_in_state (bpfloader)",
        }
    }
}

// ---- the few bpf(2) and perf_event_open(2) calls the attacher needs ----

const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
const BPF_OBJ_GET: libc::c_long = 7;
const PERF_TYPE_TRACEPOINT: u32 = 2;
/// _IOW('$', 8, __u32)
const PERF_EVENT_IOC_SET_BPF: libc::c_ulong = 0x4004_2408;
/// linux/perf_event.h
const PERF_FLAG_FD_CLOEXEC: libc::c_ulong = 1 << 3;
/// _IO('$', 0)
const PERF_EVENT_IOC_ENABLE: libc::c_ulong = 0x2400;

fn bpf(cmd: libc::c_long, attr: &mut [u64; 16]) -> std::io::Result<libc::c_long> {
    // SAFETY: attr is a zero-padded union bpf_attr of 128 bytes.
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr.as_mut_ptr(),
            std::mem::size_of_val(attr),
        )
    };
    if r < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// BPF_OBJ_GET of a pin.
fn obj_get(path: &Path) -> Result<OwnedFd> {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes())?;
    let mut attr = [0u64; 16];
    attr[0] = c.as_ptr() as u64;
    let fd =
        bpf(BPF_OBJ_GET, &mut attr).with_context(|| format!("BPF_OBJ_GET {}", path.display()))?;
    // SAFETY: the kernel just returned this descriptor to us.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

fn map_update(map: &OwnedFd, key: &[u8], value: &[u8]) -> Result<()> {
    let mut attr = [0u64; 16];
    attr[0] = map.as_raw_fd() as u64;
    attr[1] = key.as_ptr() as u64;
    attr[2] = value.as_ptr() as u64;
    attr[3] = 0; // BPF_ANY
    bpf(BPF_MAP_UPDATE_ELEM, &mut attr).context("BPF_MAP_UPDATE_ELEM")?;
    Ok(())
}

fn tracefs_event_id(cat: &str, ev: &str) -> Result<u64> {
    for root in ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"] {
        let p = format!("{root}/events/{cat}/{ev}/id");
        if let Ok(s) = std::fs::read_to_string(&p) {
            return Ok(s.trim().parse()?);
        }
    }
    bail!("no tracefs id for {cat}/{ev}")
}

/// A pinned program attached to a tracepoint as libbpf_android's
/// bpf_attach_tracepoint does; detached when dropped.
struct Attached {
    _event: OwnedFd,
}

fn attach_tracepoint(prog: &Path, cat: &str, ev: &str) -> Result<Attached> {
    let prog = obj_get(prog)?;
    let mut attr = [0u64; 16];
    // struct perf_event_attr: type, size (u32 each), then config.
    attr[0] = u64::from(PERF_TYPE_TRACEPOINT) | ((std::mem::size_of_val(&attr) as u64) << 32);
    attr[1] = tracefs_event_id(cat, ev)?;
    // pid -1, cpu 0: a tracepoint's BPF program runs on every CPU whichever
    // CPU the event is opened on.
    // SAFETY: attr is a zeroed perf_event_attr of the size it declares.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_perf_event_open,
            attr.as_ptr(),
            -1,
            0,
            -1,
            PERF_FLAG_FD_CLOEXEC,
        )
    };
    ensure!(
        fd >= 0,
        "perf_event_open {cat}/{ev}: {}",
        std::io::Error::last_os_error()
    );
    // SAFETY: just returned by the kernel.
    let event = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    for (req, arg) in [
        (PERF_EVENT_IOC_SET_BPF, prog.as_raw_fd() as libc::c_ulong),
        (PERF_EVENT_IOC_ENABLE, 0),
    ] {
        // SAFETY: ioctls on our own perf event fd.
        ensure!(
            unsafe { libc::ioctl(event.as_raw_fd(), req, arg) } == 0,
            "ioctl {req:#x} on {cat}/{ev}: {}",
            std::io::Error::last_os_error()
        );
    }
    Ok(Attached { _event: event })
}

/// One cpufreq policy as libtimeinstate reads it: (policy index, CPUs,
/// frequencies ascending, current frequency), frequencies in kHz.
type Policy = (u32, Vec<u32>, Vec<u32>, u32);

/// The cpufreq policies; None: no cpufreq here.
fn cpufreq_policies() -> Option<Vec<Policy>> {
    let dir = Path::new("/sys/devices/system/cpu/cpufreq");
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("policy"))
        .collect();
    names.sort_by_key(|n| n[6..].parse::<u32>().unwrap_or(u32::MAX));
    let read = |p: &Path| std::fs::read_to_string(p).ok();
    let nums = |s: &str| -> Vec<u32> {
        s.split_whitespace()
            .filter_map(|t| t.parse().ok())
            .collect()
    };
    let mut out = Vec::new();
    for (i, n) in names.iter().enumerate() {
        let p = dir.join(n);
        let cpus = nums(&read(&p.join("related_cpus"))?);
        let mut freqs = match read(&p.join("scaling_available_frequencies")) {
            Some(s) => nums(&s),
            None => read(&p.join("stats/time_in_state"))?
                .lines()
                .filter_map(|l| l.split_whitespace().next()?.parse().ok())
                .collect(),
        };
        freqs.sort_unstable();
        freqs.dedup();
        let cur = read(&p.join("scaling_cur_freq"))?.trim().parse().ok()?;
        out.push((i as u32, cpus, freqs, cur));
    }
    (!out.is_empty()).then_some(out)
}

/// Fills time_in_state's configuration maps as libtimeinstate's
/// initGlobals/startTrackingUidTimes do; returns what it set.
fn fill_time_in_state_maps(pins: &Path) -> Result<String> {
    let map = |name: &str| obj_get(&pins.join(format!("map_time_in_state_{name}")));
    let (cpu_policy, freq_to_idx, policy_freq_idx) = (
        map("cpu_policy_map")?,
        map("freq_to_idx_map")?,
        map("policy_freq_idx_map")?,
    );
    let (policies, source) = match cpufreq_policies() {
        Some(p) => (p, "from /sys/devices/system/cpu/cpufreq"),
        None => {
            // No cpufreq (a VM): one policy over the possible CPUs at one
            // fixed frequency, which is what such a device would report.
            let n = std::thread::available_parallelism().map_or(1, |n| n.get()) as u32;
            let cpus = possible_cpus().unwrap_or((0..n).collect());
            (
                vec![(0, cpus, vec![1_000_000], 1_000_000)],
                "synthetic: this machine has no cpufreq",
            )
        }
    };
    let mut lines = Vec::new();
    for (policy, cpus, freqs, cur) in &policies {
        for cpu in cpus {
            map_update(&cpu_policy, &cpu.to_ne_bytes(), &policy.to_ne_bytes())?;
        }
        let mut cur_idx = 0u8;
        for (i, f) in freqs.iter().enumerate() {
            // freq_to_idx_map starts at 1: 0 means "not initialised".
            let idx = (i + 1) as u8;
            let mut key = policy.to_ne_bytes().to_vec();
            key.extend_from_slice(&f.to_ne_bytes());
            map_update(&freq_to_idx, &key, &[idx])?;
            if f == cur {
                cur_idx = idx;
            }
        }
        ensure!(
            cur_idx != 0,
            "policy {policy}: current frequency {cur} not in {freqs:?}"
        );
        map_update(&policy_freq_idx, &policy.to_ne_bytes(), &[cur_idx])?;
        lines.push(format!(
            "  policy {policy}: cpus {cpus:?}, {} frequencies, current {cur} kHz (index {cur_idx}) [{source}]",
            freqs.len()
        ));
    }
    Ok(lines.join("\n"))
}

fn possible_cpus() -> Option<Vec<u32>> {
    let s = std::fs::read_to_string("/sys/devices/system/cpu/possible").ok()?;
    let mut v = Vec::new();
    for part in s.trim().split(',') {
        let (a, b) = part.split_once('-').unwrap_or((part, part));
        v.extend(a.parse::<u32>().ok()?..=b.parse::<u32>().ok()?);
    }
    Some(v)
}

/// One attached configuration, detached on drop.
enum Running {
    Vitalsd(Child),
    /// Held for its perf event: dropping it detaches the program.
    TimeInState(#[allow(dead_code)] Attached),
}

impl Running {
    fn start(cfg: Config, vitals_pins: &Path, tis_pins: &Path) -> Result<Option<Running>> {
        match cfg {
            Config::Nothing => Ok(None),
            Config::TimeInState => Ok(Some(Running::TimeInState(attach_tracepoint(
                &tis_pins.join("prog_time_in_state_tracepoint_sched_sched_switch"),
                "sched",
                "sched_switch",
            )?))),
            Config::Vitalsd => {
                let mut child = Command::new(workspace_root().join("target/release/vitalsd"))
                    .args(["record", "--duration", "1h", "--interval", "1s", "--pins"])
                    .arg(vitals_pins)
                    .arg("--out")
                    .arg(workspace_root().join("target/bench-android.pftrace"))
                    .env("RUST_LOG", "info")
                    .stdout(Stdio::null())
                    .stderr(Stdio::piped())
                    .spawn()
                    .context("starting vitalsd")?;
                let err = child.stderr.take().unwrap();
                let (tx, rx) = std::sync::mpsc::channel();
                std::thread::spawn(move || {
                    let mut told = false;
                    for l in BufReader::new(err).lines().map_while(Result::ok) {
                        if !told && l.contains("attached from pins") {
                            let _ = tx.send(());
                            told = true;
                        }
                    }
                });
                if rx.recv_timeout(Duration::from_secs(60)).is_err() {
                    let _ = child.kill();
                    let _ = child.wait();
                    bail!(
                        "vitalsd did not attach from {} within 60 s",
                        vitals_pins.display()
                    );
                }
                Ok(Some(Running::Vitalsd(child)))
            }
        }
    }

    fn stop(self) {
        if let Running::Vitalsd(mut c) = self {
            unsafe { libc::kill(c.id() as i32, libc::SIGINT) };
            let deadline = Instant::now() + Duration::from_secs(30);
            while c.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Program ids of the pins in `dir` named `prefix*`, with their pin names.
fn pinned_prog_ids(dir: &Path, prefix: &str) -> Result<Vec<(u64, String)>> {
    let mut v = Vec::new();
    for e in std::fs::read_dir(dir)? {
        let name = e?.file_name().to_string_lossy().into_owned();
        if !name.starts_with(prefix) {
            continue;
        }
        let json = crate::util::output(
            Command::new("bpftool")
                .args(["prog", "show", "pinned"])
                .arg(dir.join(&name))
                .arg("--json"),
        )?;
        let id = serde_json::from_str::<serde_json::Value>(&json)?["id"]
            .as_u64()
            .context("bpftool gave no id")?;
        v.push((id, name));
    }
    v.sort();
    Ok(v)
}

pub fn run(rounds: usize, loops: u64, aosp: Option<PathBuf>) -> Result<()> {
    let root = workspace_root();
    let dir = match aosp {
        Some(d) => d,
        None => Tool::AospTree
            .find()
            .map_err(|e| anyhow::anyhow!("no AOSP tree ({e}); {}", Tool::AospTree.how()))?,
    };
    let tree =
        AospTree::find(&dir).with_context(|| format!("{} is not an AOSP tree", dir.display()))?;
    let work = super::target_dir().join("android-bench");
    std::fs::create_dir_all(&work)?;
    let loader_bin = work.join("host-bpfloader");
    loader::build_loader(&root, &tree, &loader_bin)?;
    let vitals_o = crate::android_bpf::write(&root)?;
    let tis_o = work.join("time_in_state.o");
    compile_time_in_state(&tree, &tis_o)?;

    let vitals_fs = Bpffs::mount(work.join(format!("vitals-{}", std::process::id())))?;
    let tis_fs = Bpffs::mount(work.join(format!("tis-{}", std::process::id())))?;
    loader::run_loader(&loader_bin, &vitals_fs, "user", &[&vitals_o])?;
    loader::run_loader(&loader_bin, &tis_fs, "user", &[&tis_o])?;
    println!(
        "AOSP bpfloader loaded {} and {}",
        vitals_o.display(),
        tis_o.display()
    );
    println!("time_in_state maps filled as libtimeinstate does at boot:");
    println!("{}", fill_time_in_state_maps(&tis_fs.dir)?);

    let configs = [Config::Nothing, Config::Vitalsd, Config::TimeInState];
    let mut results: HashMap<Config, Vec<f64>> = HashMap::new();
    let mut paired: Vec<f64> = Vec::new();
    set_bpf_stats(false)?;
    println!("\nperf bench sched pipe -l {loops}, taskset -c 0, {rounds} interleaved rounds");
    for round in 0..rounds {
        for i in 0..configs.len() {
            let cfg = configs[(i + round) % configs.len()];
            let running = Running::start(cfg, &vitals_fs.dir, &tis_fs.dir)?;
            let ops = perf_bench(loops);
            if let Some(r) = running {
                r.stop();
            }
            let ops = ops?;
            println!("  round {round}: {:<28} {:>10.0} ops/s", cfg.name(), ops);
            results.entry(cfg).or_default().push(ops);
        }
        let this = |c: Config| results[&c][round];
        let tis_loss = 1.0 - this(Config::TimeInState) / this(Config::Nothing);
        let v_loss = 1.0 - this(Config::Vitalsd) / this(Config::Nothing);
        paired.push(v_loss / tis_loss.max(1e-9));
    }
    let med = |c: Config| median(results[&c].clone());
    let base = med(Config::Nothing);
    let loss = |x: f64| (1.0 - x / base) * 100.0;
    println!("\nmedian ops/s and throughput loss against nothing attached ({base:.0} ops/s):");
    for c in [Config::Vitalsd, Config::TimeInState] {
        println!(
            "  {:<28} {:>10.0} ops/s  loss {:>5.1}%",
            c.name(),
            med(c),
            loss(med(c))
        );
    }
    let ratio = loss(med(Config::Vitalsd)) / loss(med(Config::TimeInState)).max(1e-9);
    paired.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let q = |f: f64| paired[((paired.len() - 1) as f64 * f).round() as usize];
    println!(
        "loss ratio vitalsd / time_in_state: {ratio:.2} of the medians; paired within rounds \
         {:.2} ({:.2} .. {:.2} quartiles); target <= 1",
        median(paired.clone()),
        q(0.25),
        q(0.75)
    );

    println!("\nper-event cost (kernel.bpf_stats_enabled=1, run_time_ns / run_cnt):");
    let vitals_ids = pinned_prog_ids(&vitals_fs.dir, "prog_vitals_")?;
    let tis_ids = pinned_prog_ids(&tis_fs.dir, "prog_time_in_state_")?;
    set_bpf_stats(true)?;
    let stats = (|| -> Result<Vec<(Config, String, f64, u64)>> {
        let mut out = Vec::new();
        for (cfg, ids) in [
            (Config::Vitalsd, &vitals_ids),
            (Config::TimeInState, &tis_ids),
        ] {
            let before = bpf_progs()?;
            let running = Running::start(cfg, &vitals_fs.dir, &tis_fs.dir)?;
            let r = perf_bench(loops);
            if let Some(x) = running {
                x.stop();
            }
            r?;
            let after = bpf_progs()?;
            for (id, name) in ids {
                let (Some(a), Some(b)) = (after.get(id), before.get(id)) else {
                    continue;
                };
                let (ns, cnt) = (a.run_time_ns - b.run_time_ns, a.run_cnt - b.run_cnt);
                if cnt > 0 {
                    out.push((cfg, name.clone(), ns as f64 / cnt as f64, cnt));
                }
            }
        }
        Ok(out)
    })();
    set_bpf_stats(false)?;
    let stats = stats?;
    for (cfg, name, per, cnt) in &stats {
        println!(
            "  {:<28} {:<52} {:>7.1} ns/event over {cnt} events",
            cfg.name(),
            name,
            per
        );
    }
    let switch = |c: Config| {
        stats
            .iter()
            .find(|(cfg, n, _, _)| *cfg == c && n.ends_with("sched_sched_switch"))
            .map(|s| s.2)
    };
    match (switch(Config::Vitalsd), switch(Config::TimeInState)) {
        (Some(v), Some(t)) => println!(
            "sched_switch program: vitalsd {v:.1} ns/event vs time_in_state {t:.1} ns/event, \
             ratio {:.2} (target < 1)",
            v / t
        ),
        (v, _) => println!(
            "sched_switch program: no BPF stats for {} (run_cnt did not move)",
            if v.is_none() {
                "vitalsd"
            } else {
                "time_in_state"
            }
        ),
    }
    println!(
        "(vitalsd counts per task on-CPU time, voluntary/involuntary switches, runqueue wait \
         and faults; time_in_state per uid time at each CPU frequency and concurrency)"
    );
    Ok(())
}

/// clang for BPF against the AOSP headers, as the recipe.
fn compile_time_in_state(tree: &AospTree, out: &Path) -> Result<()> {
    let src = tree.bpfprogs.join("time_in_state.c");
    let mut cmd = Command::new("clang-22");
    cmd.args([
        "-O2",
        "-target",
        "bpf",
        "-D__x86_64__",
        "-D__unused=__attribute__((unused))",
        "-Wno-duplicate-decl-specifier",
    ])
    .arg("-I")
    .arg(tree.system_bpf.join("progs/include"))
    .arg("-I")
    .arg(tree.connectivity_native.join("bpf_headers/include/bpf"))
    .arg("-I")
    .arg(tree.connectivity_native.join("bpf_headers/include"))
    .args([
        "-I",
        loader::DEBIAN_ANDROID_INCLUDE,
        "-I",
        "/usr/include/x86_64-linux-gnu",
        "-c",
    ])
    .arg(&src)
    .arg("-o")
    .arg(out);
    let o = cmd.output().context("running clang-22")?;
    ensure!(
        o.status.success(),
        "compiling {}:\n{}",
        src.display(),
        String::from_utf8_lossy(&o.stderr)
    );
    Ok(())
}
