//! `vitalsd run` and `record` with BPF denied: started as root but with
//! CAP_BPF, CAP_PERFMON and CAP_SYS_ADMIN dropped from the bounding set
//! (so an exec'd root process does not get them back, as in a container
//! without them), they keep running without eBPF in the CTS tier (the
//! kernel's schedstat/status per task), say so once in the log, in status
//! and in the trace, and the trace has the /proc and schedstat counters
//! and no eBPF ones. Root; `cargo xtask test` runs them one at a time.

use std::{
    fs::File,
    io::{BufRead, BufReader},
    os::unix::process::CommandExt,
    path::Path,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use vitals_tests::{daemon::Daemon, trace_processor::trace_processor, *};

/// The capabilities BPF needs (capability.h numbers): CAP_SYS_ADMIN,
/// CAP_PERFMON, CAP_BPF.
const BPF_CAPS: [libc::c_ulong; 3] = [21, 38, 39];

/// `vitalsd ARGS` without [`BPF_CAPS`], in a process group of its own.
fn without_bpf(args: &[&str]) -> Command {
    require_root();
    let mut cmd = Command::new(vitalsd_bin());
    cmd.args(args).env("RUST_LOG", "info").process_group(0);
    // Safety: prctl only, between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            for cap in BPF_CAPS {
                if libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    cmd
}

/// Kills a child's process group, and reaps it, if the test ends first.
struct Group(Option<Child>);

impl Drop for Group {
    fn drop(&mut self) {
        if let Some(c) = self.0.as_mut() {
            if let Ok(None) = c.try_wait() {
                unsafe { libc::kill(-(c.id() as i32), libc::SIGKILL) };
                let _ = c.wait();
            }
        }
    }
}

/// Kills process group `.0` on drop unless disarmed (once its leader is
/// reaped, the id may be reused).
struct KillGroup(i32, bool);

impl Drop for KillGroup {
    fn drop(&mut self) {
        if self.1 {
            unsafe { libc::kill(-self.0, libc::SIGKILL) };
        }
    }
}

/// Asserts, from /proc/<pid>/status, that `pid` has none of [`BPF_CAPS`]
/// in its permitted (so neither effective) set: the test really denies
/// BPF. (It may have dropped others since; vitalsd drops to what it needs.)
fn assert_no_bpf_caps(pid: u32) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let set = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .map(|h| u64::from_str_radix(h.trim(), 16).unwrap())
            .unwrap_or_else(|| panic!("no {name} in /proc/{pid}/status"))
    };
    let prm = set("CapPrm:");
    for cap in BPF_CAPS {
        assert_eq!(prm & (1 << cap), 0, "capability {cap} permitted: {prm:#x}");
    }
}

/// The daemon's one line about the denial: it names the syscall and errno
/// the kernel gave (EPERM: kernel.unprivileged_bpf_disabled is set here,
/// checked) and the /proc-only mode.
fn assert_one_denial_line(log: &str) {
    assert_ne!(
        std::fs::read_to_string("/proc/sys/kernel/unprivileged_bpf_disabled")
            .unwrap()
            .trim(),
        "0",
        "unprivileged BPF is allowed here: bpf(2) would not be refused"
    );
    let lines: Vec<&str> = log.lines().filter(|l| l.contains("BPF denied")).collect();
    assert_eq!(lines.len(), 1, "one denial line expected:\n{log}");
    for part in ["bpf(BPF_MAP_CREATE): EPERM", "CAP_BPF", "/proc-only"] {
        assert!(lines[0].contains(part), "{part:?} not in {:?}", lines[0]);
    }
}

