//! Attach-from-pins: what vitalsd does on Android user builds, where only
//! bpfloader may load programs. Here `vitalsd pin` plays bpfloader, pinning
//! into a bpffs mounted in a temporary directory.

use std::process::Command;

use vitals_tests::{bpffs::pin, *};

/// `vitalsd record --pins PINS` around the workloads' runs: they start
/// once vitalsd logs `marker` (its programs are attached) and vitalsd is
/// stopped with SIGINT once every one is done, so neither how long the
/// attach takes nor how long they take in wall time (a QEMU TCG guest of
/// `cargo xtask vm-test` is slow) can cut them short.
/// `extra`: more flags for `record`. Returns vitalsd's (stdout, stderr)
/// and the trace as `trace_summary.py --capture` decodes it.
fn record(
    pins: &std::path::Path,
    ws: &mut [&mut Workload],
    marker: &str,
    extra: &[&str],
) -> (String, String, serde_json::Value) {
    record_with(pins, ws, marker, extra, Command::new(vitalsd_bin()))
}

/// `record`, with vitalsd started from `cmd` (its program and settings).
fn record_with(
    pins: &std::path::Path,
    ws: &mut [&mut Workload],
    marker: &str,
    extra: &[&str],
    mut cmd: Command,
) -> (String, String, serde_json::Value) {
    use std::io::{BufRead, BufReader, Read};
    let dir = tempfile::tempdir().unwrap();
    let mut child = cmd
        .args(["record", "--duration", "600s", "--top", "0", "--pins"])
        .arg(pins)
        .args(extra)
        .arg("--out")
        .arg(dir.path().join("t.pftrace"))
        .env("RUST_LOG", "info")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let guard = KillOnDrop(child.id());
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let mut log = String::new();
    while !log.contains(marker) {
        let mut line = String::new();
        assert!(
            err.read_line(&mut line).unwrap() > 0,
            "vitalsd exited before logging {marker:?}:\n{log}"
        );
        // It would record on without ever logging the marker.
        assert!(
            !line.contains("/proc-only"),
            "vitalsd went /proc-only instead of logging {marker:?}:\n{log}{line}"
        );
        log.push_str(&line);
    }
    let rest = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    for w in ws.iter_mut() {
        w.go();
    }
    for w in ws.iter_mut() {
        w.expect("done");
    }
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let out = child.wait_with_output().unwrap();
    std::mem::forget(guard);
    log.push_str(&rest.join().unwrap());
    assert!(out.status.success(), "{log}");
    let trace = decode_trace_with(&dir.path().join("t.pftrace"), &["--capture"]);
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        log,
        trace,
    )
}

/// Kills the recorder if the test panics before stopping it.
struct KillOnDrop(u32);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.0 as i32),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
}

fn oncpu_ms(table: &str, pid: u32) -> f64 {
    table
        .lines()
        .find(|l| l.split_whitespace().next() == Some(&pid.to_string()))
        .and_then(|l| l.split_whitespace().nth(2))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("pid {pid} not in:\n{table}"))
}

#[test]
fn daemon_attaches_pinned_programs_and_reads_pinned_maps() {
    let fs = pin();
    for name in [
        "prog_vitals_sched_switch_fixed",
        "prog_vitals_sched_process_free",
        "map_vitals_TASKS",
        "map_vitals_EXITED",
    ] {
        assert!(fs.0.path().join(name).exists(), "{name} not pinned");
    }
    // `pin` exits without attaching: nothing counts until a reader attaches.
    let mut w = Workload::spawn(&["pinned-spin", "1", "500"]);
    w.expect("ready");
    let (table, log, _) = record(fs.0.path(), &mut [&mut w], "attached from pins", &[]);
    assert!(log.contains("attached from pins"), "{log}");
    let ms = oncpu_ms(&table, w.pid());
    assert!(
        ms >= 450.0,
        "spinner on-CPU {ms} ms through the pinned programs"
    );
    w.finish();
}

#[test]
fn without_pins_the_daemon_loads_its_own_object() {
    let empty = tempfile::tempdir().unwrap();
    let mut w = Workload::spawn(&["pinned-spin", "1", "300"]);
    w.expect("ready");
    let (table, log, _) = record(empty.path(), &mut [&mut w], "eBPF accounting attached", &[]);
    assert!(log.contains("loading with aya"), "{log}");
    assert!(!log.contains("attached from pins"));
    assert!(oncpu_ms(&table, w.pid()) >= 250.0);
    w.finish();
}

