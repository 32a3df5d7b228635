//! The heapprofd session runner against `fake-perfetto`, a test double of
//! the perfetto command-line client. No root needed.

use std::{
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::Duration,
};

use prost::Message;
use vitals_tests::fake_perfetto_bin;
use vitalsd::heapprofd::{
    config::heapprofd_config, metadata_path, HeapProfileRequest, Issue, RateLimitError,
    RateLimiter, RateLimits, RunError, RunnerConfig, SessionReport, SessionRunner, SessionStatus,
    TargetStatus,
};
use vitalsd::perfetto::protos::{trace_packet::Data, Trace, TraceConfig};

/// The fake reads its mode from the environment it inherits; tests in this
/// file run in parallel threads of one process, so each runner gets its own
/// wrapper script that sets the mode and execs the fake.
fn client(dir: &Path, mode: &str, config_out: Option<&Path>) -> PathBuf {
    let script = dir.join(format!("perfetto-{mode}"));
    let extra = config_out
        .map(|p| format!("FAKE_PERFETTO_CONFIG_OUT='{}' ", p.display()))
        .unwrap_or_default();
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\nFAKE_PERFETTO_MODE={mode} {extra}exec '{}' \"$@\"\n",
            fake_perfetto_bin().display()
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    script
}

fn runner(dir: &Path, mode: &str, limits: RateLimits) -> SessionRunner {
    runner_with(dir, client(dir, mode, None), limits)
}

fn runner_with(dir: &Path, bin: PathBuf, limits: RateLimits) -> SessionRunner {
    let limiter = RateLimiter::load(dir.join("ratelimit.json"), limits).unwrap();
    SessionRunner::new(
        RunnerConfig {
            perfetto_bin: bin,
            // Short deadline and grace so hang tests finish quickly; no test
            // asserts on elapsed time.
            timeout_slack: Duration::from_secs(1),
            term_grace: Duration::from_millis(500),
            ..RunnerConfig::default()
        },
        limiter,
    )
}

fn request(name: &str) -> HeapProfileRequest {
    HeapProfileRequest {
        process_names: vec![name.into()],
        duration_ms: 50,
        flush_timeout_ms: 0,
        ..Default::default()
    }
}

/// One session of `target` against the fake client in `mode`, without rate
/// limits; returns the report and the trace path.
fn session(dir: &Path, mode: &str, target: &str) -> (SessionReport, PathBuf) {
    let out = dir.join("heap.pftrace");
    let report = runner(dir, mode, unlimited())
        .run(&request(target), &out, &AtomicBool::new(false))
        .unwrap();
    (report, out)
}

fn unlimited() -> RateLimits {
    RateLimits {
        system_per_hour: 100,
        system_per_day: 100,
        target_per_hour: 100,
        target_per_day: 100,
    }
}

#[test]
fn success_records_profile_and_metadata() {
    let dir = tempfile::tempdir().unwrap();
    let cfg_out = dir.path().join("stdin.pb");
    let r = runner_with(
        dir.path(),
        client(dir.path(), "success", Some(&cfg_out)),
        unlimited(),
    );
    let out = dir.path().join("heap.pftrace");
    let req = HeapProfileRequest {
        pids: vec![777],
        ..request("surfaceflinger")
    };
    let report = r.run(&req, &out, &AtomicBool::new(false)).unwrap();
    assert_eq!(report.status, SessionStatus::Completed);
    assert!(report.success(), "{report:#?}");

    // The client got exactly our config on stdin.
    let sent = TraceConfig::decode(std::fs::read(&cfg_out).unwrap().as_slice()).unwrap();
    assert_eq!(sent, req.trace_config(&Default::default()).unwrap());
    assert_eq!(
        heapprofd_config(&sent).unwrap().process_cmdline,
        vec!["surfaceflinger".to_string()]
    );

    let o = report.outcome.as_ref().unwrap();
    assert_eq!(o.processes.len(), 2);
    let sf = o.processes.iter().find(|p| p.pid == 4242).unwrap();
    assert_eq!(sf.name.as_deref(), Some("surfaceflinger"));
    // What was caught is allocations and bytes, summed over the dump's
    // callstacks as written in the trace.
    let written = written_totals(&out, 4242);
    assert_eq!(
        (sf.allocations, sf.allocated_bytes, sf.frees, sf.freed_bytes),
        written
    );
    assert!(sf.allocations > 0 && sf.allocated_bytes > sf.freed_bytes);
    assert_eq!((sf.dumps, sf.callstacks), (1, 2));
    assert!(sf.issues.is_empty());
    assert_eq!(
        o.targets[0].status,
        TargetStatus::Profiled { pids: vec![4242] }
    );
    assert_eq!(
        o.targets[1].status,
        TargetStatus::Profiled { pids: vec![777] }
    );

    // Outcome and config stored beside the capture.
    let meta: serde_json::Value =
        serde_json::from_slice(&std::fs::read(metadata_path(&out)).unwrap()).unwrap();
    assert_eq!(meta["status"]["kind"], "completed");
    assert_eq!(meta["request"]["process_names"][0], "surfaceflinger");
    assert_eq!(meta["outcome"]["processes"][0]["pid"], 777);
    let hex = meta["trace_config_hex"].as_str().unwrap();
    assert_eq!(hex.len(), 2 * std::fs::read(&cfg_out).unwrap().len());
}

