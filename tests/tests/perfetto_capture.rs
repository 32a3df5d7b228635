//! Captures through Perfetto's own data sources (issue #21, part 2): a
//! daemon without eBPF (`sampling.accounting = "proc"`) records a capture
//! as a session of the real traced and traced_probes, through both consumer
//! routes, and trace_processor judges the result against the kernel: the
//! ping-pong's slices and thread states against its threads' switch counts
//! in /proc, short-lived processes named, no import error. The failures
//! (traced not running, a session traced refuses, no eBPF for an eBPF
//! capture) store nothing and make `vitalsctl capture` fail with the
//! reason; a capture that fills its byte cap is kept, marked cut, within it.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Duration,
};

use serde_json::Value;
use vitals_tests::{
    daemon::{Daemon, Tables},
    perfetto_service::{Group, PerfettoService, Route},
    trace_processor::{trace_processor, Row, TraceProcessor, IMPORT_ERRORS_SQL},
    *,
};
use vitalsd::{
    control::Request,
    perfetto_capture::config::UNIQUE_SESSION_NAME,
    store::{EntryMeta, EntryStatus},
};

// The checks trace_processor.rs runs on eBPF captures, shared as files.
#[allow(dead_code)]
#[path = "trace_processor/model.rs"]
mod model;
#[allow(dead_code)]
#[path = "trace_processor/timeline.rs"]
mod timeline;

use model::*;
use timeline::*;

const PROC_ONLY: Tables = Tables {
    sampling: "accounting = \"proc\"",
    store: "",
};

/// Starts a manual capture on the control socket; its id.
fn start_recording(d: &Daemon, duration_s: f64, sched: bool, faults: bool) -> String {
    let v = d.call(&Request::Capture {
        duration_s,
        sched,
        faults,
        offcpu: None,
    });
    v["id"]
        .as_str()
        .unwrap_or_else(|| panic!("no capture id: {v}"))
        .to_owned()
}

/// Waits until capture `id` ended; its stored metadata (None: not stored,
/// with the outcome the daemon recorded).
fn wait_capture(d: &Daemon, id: &str) -> Result<Value, String> {
    let st = d.wait_status("the capture to end", Duration::from_secs(60), |st| {
        st["capture"]["id"] != id
    });
    match d.list().into_iter().find(|m| m["id"] == id) {
        Some(m) => Ok(m),
        None => Err(st["recent_triggers"].to_string()),
    }
}

