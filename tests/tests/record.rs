//! `vitalsd record` end to end: the binary, the printed table, and the trace
//! decoded with the official Perfetto schema.

use std::{process::Command, time::Duration};

use vitals_tests::*;

/// `vitalsd record ARGS`, returning once its programs are attached.
fn start(args: &[&str]) -> Recording {
    Recording::start(args, "eBPF accounting attached")
}

/// The printed ONCPU_MS column for `pid`.
fn printed_oncpu_ms(table: &str, pid: u32) -> String {
    table
        .lines()
        .find(|l| l.split_whitespace().next() == Some(&pid.to_string()))
        .unwrap_or_else(|| panic!("pid {pid} not in the table:\n{table}"))
        .split_whitespace()
        .nth(2)
        .unwrap()
        .to_owned()
}

#[test]
fn trace_holds_system_info_process_tree_and_counters_equal_to_the_table() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("t.pftrace");
    let rec = start(&[
        "--duration",
        "3s",
        "--interval",
        "500ms",
        "--top",
        "0",
        "--out",
        trace.to_str().unwrap(),
    ]);
    let mut w = Workload::spawn(&["spin", "1200"]);
    w.expect("ready");
    w.expect("done");
    let pid = w.pid();
    let table = rec.wait();
    w.finish();

    let t = decode_trace(&trace);
    let uname = nix::sys::utsname::uname().unwrap();
    let si = &t["system_info"];
    assert_eq!(si["utsname"]["release"], uname.release().to_str().unwrap());
    assert_eq!(si["hz"].as_u64().unwrap(), clk_tck());
    assert_eq!(
        si["page_size"].as_u64().unwrap(),
        unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as u64
    );
    let clocks: Vec<u64> = t["clock_snapshots"][0]["clocks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["clock_id"].as_u64().unwrap())
        .collect();
    assert!(
        clocks.contains(&6) && clocks.contains(&3),
        "BOOTTIME and MONOTONIC: {clocks:?}"
    );
    // The first two packets: clock snapshot, then system info.
    assert_eq!(t["packets"][0]["kind"], "clock_snapshot");
    assert_eq!(t["packets"][1]["kind"], "system_info");

    let wl = workload_bin();
    let entry = t["process_tree"]["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["pid"].as_u64() == Some(pid as u64))
        .unwrap_or_else(|| panic!("no ProcessTree entry for {pid}"));
    let cmdline: Vec<&str> = entry["cmdline"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert_eq!(cmdline, vec![wl.to_str().unwrap(), "spin", "1200"]);

    let track = t["track_descriptors"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| {
            d["name"] == "oncpu_ns"
                && t["track_descriptors"].as_array().unwrap().iter().any(|p| {
                    p["uuid"] == d["parent_uuid"]
                        && p["process"]["pid"].as_u64() == Some(pid as u64)
                })
        })
        .unwrap_or_else(|| panic!("no oncpu_ns counter track for {pid}"));
    assert_eq!(track["counter"]["unit"], "UNIT_TIME_NS");
    let series = t["counters"][track["uuid"].to_string()].as_array().unwrap();
    let last_ns = series.last().unwrap()[1].as_f64().unwrap();
    assert!(last_ns >= 1.0e9, "spinner on-CPU {last_ns} ns");
    assert_eq!(
        format!("{:.3}", last_ns / 1e6),
        printed_oncpu_ms(&table, pid)
    );
    assert!(
        table.contains("capabilities after attach: CAP_BPF\n"),
        "{table}"
    );
}

#[test]
fn sigint_stops_early_and_leaves_a_valid_trace() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("t.pftrace");
    let rec = start(&["--duration", "60s", "--out", trace.to_str().unwrap()]);
    std::thread::sleep(Duration::from_millis(1500));
    unsafe { libc::kill(rec.child.id() as i32, libc::SIGINT) };
    let table = rec.wait();
    assert!(table.contains("trace: "), "{table}");
    // The recording says how long it ran: stopped by the signal, not by
    // the minute it was asked for.
    let recorded_s: f64 = table
        .lines()
        .find_map(|l| l.strip_prefix("vitalsd record: "))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no duration line in:\n{table}"));
    assert!(
        recorded_s < 30.0,
        "ran {recorded_s} s of 60 despite SIGINT at 1.5 s"
    );
    let t = decode_trace(&trace);
    assert!(t["packet_count"].as_u64().unwrap() > 3);
    assert!(
        !t["counters"].as_object().unwrap().is_empty(),
        "no counter written before SIGINT"
    );
}

#[test]
fn tiny_map_bound_counts_drops_and_recording_completes() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("t.pftrace");
    let rec = start(&[
        "--duration",
        "2s",
        "--max-tasks",
        "16",
        // The bound is the hash's; tids below pid_max have array slots.
        "--task-hash-only",
        "--out",
        trace.to_str().unwrap(),
    ]);
    let mut w = Workload::spawn(&["threads", "64", "300"]);
    w.expect("done");
    let table = rec.wait();
    w.finish();
    let drops = map_drop(&table, "task_map_full");
    assert!(drops > 0, "{table}");
    decode_trace(&trace);
}

/// Without CAP_BPF the error names the capability, not a bare EPERM.
#[test]
fn unprivileged_load_names_the_missing_capability() {
    use std::os::unix::process::CommandExt;
    require_root();
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o777),
    )
    .unwrap();
    let out = Command::new(vitalsd_bin())
        .args(["record", "--duration", "1s", "--out"])
        .arg(dir.path().join("t.pftrace"))
        .uid(65534)
        .gid(65534)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("CAP_BPF") && err.contains("CAP_PERFMON"),
        "{err}"
    );
}