/// (allocations, allocated bytes, frees, freed bytes) of `pid` as the
/// trace holds them: the fake writes one dump, so a plain sum.
fn written_totals(trace: &Path, pid: u64) -> (u64, u64, u64, u64) {
    let t = Trace::decode(std::fs::read(trace).unwrap().as_slice()).unwrap();
    let mut sum = (0, 0, 0, 0);
    for p in t.packet {
        if let Some(Data::ProfilePacket(pp)) = p.data {
            for d in pp.process_dumps.iter().filter(|d| d.pid() == pid) {
                for s in &d.samples {
                    sum.0 += s.alloc_count();
                    sum.1 += s.self_allocated();
                    sum.2 += s.free_count();
                    sum.3 += s.self_freed();
                }
            }
        }
    }
    sum
}

#[test]
fn buffer_overrun_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let (report, out) = session(dir.path(), "overrun", "system_server");
    assert_eq!(report.status, SessionStatus::Completed);
    let p = &report.outcome.as_ref().unwrap().processes[0];
    assert_eq!(p.issues, vec![Issue::BufferOverran]);
    assert!(!p.usable());
    assert!(!report.success());
    let meta: serde_json::Value =
        serde_json::from_slice(&std::fs::read(metadata_path(&out)).unwrap()).unwrap();
    assert_eq!(
        meta["outcome"]["processes"][0]["issues"][0],
        "buffer_overran"
    );
}

#[test]
fn no_profile_gives_likely_causes() {
    let dir = tempfile::tempdir().unwrap();
    let (report, _) = session(dir.path(), "no-profile", "surfaceflinger");
    assert_eq!(report.status, SessionStatus::Completed);
    let o = report.outcome.unwrap();
    assert!(o.processes.is_empty());
    let TargetStatus::NoProfile { likely_causes } = &o.targets[0].status else {
        panic!("{o:?}")
    };
    // The fake's ProcessTree lists the process, so: running, not profiled.
    assert!(
        likely_causes[0].contains("not profileable"),
        "{likely_causes:?}"
    );
}

/// The real client, told traced is not there, exits 1 with this message:
/// a clear status, and nothing stored (no trace, no sidecar of nothing).
#[test]
fn unreachable_traced_is_a_clear_error_and_stores_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (report, out) = session(dir.path(), "exit1", "surfaceflinger");
    match &report.status {
        SessionStatus::TracedUnreachable { stderr_tail } => {
            assert!(stderr_tail.contains("Could not connect to the traced socket"))
        }
        other => panic!("expected traced unreachable, got {other:?}"),
    }
    let problem = report.status.problem().unwrap();
    assert!(problem.contains("traced is not running"), "{problem}");
    assert!(report.outcome.is_none());
    assert!(!report.success());
    assert!(!out.exists());
    assert!(!metadata_path(&out).exists());
}