/// The capture's trace as `vitalsctl export` gives it.
fn export(d: &Daemon, id: &str, dir: &Path) -> PathBuf {
    let out = dir.join(format!("{id}.pftrace"));
    let o = d.vitalsctl(&["export", id, out.to_str().unwrap()]);
    assert!(
        o.status.success(),
        "vitalsctl export: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    out
}

/// traced lists the session, and its data sources had time to start (they
/// start asynchronously once traced accepted the session; ftrace needs the
/// kernel's buffers set up).
fn wait_session_running(service: &PerfettoService) {
    service.wait_for_session(UNIQUE_SESSION_NAME);
    wait_ftrace_recording();
}

/// Until the kernel records sched_switch for the session: traced lists a
/// session as started before traced_probes has enabled its ftrace events
/// (a workload started in between lost its first switch once), so this
/// reads the kernel's own state: the event enabled and tracing on in the
/// tracefs traced_probes uses (/sys/kernel/tracing before debugfs's).
fn wait_ftrace_recording() {
    let root = ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"]
        .into_iter()
        .map(std::path::Path::new)
        .find(|p| p.join("tracing_on").exists())
        .expect("tracefs is mounted (traced_probes needs it)");
    let on = |rel: &str| std::fs::read_to_string(root.join(rel)).is_ok_and(|v| v.trim() == "1");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !(on("events/sched/sched_switch/enable") && on("tracing_on")) {
        assert!(
            std::time::Instant::now() < deadline,
            "traced_probes never enabled sched/sched_switch in {}",
            root.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // Its per-CPU readers start with the events; a moment for them.
    std::thread::sleep(Duration::from_millis(300));
}

fn notes(meta: &Value) -> Vec<String> {
    meta["backend"]["notes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|n| n.as_str().map(str::to_owned))
        .collect()
}

/// A proc-only daemon's `--sched` capture through `route`: the ping-pong's
/// slices and thread states as the kernel counted them, the short-lived
/// children named, no import error, and the metadata naming the backend,
/// the route and fault counters only.
fn sched_capture_without_ebpf(route: Route) {
    const N: u64 = 2000;
    const CHILDREN: usize = 20;
    let tp = trace_processor();
    let service = PerfettoService::start();
    let d = Daemon::start_with(
        &PROC_ONLY,
        &route.config(&service.perfetto_bin()),
        service.env(),
    );
    let st = d.call(&Request::Status {});
    assert_eq!(st["capture_backend"], "perfetto", "{st}");

    let id = start_recording(&d, 8.0, true, true);
    wait_session_running(&service);
    // The session writes where the perfetto domain may write on Android
    // (the store's heapprofd/), not into the store itself.
    let session_file = d.store().join("heapprofd").join(format!("{id}.pftrace"));
    assert!(
        session_file.exists(),
        "{} while the session runs",
        session_file.display()
    );
    // Started within the capture: the threads' every switch, from their
    // first, is in it, as in the kernel's counts.
    let (mut pp, tids) = Workload::spawn_ping_pong(N);
    let mut kids = Workload::spawn(&["children", &CHILDREN.to_string(), "5"]);
    kids.expect("ready");
    pp.go();
    let ping_pong = finish_ping_pong(&mut pp, tids);
    kids.go();
    let pids = kids.read_children();
    assert_eq!(pids.len(), CHILDREN);
    let st = d.call(&Request::Status {});
    assert_eq!(
        st["capture"]["id"],
        id.as_str(),
        "the workloads outlasted the capture: {st}"
    );
    assert_eq!(st["capture"]["backend"], "perfetto", "{st}");
    let meta = wait_capture(&d, &id).unwrap_or_else(|why| panic!("not stored: {why}"));
    pp.finish();
    kids.finish();
    eprintln!("stored: {meta}");
    assert_eq!(meta["status"], "complete", "{meta}");
    assert!(!session_file.exists(), "moved into the store");
    assert_eq!(meta["backend"]["name"], "perfetto", "{meta}");
    let notes = notes(&meta);
    assert!(
        notes.contains(&format!("consumer: {}", route.name())),
        "{notes:?}"
    );
    assert!(
        notes.iter().any(|n| n.starts_with("faults: counters only")),
        "{notes:?}"
    );

    let dir = tempfile::tempdir().unwrap();
    let trace = export(&d, &id, dir.path());
    let t = Imported::new(&tp, &trace);
    assert_import_errors(&t, "perfetto capture", &[]);
    // ftrace is the kernel's own record of every switch. trace_processor
    // still skips, and counts, a compact switch whose previous task it
    // cannot know (the first on each CPU of the stream): a switch of the
    // workload started right after ftrace may be that one, which the
    // importer declares like the eBPF captures' switch_missed.
    let skipped = t.q(
        "select coalesce(sum(value), 0) as n from stats where name = 'compact_sched_switch_skipped'",
    );
    let skipped = skipped[0]["n"].as_i64().unwrap_or(0);
    eprintln!("compact switches trace_processor skipped: {skipped}");
    // Every stat the import counted (drops, skips, overruns), for a
    // failure to explain itself.
    let stats = t.q("select name, idx, severity, value from stats where value > 0");
    eprintln!("trace_processor's non-zero stats: {stats:?}");
    check_ping_pong(&t, &ping_pong, N, skipped);

    let list: Vec<String> = pids.iter().map(|p| p.to_string()).collect();
    let procs = t.q(&format!(
        "select p.pid as pid, p.name as name, t.name as thread from process p \
         left join thread t on t.upid = p.upid and t.tid = p.pid where p.pid in ({})",
        list.join(", ")
    ));
    let unnamed: Vec<String> = pids
        .iter()
        .filter(|&&pid| {
            !procs.iter().any(|p| {
                int(p, "pid") == pid as i64
                    && text(p, "name").is_some_and(|n| n.ends_with("vitals-workload"))
                    && text(p, "thread") == Some("vitals-workload")
            })
        })
        .map(|p| p.to_string())
        .collect();
    assert!(
        unnamed.is_empty(),
        "of {CHILDREN} short-lived children, {unnamed:?} are not named in the process \
         table: {procs:?}"
    );
}
per_route!(sched_capture_without_ebpf);

/// vitalsd's own counters (linux.vitals, `oncpu_ns` per process) are in
/// the capture's trace beside traced_probes' data.
/// `oncpu_track`: the tier's on-CPU track name (`oncpu_ns` from eBPF,
/// `schedstat.oncpu_ns` in the CTS tier).
fn check_vitals_counters_in_capture(d: &Daemon, service: &PerfettoService, oncpu_track: &str) {
    let tp = trace_processor();
    service.wait_for_data_source("linux.vitals");
    let mut spinner = Workload::spawn(&["spin", "6000"]);
    spinner.expect("ready");
    let id = start_recording(d, 4.0, false, false);
    let meta = wait_capture(d, &id).unwrap_or_else(|why| panic!("not stored: {why}"));
    let _ = spinner.child.kill();
    let _ = spinner.child.wait();
    assert_eq!(meta["backend"]["name"], "perfetto", "{meta}");
    let dir = tempfile::tempdir().unwrap();
    let trace = export(d, &id, dir.path());
    let r = tp.query(
        &trace,
        &format!(
            "select count(*) as n from counter c join process_counter_track t \
             on c.track_id = t.id join process p using (upid) \
             where p.pid = {} and t.name = '{oncpu_track}'",
            spinner.pid()
        ),
    );
    assert!(
        int(&r[0], "n") >= 2,
        "vitalsd's {oncpu_track} of the spinner is in the capture: {r:?}\n{}",
        d.log()
    );
}

/// With eBPF accounting (the producer runs) and `capture.backend =
/// "perfetto"`: vitalsd's counters are in the capture.
#[test]
fn vitals_counters_are_in_a_perfetto_capture_with_ebpf() {
    let service = PerfettoService::start();
    let d = Daemon::start_with(
        &Tables::default(),
        &format!(
            "{}[capture]\nbackend = \"perfetto\"\n",
            Route::PerfettoClient.config(&service.perfetto_bin())
        ),
        service.env(),
    );
    check_vitals_counters_in_capture(&d, &service, "oncpu_ns");
}

/// The same without eBPF (the CTS tier; auto backend: perfetto):
/// linux.vitals carries the schedstat counters.
#[test]
fn vitals_counters_are_in_a_perfetto_capture_without_ebpf() {
    let service = PerfettoService::start();
    let d = Daemon::start_with(
        &PROC_ONLY,
        &Route::PerfettoClient.config(&service.perfetto_bin()),
        service.env(),
    );
    check_vitals_counters_in_capture(&d, &service, "schedstat.oncpu_ns");
}

/// `vitalsctl capture --sched` that must fail: non-zero exit, `reason` in
/// what it printed, nothing stored.
fn assert_capture_fails(d: &Daemon, reason: &str) {
    let out = d.vitalsctl(&["capture", "--sched", "--duration", "2s"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    eprintln!("vitalsctl capture: {}\n{stdout}{stderr}", out.status);
    assert!(
        !out.status.success(),
        "vitalsctl capture exited 0: {stdout}{stderr}\n{}",
        d.log()
    );
    assert!(
        stderr.contains(reason),
        "the reason ({reason}) is not in: {stderr}"
    );
    assert!(d.list().is_empty(), "nothing stored: {:?}", d.list());
    let files: Vec<_> = std::fs::read_dir(d.store())
        .unwrap()
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
        .map(|e| e.file_name())
        .filter(|n| n != "index.json" && !n.to_string_lossy().starts_with('.'))
        .collect();
    assert!(files.is_empty(), "files left in the store: {files:?}");
}

/// traced is not running: the capture fails with that reason.
fn capture_fails_when_traced_is_not_running(route: Route) {
    let dir = tempfile::tempdir().unwrap();
    let envs = vec![
        (
            "PERFETTO_PRODUCER_SOCK_NAME",
            dir.path().join("producer.sock"),
        ),
        (
            "PERFETTO_CONSUMER_SOCK_NAME",
            dir.path().join("consumer.sock"),
        ),
    ];
    let perfetto = vitals_tests::perfetto_service::perfetto_dir().join("perfetto");
    let d = Daemon::start_with(&PROC_ONLY, &route.config(&perfetto), envs);
    assert_capture_fails(&d, "traced is not running");
}
per_route!(capture_fails_when_traced_is_not_running);

/// traced refuses the session (its unique_session_name is taken by
/// another session): the capture fails with traced's refusal.
fn capture_fails_when_traced_refuses_the_session(route: Route) {
    let service = PerfettoService::start();
    let cfg = service.dir.path().join("taken.pbtxt");
    std::fs::write(
        &cfg,
        format!(
            "buffers {{ size_kb: 1024 }}\n\
             data_sources {{ config {{ name: \"linux.sys_stats\" }} }}\n\
             duration_ms: 60000\nunique_session_name: \"{UNIQUE_SESSION_NAME}\"\n"
        ),
    )
    .unwrap();
    let _taken = Group::spawn(
        Command::new(service.perfetto_bin())
            .args(["--txt", "-c"])
            .arg(&cfg)
            .args(["-o"])
            .arg(service.dir.path().join("taken.pftrace"))
            .envs(service.env())
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
    );
    service.wait_for_session(UNIQUE_SESSION_NAME);
    let d = Daemon::start_with(
        &PROC_ONLY,
        &route.config(&service.perfetto_bin()),
        service.env(),
    );
    assert_capture_fails(&d, "traced refused the session");
}
per_route!(capture_fails_when_traced_refuses_the_session);

/// `capture.backend = "ebpf"` on a daemon without eBPF: the capture fails
/// (it needs eBPF), nothing stored, and vitalsctl says so with a non-zero
/// exit; it used to store a 0-byte capture and exit 0.
#[test]
fn an_ebpf_capture_without_ebpf_fails_and_stores_nothing() {
    let d = Daemon::start_with(&PROC_ONLY, "[capture]\nbackend = \"ebpf\"\n", Vec::new());
    let st = d.call(&Request::Status {});
    assert_eq!(st["capture_backend"], "ebpf", "{st}");
    assert_capture_fails(&d, "a capture needs eBPF");
}

/// A capture that fills store.max_capture_bytes is kept, marked cut, and
/// within the cap; traced's own stats (read by trace_processor) say it
/// discarded what did not fit.
#[test]
fn a_capture_reaching_the_byte_cap_is_kept_cut_and_within_it() {
    // Large enough that traced keeps whole packets of every data source
    // (at the 64 KiB minimum, a bundle fragmented across a discarded chunk
    // may leave no data at all), small enough for the ping-pong to fill.
    const CAP: u64 = 256 << 10;
    let tp = trace_processor();
    let service = PerfettoService::start();
    let store = format!("max_capture_bytes = {CAP}");
    let d = Daemon::start_with(
        &Tables {
            store: &store,
            ..PROC_ONLY
        },
        &Route::PerfettoClient.config(&service.perfetto_bin()),
        service.env(),
    );
    let id = start_recording(&d, 5.0, true, false);
    wait_session_running(&service);
    let (mut pp, tids) = Workload::spawn_ping_pong(50_000);
    pp.go();
    let _ = finish_ping_pong(&mut pp, tids);
    let meta = wait_capture(&d, &id).unwrap_or_else(|why| panic!("not stored: {why}"));
    pp.finish();
    eprintln!("stored: {meta}");
    let bytes = meta["trace_bytes"].as_u64().unwrap();
    assert!(
        bytes > 0 && bytes <= CAP,
        "{bytes} bytes, cap {CAP}: {meta}"
    );
    let stored: EntryMeta = serde_json::from_value(meta.clone()).unwrap();
    assert!(
        matches!(stored.status, EntryStatus::CutAtLimit { .. }),
        "{meta}"
    );
    let dir = tempfile::tempdir().unwrap();
    let trace = export(&d, &id, dir.path());
    let r = tp.query(
        &trace,
        "select coalesce(sum(value), 0) as n from stats where name = 'traced_buf_chunks_discarded'",
    );
    assert!(int(&r[0], "n") > 0, "traced discarded chunks: {r:?}");
}

/// traced runs but no data source does (no traced_probes, no producer):
/// the session's trace holds only traced's own packets, so the capture
/// fails as empty and nothing is stored.
#[test]
fn a_trace_with_no_data_fails_and_stores_nothing() {
    let traced = vitals_tests::traced::Traced::start(false);
    let perfetto = vitals_tests::perfetto_service::perfetto_dir().join("perfetto");
    let d = Daemon::start_with(
        &PROC_ONLY,
        &format!(
            "{}[producer]\nenabled = false\n",
            Route::PerfettoClient.config(&perfetto)
        ),
        traced.env().to_vec(),
    );
    assert_capture_fails(&d, "the trace holds no data from any data source");
}

/// A rule with `heap_profile` on a daemon without eBPF: heapprofd joins
/// the capture's own Perfetto session, so one stored capture holds the CPU
/// timeline and the offender's heap profile, with heapprofd's outcome in
/// its metadata; no separate heapprofd session runs.
fn a_rule_heap_profile_joins_the_capture_session(route: Route) {
    const TARGET: &str = "vitals-churn";
    let tp = trace_processor();
    let service = PerfettoService::start();
    let target = vitals_tests::perfetto_service::HeapTarget::start(&service, TARGET);
    // The churn takes ~20 % of a CPU; above 5 % for 1 s fires.
    let config = format!(
        "{}[[rule]]\nname = \"churn\"\n\
         metric = {{ kind = \"process_cpu_pct\", process = \"{TARGET}\" }}\n\
         threshold = 5\nwindow = \"1s\"\ncooldown = \"1h\"\n\
         capture = {{ duration = \"4s\", sched = true, heap_profile = true, \
         heap_allowlist = [\"{TARGET}\"] }}\n",
        route.config(&service.perfetto_bin())
    );
    let d = Daemon::start_with(&PROC_ONLY, &config, service.env());
    let st = d.wait_status("the capture", Duration::from_secs(90), |st| {
        assert!(
            st["heap_session"].is_null(),
            "a separate heapprofd session: {st}"
        );
        st["store"]["captures"] == 1 && st["capture"].is_null()
    });
    eprintln!("status: {}", st["recent_triggers"]);
    let list = d.list();
    assert_eq!(list.len(), 1, "one capture: {list:?}");
    let m = &list[0];
    assert_eq!(m["trigger"]["rule"], "churn", "{m}");
    assert_eq!(m["status"], "complete", "{m}");
    assert_eq!(m["backend"]["name"], "perfetto", "{m}");
    let h = &m["heapprofd"];
    assert_eq!(h["request"]["pids"][0], target.pid(), "{h}");
    let p = &h["outcome"]["processes"][0];
    assert_eq!(p["pid"], target.pid(), "{h}");
    assert!(p["allocations"].as_u64() > Some(0), "{h}");
    let dir = tempfile::tempdir().unwrap();
    let id = m["id"].as_str().unwrap();
    let trace = export(&d, id, dir.path());
    let r = tp.query(
        &trace,
        &format!(
            "select (select count(*) from heap_profile_allocation a join process p \
             using (upid) where p.pid = {pid}) as allocations, \
             (select count(*) from sched_slice) as slices",
            pid = target.pid()
        ),
    );
    assert!(
        int(&r[0], "allocations") > 0,
        "heap profile in the trace: {r:?}"
    );
    assert!(int(&r[0], "slices") > 0, "CPU timeline in the trace: {r:?}");
}
per_route!(a_rule_heap_profile_joins_the_capture_session);

/// `capture.prelude = "ring"`: the rule's ring session runs before it
/// fires; when it fires, a trigger stops it and the capture holds what
/// happened before: short-lived children that had exited before the
/// capture was even created are named in it.
fn a_ring_prelude_holds_what_ran_before_the_rule_fired(route: Route) {
    let tp = trace_processor();
    let service = PerfettoService::start();
    let config = format!(
        "{}[[rule]]\nname = \"spin\"\n\
         metric = {{ kind = \"process_cpu_pct\", process = \"vitals-workload\" }}\n\
         threshold = 50\nwindow = \"1s\"\ncooldown = \"1h\"\n\
         capture = {{ duration = \"2s\", sched = true, prelude = \"ring\" }}\n",
        route.config(&service.perfetto_bin())
    );
    let mut d = Daemon::start_with(&PROC_ONLY, &config, service.env());
    service.wait_for_session("vitalsd_ring_spin");
    std::thread::sleep(Duration::from_millis(1500));
    let mut kids = Workload::spawn(&["children", "5", "5"]);
    kids.expect("ready");
    kids.go();
    let pids = kids.read_children();
    kids.finish();
    let children_done_ms = vitalsd::store::now_unix_ms();
    assert!(d.list().is_empty(), "no capture yet");
    let mut spinner = Workload::spawn(&["spin", "6000"]);
    spinner.expect("ready");
    d.wait_status("the ring's capture", Duration::from_secs(60), |st| {
        st["store"]["captures"] == 1 && st["capture"].is_null()
    });
    let _ = spinner.child.kill();
    let _ = spinner.child.wait();
    let list = d.list();
    let m = &list[0];
    eprintln!("stored: {m}");
    assert_eq!(m["trigger"]["rule"], "spin", "{m}");
    assert_eq!(m["status"], "complete", "{m}");
    assert_eq!(m["backend"]["name"], "perfetto", "{m}");
    assert!(
        m["created_unix_ms"].as_u64().unwrap() >= children_done_ms,
        "the capture began after the children ended: {m}"
    );
    let dir = tempfile::tempdir().unwrap();
    let trace = export(&d, m["id"].as_str().unwrap(), dir.path());
    let list: Vec<String> = pids.iter().map(|p| p.to_string()).collect();
    let named = tp.query(
        &trace,
        &format!(
            "select count(distinct p.pid) as n from process p join thread t \
             on t.upid = p.upid and t.tid = p.pid where p.pid in ({}) \
             and t.name = 'vitals-workload'",
            list.join(", ")
        ),
    );
    assert_eq!(
        int(&named[0], "n"),
        pids.len() as i64,
        "the children that ended before the fire are in the prelude: {named:?}"
    );
    // And the ring is kept: a new one runs after the capture.
    service.wait_for_session("vitalsd_ring_spin");
    // SIGTERM with a ring running: the daemon stops it and exits 0,
    // leaving no session file and no capture of it.
    d.stop();
    let left: Vec<_> = std::fs::read_dir(d.store().join("heapprofd"))
        .unwrap()
        .filter_map(Result::ok)
        .map(|e| e.file_name())
        .collect();
    assert!(left.is_empty(), "session files left: {left:?}");
    assert_eq!(
        std::fs::read_dir(d.store())
            .unwrap()
            .filter_map(Result::ok)
            .filter(|e| e.file_name().to_string_lossy().ends_with(".pftrace"))
            .count(),
        1,
        "only the rule's capture is stored"
    );
}
per_route!(a_ring_prelude_holds_what_ran_before_the_rule_fired);