#[test]
fn run_without_bpf_capabilities_is_proc_only() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("vitalsd.toml");
    std::fs::write(&config, daemon::config(dir.path(), "")).unwrap();
    let log = dir.path().join("log");
    let child = without_bpf(&["run", "--config", config.to_str().unwrap()])
        .stderr(File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let pid = child.id();
    // The harness's Daemon for the socket calls (it kills and reaps the
    // daemon on drop); dropped first, the guard kills the daemon's group.
    let mut d = Daemon {
        child: Some(child),
        dir,
        envs: Vec::new(),
    };
    let mut group = KillGroup(pid as i32, true);
    let deadline = Instant::now() + Duration::from_secs(30);
    while vitalsd::control::Client::connect(&d.socket()).is_err() {
        assert!(Instant::now() < deadline, "no socket: {}", d.log());
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_no_bpf_caps(pid);
    let mut w = Workload::spawn(&["spin", "3000"]);
    w.expect("ready");
    let st = d.wait_status("samples with the spinner", Duration::from_secs(10), |st| {
        st["samples"].as_u64() >= Some(4)
            && st["top"].as_array().is_some_and(|t| {
                t.iter()
                    .any(|r| r["pid"] == w.pid() && r["ebpf"]["oncpu_ms"].as_f64() > Some(0.0))
            })
    });
    let mode = st["accounting"].as_str().unwrap();
    assert!(
        mode.starts_with("proc-only (bpf denied: bpf(BPF_MAP_CREATE): EPERM"),
        "{mode}"
    );
    assert_eq!(st["tier"], "cts", "{st}");
    // No eBPF drop counters at all, rather than zeros.
    assert_eq!(st["bpf_drops"], serde_json::json!({}), "{st}");
    assert!(
        st["sched_procfs"]["schedstat_reads"].as_u64() > Some(0),
        "{st}"
    );
    // The Perfetto producer runs in this tier too (its data source has
    // the schedstat counters): it is never "not started".
    if let Some(e) = st["producer_error"].as_str() {
        assert!(!e.starts_with("not started"), "{e}");
    }
    let row = st["top"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["pid"] == w.pid())
        .unwrap()
        .clone();
    assert!(row["core_equivalent_pct"].as_f64().unwrap() > 0.0, "{row}");
    // The spinner never blocks: a window of it is nearly all on-CPU time,
    // from its schedstat (the row's `ebpf` object carries either tier).
    let oncpu_ms = row["ebpf"]["oncpu_ms"].as_f64().unwrap();
    assert!(oncpu_ms > 0.0, "{row}");
    let text = d.vitalsctl(&["status"]);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains(&format!("accounting: {mode}"))
            && text.contains("tier: cts")
            && text.contains("faults from /proc/<pid>/stat minflt + majflt"),
        "vitalsctl status:\n{text}"
    );
    w.expect("done");
    w.finish();
    d.stop();
    group.1 = false;
    assert_one_denial_line(&d.log());
}

/// The first and last `mem.rss` values (bytes) the trace has for `pid`:
/// ProcessStats from /proc/<pid>/status, written every sample.
fn trace_rss(trace: &Path, pid: u32) -> (f64, f64) {
    let rows = trace_processor().query(
        trace,
        &format!(
            "select (select c.value from counter c where c.track_id = t.id order by c.ts limit 1) as first, \
                    (select c.value from counter c where c.track_id = t.id order by c.ts desc limit 1) as last \
             from process_counter_track t join process p using(upid) \
             where p.pid = {pid} and t.name = 'mem.rss'"
        ),
    );
    assert_eq!(rows.len(), 1, "mem.rss tracks of {pid}: {rows:?}");
    let v = |k: &str| rows[0][k].as_f64().unwrap();
    (v("first"), v("last"))
}

/// /proc/<pid>/status VmRSS in bytes, by the procfs crate.
fn kernel_rss(pid: u32) -> f64 {
    let st = procfs::process::Process::new(pid as i32)
        .unwrap()
        .status()
        .unwrap();
    st.vmrss.expect("VmRSS") as f64 * 1024.0
}