/// traced refusing the session is exit 0 without a trace from the real
/// client (seen with a unique_session_name in use): not "completed".
#[test]
fn refused_session_is_not_completed_and_stores_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (report, out) = session(dir.path(), "refused", "surfaceflinger");
    match &report.status {
        SessionStatus::Refused { reason } => {
            assert!(reason.contains("vitalsd_heapprofd"), "{reason}");
            assert!(!reason.contains("perfetto_cmd.cc"), "{reason}");
        }
        other => panic!("expected refused, got {other:?}"),
    }
    assert!(report.outcome.is_none());
    assert!(!report.success());
    assert!(!out.exists());
    assert!(!metadata_path(&out).exists());
}

#[test]
fn hang_past_timeout_gets_sigterm_and_flushes() {
    let dir = tempfile::tempdir().unwrap();
    let (report, _) = session(dir.path(), "hang", "surfaceflinger");
    assert_eq!(report.status, SessionStatus::TimedOut { killed: false });
    // The client flushed on SIGTERM, so the profile is there.
    assert!(report.outcome.unwrap().all_targets_profiled());
}

#[test]
fn client_ignoring_sigterm_is_killed() {
    let dir = tempfile::tempdir().unwrap();
    let (report, _) = session(dir.path(), "hang-hard", "surfaceflinger");
    assert_eq!(report.status, SessionStatus::TimedOut { killed: true });
    assert!(report.outcome.is_none());
}

#[test]
fn cancel_stops_session_and_one_at_a_time() {
    let dir = tempfile::tempdir().unwrap();
    let r = Arc::new(runner(dir.path(), "hang", unlimited()));
    let cancel = Arc::new(AtomicBool::new(false));
    let out = dir.path().join("heap.pftrace");
    let long = HeapProfileRequest {
        duration_ms: 600_000,
        ..request("surfaceflinger")
    };
    let t = {
        let (r, cancel, out, long) = (r.clone(), cancel.clone(), out.clone(), long.clone());
        std::thread::spawn(move || r.run(&long, &out, &cancel))
    };
    while !r.is_busy() {
        std::thread::yield_now();
    }
    let second = r.run(
        &request("other"),
        &dir.path().join("b.pftrace"),
        &AtomicBool::new(false),
    );
    assert!(matches!(second, Err(RunError::Busy)), "{second:?}");
    cancel.store(true, Ordering::SeqCst);
    let report = t.join().unwrap().unwrap();
    assert_eq!(report.status, SessionStatus::Cancelled { killed: false });
    assert!(!r.is_busy());
}

#[test]
fn invalid_request_never_spawns() {
    let dir = tempfile::tempdir().unwrap();
    let cfg_out = dir.path().join("stdin.pb");
    let r = runner_with(
        dir.path(),
        client(dir.path(), "success", Some(&cfg_out)),
        unlimited(),
    );
    let err = r
        .run(
            &request("surface*"),
            &dir.path().join("x.pftrace"),
            &AtomicBool::new(false),
        )
        .unwrap_err();
    assert!(matches!(err, RunError::Config(_)), "{err:?}");
    assert!(!cfg_out.exists());
}

#[test]
fn rate_limit_holds_across_restart() {
    let dir = tempfile::tempdir().unwrap();
    let limits = RateLimits::default(); // 2 per hour per target
    let out = dir.path().join("heap.pftrace");
    {
        let r = runner(dir.path(), "success", limits);
        for _ in 0..2 {
            r.run(&request("surfaceflinger"), &out, &AtomicBool::new(false))
                .unwrap();
        }
    }
    // A new runner (daemon restart) reads the persisted history.
    let r = runner(dir.path(), "success", limits);
    match r.run(&request("surfaceflinger"), &out, &AtomicBool::new(false)) {
        Err(RunError::RateLimited(RateLimitError::Target { target, used, .. })) => {
            assert_eq!(target, "name:surfaceflinger");
            assert_eq!(used, 2);
        }
        other => panic!("expected a per-target limit, got {other:?}"),
    }
    // Another target still runs.
    r.run(&request("system_server"), &out, &AtomicBool::new(false))
        .unwrap();
}
