//! #22 item 4: what start-up costs in memory above the steady state. On a
//! phone every system daemon's peak counts against low-memory kills at
//! boot, so the peak (the kernel's VmHWM) may be at most 1.5x the steady
//! resident set (VmRSS), on both ways the programs get in: loaded by
//! vitalsd (tp_btf where the kernel has BTF) and attached from pins.

use std::time::Duration;

use vitals_tests::{bpffs, daemon::Daemon};

/// (VmHWM, VmRSS) of `pid` in KiB, from the kernel's /proc/<pid>/status.
fn peak_and_rss_kb(pid: i32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb = |key: &str| -> u64 {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {key} in {status}"))
    };
    (kb("VmHWM:"), kb("VmRSS:"))
}

/// Lets the daemon sample a while (the test config samples every 250 ms)
/// and checks its peak against its resident set then.
fn assert_peak_within_half_again(d: &Daemon, path: &str) {
    std::thread::sleep(Duration::from_secs(3));
    let (peak, rss) = peak_and_rss_kb(d.pid());
    assert!(
        peak as f64 <= 1.5 * rss as f64,
        "{path}: start-up peak {peak} KiB against {rss} KiB steady ({:.2}x)\n{}",
        peak as f64 / rss as f64,
        d.log()
    );
}

#[test]
fn startup_peak_is_within_half_again_of_steady_rss_when_loading() {
    let d = Daemon::start("");
    if std::path::Path::new("/sys/kernel/btf/vmlinux").exists() {
        // The path that read vmlinux BTF: its lookups were the peak.
        assert!(d.log().contains("scheduler programs tp_btf"), "{}", d.log());
    }
    assert_peak_within_half_again(&d, "loading");
}

#[test]
fn startup_peak_is_within_half_again_of_steady_rss_from_pins() {
    let fs = bpffs::pin();
    let d = Daemon::start_with(
        &vitals_tests::daemon::Tables {
            sampling: &format!("pin_dir = \"{}\"", fs.0.path().display()),
            ..Default::default()
        },
        "",
        Vec::new(),
    );
    assert!(d.log().contains("attached from pins"), "{}", d.log());
    assert_peak_within_half_again(&d, "pins");
    drop(d);
}

/// #22 item 4's kernel memory: every BPF map a daemon with the default
/// sizing holds, as the kernel charges it (fdinfo `memlock`, which is
/// the map's `map_mem_usage` from Linux 6.4), is what
/// `run_kernel_memory` computes for this machine's pid_max, possible CPUs
/// and page size: so the figure it computes for a phone (8 CPUs, in the
/// daemon's unit tests and README) is the one a phone's kernel would
/// charge. Before 6.4 fdinfo reports a rough footprint instead, which
/// says nothing about the memory.
#[test]
fn bpf_map_memory_is_what_the_sizing_computes_for_this_machine() {
    use vitals_tests::bpf_stats::maps_of;
    if vitals_tests::kernel_version() < (6, 4) {
        eprintln!("skipped: fdinfo memlock is map_mem_usage from Linux 6.4");
        return;
    }
    let d = Daemon::start("");
    d.wait_status("a sample", Duration::from_secs(10), |st| {
        st["samples"].as_u64().unwrap_or(0) > 0
    });
    let run_delay = d
        .log()
        .contains("runqueue wait from the kernel's sched_info.run_delay");
    let cfg = vitalsd::config::Config::load(&d.config_path()).unwrap();
    let read = |p: &str| std::fs::read_to_string(p).unwrap().trim().to_owned();
    let machine = vitalsd::bpf::MachineBounds {
        pid_max: read("/proc/sys/kernel/pid_max").parse().unwrap(),
        possible_cpus: vitalsd::system::parse_cpu_list(&read("/sys/devices/system/cpu/possible"))
            .unwrap()
            .len() as u32,
    };
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as u32;
    let computed = vitalsd::service::run_kernel_memory(&cfg, machine, run_delay, page).unwrap();
    let held = maps_of(d.pid());
    let mut report = String::new();
    let (mut held_total, mut computed_total) = (0, 0);
    for m in &held {
        // The kernel keeps 15 bytes of a map's name.
        let c = computed
            .iter()
            .find(|c| c.def.name.get(..15).unwrap_or(&c.def.name) == m.name)
            .unwrap_or_else(|| panic!("{} is not in the computed maps: {computed:?}", m.name));
        report += &format!(
            "{:<16} {:>9} held {:>9} computed\n",
            m.name, m.memlock, c.bytes
        );
        held_total += m.memlock;
        computed_total += c.bytes;
        // The fixed part of a map is kernel structs whose size moves
        // between versions and configs by a few hundred bytes.
        assert!(
            m.memlock.abs_diff(c.bytes) <= 1024,
            "{}: {} bytes held, {} computed\n{report}",
            m.name,
            m.memlock,
            c.bytes
        );
    }
    assert_eq!(held.len(), computed.len(), "{held:?}\n{computed:?}");
    eprintln!("{report}{held_total} held, {computed_total} computed on {machine:?}");
    assert!(
        held_total.abs_diff(computed_total) * 100 <= computed_total,
        "{held_total} held against {computed_total} computed\n{report}"
    );
}
