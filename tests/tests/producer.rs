//! `vitalsd run` as a producer of the real Perfetto service: traced,
//! traced_probes and the `perfetto` client from Perfetto's own build, a
//! session listing vitalsd's data source, and trace_processor reading the
//! result. References are independent of vitalsd: the kernel's
//! /proc/<pid>/stat read by this test, and traced_probes' process_stats.

use std::{
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex,
    },
    time::Duration,
};

use serde_json::Value;
use vitals_tests::{
    boottime_ns, clk_tck, daemon::Daemon, decode_trace, kernel_stat,
    trace_processor::trace_processor, traced::Traced, Workload,
};
use vitalsd::control::Request;

const DATA_SOURCE: &str = "linux.vitals";

/// A daemon that finds `traced` through the SDK's environment variables,
/// which it inherits from this process (tests here run one at a time).
fn daemon_for(traced: &Traced) -> Daemon {
    daemon_with(traced, "")
}

/// `daemon_for` with `sampling` lines in its config's `[sampling]`.
fn daemon_with(traced: &Traced, sampling: &str) -> Daemon {
    for (k, v) in traced.env() {
        std::env::set_var(k, v);
    }
    let d = Daemon::start_with(
        &vitals_tests::daemon::Tables {
            sampling,
            ..Default::default()
        },
        "",
        Vec::new(),
    );
    traced.wait_for_data_source(DATA_SOURCE, Duration::from_secs(20));
    d
}

/// Ends a spinner still spinning.
fn stop(mut w: Workload) {
    let _ = w.child.kill();
    let _ = w.child.wait();
}

fn producer_status(d: &Daemon) -> Value {
    d.call(&Request::Status {})["producer"].clone()
}

/// The status once the producer has seen `n` sessions stop: the client
/// returns when traced has the data, and the daemon publishes its counters
/// at its next tick.
fn after_stops(d: &Daemon, n: u64) -> Value {
    d.wait_status("the session's stop", Duration::from_secs(10), |s| {
        s["producer"]["sessions_stopped"] == n
    })
}

/// /proc/<pid>/stat utime+stime (ns) against CLOCK_BOOTTIME, read every
/// 20 ms on a thread of the test until stopped.
struct ProcSampler {
    stop: Arc<AtomicBool>,
    samples: Arc<Mutex<Vec<(u64, u64)>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl ProcSampler {
    fn start(pid: u32) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let samples = Arc::new(Mutex::new(Vec::new()));
        let (s, v) = (Arc::clone(&stop), Arc::clone(&samples));
        let ns_per_tick = 1_000_000_000 / clk_tck();
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                let k = kernel_stat(pid);
                let cpu_ns = (k.utime_ticks + k.stime_ticks) * ns_per_tick;
                v.lock().unwrap().push((boottime_ns(), cpu_ns));
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        Self {
            stop,
            samples,
            thread: Some(thread),
        }
    }

    fn finish(mut self) -> Vec<(u64, u64)> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.take().unwrap().join().unwrap();
        std::mem::take(&mut *self.samples.lock().unwrap())
    }
}

/// The sample nearest to `ts`, which must be within 50 ms of it.
fn at(samples: &[(u64, u64)], ts: u64) -> u64 {
    let &(t, v) = samples
        .iter()
        .min_by_key(|(t, _)| t.abs_diff(ts))
        .expect("no /proc samples");
    assert!(
        t.abs_diff(ts) < 50_000_000,
        "no /proc sample within 50 ms of {ts} (nearest {t})"
    );
    v
}

fn session_config(legacy_config: &str, duration_ms: u32) -> String {
    format!(
        r#"
buffers {{ size_kb: 16384 fill_policy: DISCARD }}
data_sources {{ config {{ name: "{DATA_SOURCE}" legacy_config: "{legacy_config}" }} }}
data_sources {{ config {{ name: "linux.process_stats" process_stats_config {{
    scan_all_processes_on_start: true proc_stats_poll_ms: 1000 record_process_runtime: true }} }} }}
duration_ms: {duration_ms}
"#
    )
}