#[test]
fn record_without_bpf_capabilities_writes_proc_counters_and_declares_the_mode() {
    const PAGES: u64 = 3000;
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("t.pftrace");
    let mut w = Workload::spawn(&["touch", &PAGES.to_string()]);
    w.expect("ready");
    // Idle from here until `go` once blocked on its stdin (after "ready"
    // it may still fault, setting up its read): the recording's first scan
    // sees these, so the reference RSS and stat are read only then (read
    // before, CI once saw the trace one page above it).
    wait_blocked(w.pid());
    let rss_before = kernel_rss(w.pid());
    let k0 = kernel_stat(w.pid());
    let mut child = without_bpf(&[
        "record",
        "--top",
        "0",
        "--duration",
        "3s",
        "--interval",
        "250ms",
        "--out",
        trace.to_str().unwrap(),
    ])
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let stdout = child.stdout.take().unwrap();
    let guard = Group(Some(child));
    let mut log = String::new();
    while !log.contains("BPF denied") {
        assert!(
            err.read_line(&mut log).unwrap() > 0,
            "record exited:\n{log}"
        );
    }
    assert_no_bpf_caps(guard.0.as_ref().unwrap().id());
    // After the first tick: the recorder flushes the trace's header, then
    // each tick's packets, so a second size is the first tick's samples.
    let size = || std::fs::metadata(&trace).map_or(0, |m| m.len());
    let deadline = Instant::now() + Duration::from_secs(30);
    while size() == 0 {
        assert!(Instant::now() < deadline, "no trace header:\n{log}");
        std::thread::sleep(Duration::from_millis(10));
    }
    let header = size();
    while size() == header {
        assert!(Instant::now() < deadline, "no first tick:\n{log}");
        std::thread::sleep(Duration::from_millis(10));
    }
    w.go();
    w.expect("done");
    // Blocked again (waiting for EOF): no fault after this read either.
    wait_blocked(w.pid());
    let rss_after = kernel_rss(w.pid());
    let k1 = kernel_stat(w.pid());
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut err, &mut rest).unwrap();
    log.push_str(&rest);
    let mut printed = String::new();
    std::io::Read::read_to_string(&mut BufReader::new(stdout), &mut printed).unwrap();
    let mut child = guard;
    let status = child.0.as_mut().unwrap().wait().unwrap();
    assert!(status.success(), "record failed: {status}\n{log}");
    assert_one_denial_line(&log);
    assert!(
        printed.contains("accounting: proc-only (bpf denied: bpf(BPF_MAP_CREATE): EPERM"),
        "{printed}"
    );
    assert!(
        !printed.contains("map drops"),
        "eBPF drops printed: {printed}"
    );

    let tp = trace_processor();
    let note = tp.query(
        &trace,
        "select name from slice where name like 'accounting:%'",
    );
    assert_eq!(note.len(), 1, "{note:?}");
    let note = note[0]["name"].as_str().unwrap();
    assert!(
        note.starts_with("accounting: proc-only (bpf denied: "),
        "{note}"
    );
    assert!(note.contains("tier cts: per-task on-CPU ns"), "{note}");
    assert!(note.contains("unavailable: eBPF fault counts"), "{note}");
    assert!(
        printed.contains("tier: cts") && printed.contains("schedstat source: "),
        "{printed}"
    );
    // The summary is about the recording: schedstat and stat count from a
    // process's start, so its figures less what it had at the first scan.
    // The workload faulted only between `go` and `done`, as the kernel's
    // own stat says.
    let row = table_rows(&printed)
        .into_iter()
        .find(|r| r.pid == w.pid())
        .unwrap_or_else(|| panic!("no row for the workload: {printed}"));
    assert_eq!(
        row.faults,
        (k1.minflt + k1.majflt) - (k0.minflt + k0.majflt),
        "the workload's faults during the recording: {printed}"
    );
    assert!(row.faults >= PAGES, "{row:?}");
    // The workload's on-CPU time, from its schedstat, in the trace.
    let oncpu = tp.query(
        &trace,
        &format!(
            "select max(c.value) as v from counter c join process_counter_track t \
             on c.track_id = t.id join process p using(upid) \
             where p.pid = {} and t.name = 'schedstat.oncpu_ns'",
            w.pid()
        ),
    );
    assert!(oncpu[0]["v"].as_f64() > Some(0.0), "{oncpu:?}");
    let ebpf = tp.query(
        &trace,
        "select count(*) as n from counter_track where name in \
         ('oncpu_ns', 'runq_wait_ns', 'voluntary_switches', 'involuntary_switches') \
         or name like 'faults_%' or name like 'drops.bpf.%'",
    );
    assert_eq!(ebpf[0]["n"], 0, "eBPF tracks in a proc-only trace");
    let load = tp.query(
        &trace,
        "select count(*) as n from counter c join counter_track t on c.track_id = t.id \
         where t.name = 'loadavg.1m'",
    );
    assert!(load[0]["n"].as_u64().unwrap() >= 4, "{load:?}");
    // The workload's memory, from /proc, against the kernel's own figure:
    // it touched PAGES pages during the recording, then stayed idle.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as f64;
    let (first, last) = trace_rss(&trace, w.pid());
    eprintln!("rss in the trace {first}..{last}, /proc {rss_before}..{rss_after}");
    assert_eq!(first, rss_before, "rss before the touch");
    assert_eq!(last, rss_after, "rss after the touch");
    assert!(last - first >= PAGES as f64 * page, "{first}..{last}");
    w.finish();
}