/// #12: captures through the pins, as on a user build: `record --sched
/// --pins` switches on the pinned capture tier (sched_waking, the ring
/// buffer, the CAPTURE flag) and its trace holds the spinner's switches.
#[test]
fn a_sched_capture_runs_through_the_pinned_capture_tier() {
    let fs = pin();
    for name in [
        "prog_vitals_sched_waking_fixed",
        "map_vitals_CAPTURE",
        "map_vitals_CAPTURE_EVENTS",
    ] {
        assert!(fs.0.path().join(name).exists(), "{name} not pinned");
    }
    let mut w = Workload::spawn(&["pinned-spin", "1", "300"]);
    w.expect("ready");
    let (_, log, trace) = record(fs.0.path(), &mut [&mut w], "capture started", &["--sched"]);
    assert!(log.contains("capture tier pinned"), "{log}");
    let pid = i64::from(w.pid());
    let switches = |field: &str| -> usize {
        trace["compact_sched"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|b| b[field].as_array().unwrap())
            .filter(|e| {
                e[if field == "switches" {
                    "next_pid"
                } else {
                    "pid"
                }] == pid
            })
            .count()
    };
    // The spinner was switched in at least once while it spun, and the
    // pinned sched_waking saw it woken from its wait for "go".
    assert!(
        switches("switches") > 0,
        "spinner never switched in:\n{log}"
    );
    assert!(switches("wakings") > 0, "spinner never woken:\n{log}");
    w.finish();
}