/// vitalsd's counter `name` for `pid` in `trace`: (ts, value, upid) rows.
fn vitalsd_counter(trace: &std::path::Path, pid: u32, name: &str) -> Vec<(u64, f64, i64)> {
    let rows = trace_processor().query(
        trace,
        &format!(
            "SELECT c.ts AS ts, c.value AS value, t.upid AS upid FROM counter c \
             JOIN process_counter_track t ON c.track_id = t.id \
             JOIN process p USING (upid) \
             WHERE p.pid = {pid} AND t.name = '{name}' ORDER BY c.ts"
        ),
    );
    rows.iter()
        .map(|r| {
            (
                r["ts"].as_u64().unwrap(),
                r["value"].as_f64().unwrap(),
                r["upid"].as_i64().unwrap(),
            )
        })
        .collect()
}

/// The track names of one tier: on-CPU, then the other kinds.
struct TierTracks {
    oncpu: &'static str,
    others: [&'static str; 2],
}

#[test]
fn session_gets_vitalsd_counters_that_match_the_kernel_and_process_stats() {
    session_check(
        "",
        "ebpf",
        TierTracks {
            oncpu: "oncpu_ns",
            others: ["involuntary_switches", "runq_wait_ns"],
        },
    );
}

/// The data source in the CTS tier (no eBPF): the kernel's schedstat
/// counters, under their own names, the same checks.
#[test]
fn cts_tier_session_gets_schedstat_counters() {
    session_check(
        "accounting = \"proc\"",
        "cts",
        TierTracks {
            oncpu: "schedstat.oncpu_ns",
            others: ["status.involuntary_switches", "schedstat.runq_wait_ns"],
        },
    );
}

fn session_check(config: &str, tier: &str, tracks: TierTracks) {
    let traced = Traced::start(true);
    let d = daemon_with(&traced, config);
    assert_eq!(d.call(&Request::Status {})["tier"], tier);
    let mut spinner = Workload::spawn(&["spin", "9000"]);
    spinner.expect("ready");
    let pid = spinner.pid();
    let reference = ProcSampler::start(pid);

    let trace = traced.dir.path().join("session.pftrace");
    traced.record(&session_config("interval_ms=1000", 5000), &trace);
    let proc_samples = reference.finish();

    // On-CPU time: over the span of vitalsd's own values, within 10% of
    // what the kernel accounted in /proc/<pid>/stat over the same span.
    let oncpu = vitalsd_counter(&trace, pid, tracks.oncpu);
    assert!(
        oncpu.len() >= 4,
        "a 5 s session at 1 s intervals has at least 4 values: {oncpu:?}\n{}",
        d.log()
    );
    let (first, last) = (oncpu[0], oncpu[oncpu.len() - 1]);
    let ours = last.1 - first.1;
    let kernel = (at(&proc_samples, last.0) - at(&proc_samples, first.0)) as f64;
    assert!(kernel > 1e9, "the spinner ran: {kernel} ns");
    vitals_tests::assert_within_pct("on-CPU ns over the session", ours, kernel, 10.0);

    // The same processes: vitalsd's tracks and traced_probes' process_stats
    // tracks (runtime from /proc/<pid>/stat) resolve to one upid, which the
    // ProcessTree of process_stats names.
    let upids: Vec<i64> = oncpu.iter().map(|r| r.2).collect();
    let stats = vitalsd_counter(&trace, pid, "runtime.user_ns");
    assert!(
        !stats.is_empty(),
        "process_stats wrote the spinner's runtime"
    );
    assert!(
        upids
            .iter()
            .chain(stats.iter().map(|r| &r.2))
            .all(|u| *u == stats[0].2),
        "vitalsd upids {upids:?} vs process_stats upid {}",
        stats[0].2
    );
    let named = trace_processor().query(
        &trace,
        &format!(
            "SELECT name, cmdline FROM process WHERE upid = {}",
            stats[0].2
        ),
    );
    let cmdline = named[0]["cmdline"].as_str().unwrap_or_default();
    assert!(
        cmdline.contains("vitals-workload"),
        "process {pid} is named from its cmdline: {named:?}"
    );
    // Every counter kind made it, on the same process.
    for name in tracks.others {
        let v = vitalsd_counter(&trace, pid, name);
        assert!(!v.is_empty(), "{name} written");
        assert!(
            v.iter().all(|r| r.2 == stats[0].2),
            "{name} on the same upid"
        );
    }

    // Flush and async stop reached the producer; nothing dropped or refused.
    let st = after_stops(&d, 1)["producer"].clone();
    assert_eq!(st["sessions_started"], 1, "{st}");
    assert!(st["flushes"].as_u64().unwrap() >= 1, "{st}");
    assert_eq!(st["smb_drops"], 0, "{st}");
    assert_eq!(st["config_errors"], 0, "{st}");
    stop(spinner);
}

#[test]
fn the_sequence_follows_perfettos_incremental_state_rules() {
    let traced = Traced::start(false);
    let d = daemon_for(&traced);
    let mut spinner = Workload::spawn(&["spin", "9000"]);
    spinner.expect("ready");
    let pid = spinner.pid() as i64;
    // traced clears every sequence's incremental state each 1000 ms.
    let cfg = format!(
        "buffers {{ size_kb: 4096 }}\n\
         data_sources {{ config {{ name: \"{DATA_SOURCE}\" legacy_config: \"interval_ms=250\" }} }}\n\
         incremental_state_config {{ clear_period_ms: 1000 }}\n\
         duration_ms: 4500\n"
    );
    let trace = traced.dir.path().join("clears.pftrace");
    traced.record(&cfg, &trace);
    stop(spinner);

    // Decoded with the official schema: vitalsd's sequence is the one
    // carrying the spinner's process track.
    let t = decode_trace(&trace);
    let packets = t["packets"].as_array().unwrap();
    let spinner_tracks: Vec<u64> = t["track_descriptors"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|td| td["process"]["pid"].as_i64() == Some(pid))
        .map(|td| td["uuid"].as_u64().unwrap())
        .collect();
    let seq = packets
        .iter()
        .find(|p| {
            p["uuid"]
                .as_u64()
                .is_some_and(|u| spinner_tracks.contains(&u))
        })
        .map(|p| p["trusted_packet_sequence_id"].clone())
        .expect("vitalsd's process track in the trace");
    let ours: Vec<&Value> = packets
        .iter()
        .filter(|p| p["trusted_packet_sequence_id"] == seq)
        .collect();
    let flags = |p: &Value| p["sequence_flags"].as_u64().unwrap_or(0);
    assert_eq!(ours[0]["first_packet_on_sequence"], true, "{:?}", ours[0]);
    assert_eq!(flags(ours[0]) & 1, 1, "first packet clears: {:?}", ours[0]);
    // Each clear starts a generation that writes its descriptors again.
    let generations = ours.iter().filter(|p| flags(p) & 1 == 1).count();
    let descriptors = ours
        .iter()
        .filter(|p| p["kind"] == "track_descriptor")
        .filter(|p| {
            p["uuid"]
                .as_u64()
                .is_some_and(|u| spinner_tracks.contains(&u))
        })
        .count();
    assert!(
        generations >= 3,
        "a 4.5 s session with 1 s clears: {generations} generations\n{}",
        d.log()
    );
    assert!(
        descriptors >= generations,
        "the spinner's tracks described in every generation: {descriptors} for {generations}"
    );
    for p in ours.iter().filter(|p| p["kind"] == "track_event") {
        assert_eq!(flags(p) & 2, 2, "counters need incremental state: {p:?}");
    }
    // And trace_processor keeps the counters of every generation.
    let oncpu = vitalsd_counter(&trace, pid as u32, "oncpu_ns");
    assert!(oncpu.len() >= 12, "4.5 s at 250 ms: {oncpu:?}");
}

#[test]
fn counters_resume_after_traced_restarts_and_the_reconnect_is_counted() {
    let mut traced = Traced::start(false);
    let d = daemon_for(&traced);
    let mut spinner = Workload::spawn(&["spin", "20000"]);
    spinner.expect("ready");
    let pid = spinner.pid();
    let cfg = format!(
        "buffers {{ size_kb: 4096 }}\n\
         data_sources {{ config {{ name: \"{DATA_SOURCE}\" legacy_config: \"counters=oncpu\" }} }}\n\
         duration_ms: 2500\n"
    );

    let before = traced.dir.path().join("before.pftrace");
    traced.record(&cfg, &before);
    let a = vitalsd_counter(&before, pid, "oncpu_ns");
    assert!(a.len() >= 2, "counters before the restart: {a:?}");
    assert_eq!(producer_status(&d)["reconnects"], 0);

    traced.kill_traced();
    traced.start_traced();
    traced.wait_for_data_source(DATA_SOURCE, Duration::from_secs(30));
    let st = d.wait_status("the reconnect counted", Duration::from_secs(10), |s| {
        s["producer"]["reconnects"] == 1
    });
    assert_eq!(st["producer"]["disconnects"], 1, "{st}");

    let after = traced.dir.path().join("after.pftrace");
    traced.record(&cfg, &after);
    let b = vitalsd_counter(&after, pid, "oncpu_ns");
    assert!(
        b.len() >= 2,
        "counters after the restart: {b:?}\n{}",
        d.log()
    );
    // Cumulative since vitalsd started: the spinner kept running, so the
    // second session continues where the first left off.
    assert!(
        b[0].1 > a[a.len() - 1].1,
        "resumed values {b:?} continue {a:?}"
    );
    stop(spinner);
}

#[test]
fn a_bad_data_source_config_gets_no_data_and_a_clear_error() {
    let traced = Traced::start(false);
    let d = daemon_for(&traced);
    let trace = traced.dir.path().join("bad.pftrace");
    let cfg = format!(
        "buffers {{ size_kb: 1024 }}\n\
         data_sources {{ config {{ name: \"{DATA_SOURCE}\" legacy_config: \"interval_ms=5\" }} }}\n\
         duration_ms: 1500\n"
    );
    traced.record(&cfg, &trace);
    let tracks = trace_processor().query(
        &trace,
        "SELECT COUNT(*) AS n FROM process_counter_track WHERE name = 'oncpu_ns'",
    );
    assert_eq!(
        tracks[0]["n"], 0,
        "no data for a session we could not parse"
    );
    // The session was still set up, started and stopped cleanly.
    let st = after_stops(&d, 1);
    assert_eq!(st["producer"]["config_errors"], 1, "{st}");
    let err = st["producer_error"].as_str().unwrap_or_default();
    assert!(err.contains("interval_ms=5"), "error names the key: {err}");
}

#[test]
fn prelude_writes_the_history_from_before_the_session() {
    let traced = Traced::start(false);
    let d = daemon_for(&traced);
    // The history ring fills at the test daemon's 250 ms sampling.
    std::thread::sleep(Duration::from_secs(4));
    let before_session = boottime_ns();
    let trace = traced.dir.path().join("prelude.pftrace");
    let cfg = format!(
        "buffers {{ size_kb: 4096 }}\n\
         data_sources {{ config {{ name: \"{DATA_SOURCE}\" legacy_config: \"prelude_s=60\" }} }}\n\
         duration_ms: 2000\n"
    );
    traced.record(&cfg, &trace);
    let rows = trace_processor().query(
        &trace,
        "SELECT c.ts AS ts FROM counter c JOIN counter_track t ON c.track_id = t.id \
         WHERE t.name = 'history.cpu.local_busy_pct' ORDER BY c.ts",
    );
    let ts: Vec<u64> = rows.iter().map(|r| r["ts"].as_u64().unwrap()).collect();
    assert!(ts.len() >= 10, "4 s of 250 ms history: {ts:?}\n{}", d.log());
    let earlier = ts.iter().filter(|t| **t < before_session).count();
    assert!(
        earlier >= 10 && ts[0] + 3_000_000_000 < before_session,
        "the prelude reaches back before the session: {ts:?} vs start {before_session}"
    );
    after_stops(&d, 1);
}
