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

/// This machine as the sizing sees it: pid_max, possible CPUs, page size.
fn this_machine() -> (vitalsd::bpf::MachineBounds, u32) {
    let read = |p: &str| std::fs::read_to_string(p).unwrap().trim().to_owned();
    let machine = vitalsd::bpf::MachineBounds {
        pid_max: read("/proc/sys/kernel/pid_max").parse().unwrap(),
        possible_cpus: vitalsd::system::parse_cpu_list(&read("/sys/devices/system/cpu/possible"))
            .unwrap()
            .len() as u32,
    };
    (machine, unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as u32)
}

/// The computed map the kernel's `held` is (the kernel keeps 15 bytes of
/// a name), which must charge what was computed within 1 KiB: the fixed
/// part of a map is kernel structs whose size moves between versions and
/// configs by a few hundred bytes.
fn assert_held_as_computed<'a>(
    held: &vitals_tests::bpf_stats::MapInfo,
    computed: &'a [vitalsd::bpf::memory::MapMemory],
    report: &str,
) -> &'a vitalsd::bpf::memory::MapMemory {
    let c = computed
        .iter()
        .find(|c| c.def.name.get(..15).unwrap_or(&c.def.name) == held.name)
        .unwrap_or_else(|| panic!("{} is not in the computed maps: {computed:?}", held.name));
    assert!(
        held.memlock.abs_diff(c.bytes) <= 1024,
        "{}: {} bytes held, {} computed\n{report}",
        held.name,
        held.memlock,
        c.bytes
    );
    c
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
    let (machine, page) = this_machine();
    let computed = vitalsd::service::run_kernel_memory(&cfg, machine, run_delay, page)
        .unwrap()
        .held;
    let held = maps_of(d.pid());
    let mut report = String::new();
    let (mut held_total, mut computed_total) = (0, 0);
    for m in &held {
        let c = assert_held_as_computed(m, &computed, &report);
        report += &format!(
            "{:<16} {:>9} held {:>9} computed\n",
            m.name, m.memlock, c.bytes
        );
        held_total += m.memlock;
        computed_total += c.bytes;
    }
    assert_eq!(held.len(), computed.len(), "{held:?}\n{computed:?}");
    eprintln!("{report}{held_total} held, {computed_total} computed on {machine:?}");
    assert!(
        held_total.abs_diff(computed_total) * 100 <= computed_total,
        "{held_total} held against {computed_total} computed\n{report}"
    );
}

/// #22 item 4: a capture's own maps (ring buffer, stacks, fault-sampling
/// and off-CPU LRU hashes) exist only while it runs. The kernel's view of
/// the daemon's maps (its fds' fdinfo): at rest none of them beyond the
/// plain maps' minimum; during a sched + faults capture the ring buffer,
/// the stack map and the fault counters appear, at the sizes
/// `run_kernel_memory` computes for a capture (memlock within the kernel structs'
/// variation, from Linux 6.4); once the capture is stored they are gone
/// and the daemon holds what it held before.
#[test]
fn a_captures_own_maps_are_held_only_while_it_runs() {
    use vitals_tests::bpf_stats::{maps_of, MapInfo};
    use vitalsd::control::Request;
    let d = Daemon::start("");
    d.wait_status("a sample", Duration::from_secs(10), |st| {
        st["samples"].as_u64().unwrap_or(0) > 0
    });
    let ids = |maps: &[MapInfo]| -> Vec<u32> { maps.iter().map(|m| m.id).collect() };
    let at_rest = maps_of(d.pid());
    let v = d.call(&Request::Capture {
        duration_s: 3.0,
        sched: true,
        faults: true,
        offcpu: None,
    });
    let id = v["id"].as_str().expect("a capture id").to_owned();
    // Its maps, as the kernel lists the daemon's fds while it runs.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let own: Vec<MapInfo> = loop {
        let new: Vec<MapInfo> = maps_of(d.pid())
            .into_iter()
            .filter(|m| !ids(&at_rest).contains(&m.id))
            .collect();
        if new.len() >= 3 {
            break new;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the capture's maps never appeared: {new:?}\n{}",
            d.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut names: Vec<&str> = own.iter().map(|m| m.name.as_str()).collect();
    names.sort_unstable();
    // No off-CPU capture: its two LRU hashes are not made.
    assert_eq!(
        names,
        // The kernel keeps 15 bytes of a name.
        ["CAPTURE_EVENTS", "CAPTURE_FAULT_C", "CAPTURE_STACKS"],
        "{own:?}"
    );
    assert_made_as_their_templates(d.pid(), &own);
    if vitals_tests::kernel_version() >= (6, 4) {
        let cfg = vitalsd::config::Config::load(&d.config_path()).unwrap();
        let (machine, page) = this_machine();
        let computed = vitalsd::service::run_kernel_memory(&cfg, machine, true, page)
            .unwrap()
            .per_capture;
        for m in &own {
            let c = assert_held_as_computed(m, &computed, "");
            assert_eq!(m.max_entries, u64::from(c.def.max_entries), "{m:?}");
        }
    }
    // Stored: its maps are gone, nothing else came or went.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !d.list().iter().any(|m| m["id"] == id.as_str()) {
        assert!(
            std::time::Instant::now() < deadline,
            "capture {id} never stored\n{}",
            d.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let after = maps_of(d.pid());
    let mut before_ids = ids(&at_rest);
    let mut after_ids = ids(&after);
    before_ids.sort_unstable();
    after_ids.sort_unstable();
    assert_eq!(after_ids, before_ids, "held after the capture: {after:?}");
}

/// Each capture map is made as aya's `load` made its slot's template: the
/// LRU hash with the object's BTF (the id the daemon's programs carry),
/// the ring buffer and the stack map with none (aya gives those map types
/// no BTF). Linux 5.15 to 6.1 refuse a slot's map otherwise
/// (`bpf_map_meta_equal` compares `timer_off`, which BTF changes): the
/// off-CPU captures of the 6.1 guests failed that way. Asked of the
/// kernel, through bpftool.
fn assert_made_as_their_templates(pid: i32, own: &[vitals_tests::bpf_stats::MapInfo]) {
    use vitals_tests::bpf_stats::{btf_id_of, programs_of};
    let object_btf = programs_of(pid)
        .iter()
        .map(|p| btf_id_of("prog", p.id))
        .find(|&id| id != 0)
        .expect("the daemon's programs carry the object's BTF");
    for m in own {
        let expected = match m.map_type {
            vitals_tests::bpf_stats::BPF_MAP_TYPE_LRU_HASH => object_btf,
            _ => 0,
        };
        assert_eq!(btf_id_of("map", m.id), expected, "{m:?}");
    }
}
