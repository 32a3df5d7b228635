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