/// Android's user builds give vitalsd no capability at all (AOSP reserves
/// CAP_PERFMON and defines no capability2 bpf): init sets
/// perf_event_paranoid to -1 where the kernel has the perf LSM hooks and
/// bpfloader leaves unprivileged_bpf_disabled at 0, so SELinux alone gates
/// perf_event_open and bpf(2) (sepolicy/vitalsd.te). With those two
/// settings here, a vitalsd holding no capability attaches from pins and
/// counts a spinner within 10 % of the kernel's own figure.
#[test]
fn pinned_programs_attach_with_no_capability_as_on_android() {
    let fs = pin();
    let _sysctls = Sysctls::set(&[
        ("/proc/sys/kernel/perf_event_paranoid", "-1"),
        ("/proc/sys/kernel/unprivileged_bpf_disabled", "0"),
    ]);
    let last_cap: libc::c_ulong = std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let mut cmd = Command::new(vitalsd_bin());
    // Safety: prctl only, between fork and exec. Every capability leaves
    // the bounding set, so the exec'd vitalsd, though uid 0, holds none.
    unsafe {
        use std::os::unix::process::CommandExt;
        cmd.pre_exec(move || {
            for cap in 0..=last_cap {
                if libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    let mut w = Workload::spawn(&["pinned-spin", "1", "500"]);
    w.expect("ready");
    let (table, log, _) = record_with(fs.0.path(), &mut [&mut w], "attached from pins", &[], cmd);
    assert!(
        !log.contains("proc-only"),
        "a vitalsd with no capability fell back to /proc:\n{log}"
    );
    let ms = oncpu_ms(&table, w.pid());
    let kernel_ms = schedstat(w.pid()).0 as f64 / 1e6;
    assert_within_pct(
        "spinner on-CPU ms, pinned programs, no capability",
        ms,
        kernel_ms,
        10.0,
    );
    w.finish();
}

/// The env var naming a bpffs into which AOSP's own bpfloader
/// (android/host-loader) loaded `target/dist/bpf/vitals.o`.
const AOSP_PINS_ENV: &str = "VITALS_AOSP_PINS";

/// #12 check 1a where xtask cannot drive it, i.e. inside the kernel
/// matrix's guests (`cargo xtask vm-test`, row android::bpfloader-pins):
/// the matrix's script runs AOSP's loader on vitals.o into a fresh bpffs and
/// then this test, which attaches vitalsd from those pins and checks a
/// spinner's on-CPU time against utime+stime and a page-toucher's faults
/// against minflt, within 10 %, both read from this kernel's /proc.
/// Ignored in plain `cargo test`: without the loader's pins there is
/// nothing to check (`cargo xtask android-check` runs 1a on the host).
#[test]
#[ignore = "needs VITALS_AOSP_PINS, a bpffs AOSP's bpfloader loaded vitals.o into (cargo xtask vm-test)"]
fn aosp_loader_pins_count_a_spinner_and_a_page_toucher_as_proc_does() {
    const SPIN_MS: u64 = 800;
    const PAGES: u64 = 20_000;
    let pins = std::path::PathBuf::from(
        std::env::var_os(AOSP_PINS_ENV).unwrap_or_else(|| panic!("{AOSP_PINS_ENV} is not set")),
    );
    // bpfloader's names (prog_<obj>_<section>), which `vitalsd pin` never
    // makes: these are the AOSP loader's pins, not ours.
    for name in [
        "prog_vitals_tracepoint_sched_sched_switch",
        "prog_vitals_tracepoint_sched_sched_process_free",
        "map_vitals_TASKS",
    ] {
        assert!(
            pins.join(name).exists(),
            "{name} not pinned in {}",
            pins.display()
        );
    }
    let mut spin = Workload::spawn(&["pinned-spin", "1", &SPIN_MS.to_string()]);
    let mut touch = Workload::spawn(&["touch", &PAGES.to_string()]);
    spin.expect("ready");
    touch.expect("ready");
    let (s0, t0) = (kernel_stat(spin.pid()), kernel_stat(touch.pid()));
    let (table, log, _) = record(
        &pins,
        &mut [&mut spin, &mut touch],
        "attached from pins",
        &[],
    );
    let (s1, t1) = (kernel_stat(spin.pid()), kernel_stat(touch.pid()));
    assert!(log.contains("attached from pins"), "{log}");
    let rows = table_rows(&table);
    let row = |pid: u32| {
        rows.iter()
            .find(|r| r.pid == pid)
            .unwrap_or_else(|| panic!("pid {pid} not in the table:\n{table}"))
    };
    let ticks = (s1.utime_ticks + s1.stime_ticks) - (s0.utime_ticks + s0.stime_ticks);
    let kernel_ns = ticks as f64 * 1e9 / clk_tck() as f64;
    assert!(
        kernel_ns >= SPIN_MS as f64 * 0.9e6,
        "the spinner ran only {kernel_ns} ns"
    );
    let oncpu_ns = row(spin.pid()).oncpu_ms.parse::<f64>().unwrap() * 1e6;
    assert_within_pct(
        "on-CPU ns from the AOSP loader's pins vs utime+stime",
        oncpu_ns,
        kernel_ns,
        10.0,
    );
    let minflt = (t1.minflt - t0.minflt) as f64;
    assert!(minflt >= PAGES as f64, "kernel minflt {minflt} < {PAGES}");
    assert_within_pct(
        "faults from the AOSP loader's pins vs minflt",
        row(touch.pid()).faults as f64,
        minflt,
        10.0,
    );
    eprintln!(
        "from the AOSP loader's pins: spinner {oncpu_ns:.0} ns on-CPU (utime+stime {kernel_ns:.0}), \
         page-toucher {} faults (minflt {minflt})",
        row(touch.pid()).faults
    );
    spin.finish();
    touch.finish();
}

/// Pinned capture maps outlive a recording: a thread still blocked when
/// one `--offcpu` capture ends must not come back, in the next capture
/// through the same pins, as a block that started before it (with stack
/// ids of the previous capture's stack map, which a capture clears at its
/// start). The workload's main thread blocks on its stdin after `done` in
/// the first capture and is woken (stdin closed) in the second.
#[test]
fn an_offcpu_capture_forgets_the_blocks_a_previous_one_left_in_the_pins() {
    let tp = vitals_tests::trace_processor::trace_processor();
    let fs = pin();
    let dir = tempfile::tempdir().unwrap();
    let mut w = Workload::spawn(&["block-release", "1", "20"]);
    let tids = w.read_numbers("tids");
    w.expect("ready");
    let pid = w.pid().to_string();
    let args = |out: &str| -> Vec<String> {
        let out = dir.path().join(out).to_str().unwrap().to_owned();
        [
            "--pins",
            fs.0.path().to_str().unwrap(),
            "--duration",
            "2s",
            "--top",
            "0",
            "--sched",
            "--offcpu-pid",
            &pid,
            "--out",
            &out,
        ]
        .map(str::to_owned)
        .to_vec()
    };
    let first = args("first.pftrace");
    let first: Vec<&str> = first.iter().map(String::as_str).collect();
    let rec = Recording::start(&first, "capture started");
    w.go();
    w.expect("done");
    rec.wait();
    let second = args("second.pftrace");
    let second: Vec<&str> = second.iter().map(String::as_str).collect();
    let rec = Recording::start(&second, "capture started");
    // Wakes the main thread, blocked since the first capture.
    w.finish();
    rec.wait();
    let rows = tp.query(
        &dir.path().join("second.pftrace"),
        // The capture's own first sched_switch: trace_bounds would start
        // at the stale block itself.
        "select s.ts, s.dur, t.tid, (select min(ts) from sched_slice) as start \
         from slice s join thread_track tt on s.track_id = tt.id join thread t using(utid) \
         where s.category = 'offcpu' and s.name like 'blocked %'",
    );
    eprintln!("blocks of the second capture: {rows:?} (waiter and releaser: {tids:?})");
    for r in &rows {
        let (ts, start) = (r["ts"].as_i64().unwrap(), r["start"].as_i64().unwrap());
        assert!(ts >= start, "a block from before the capture: {r:?}");
    }
}
