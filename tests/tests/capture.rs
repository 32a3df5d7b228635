//! Capture mode end to end (`vitalsd record --sched --faults`): the trace
//! decoded with the official Perfetto schema, CompactSched delta-decoded
//! per bundle as trace_processor does.

use std::{
    collections::{HashMap, HashSet},
    path::Path,
};

use serde_json::Value;
use vitals_tests::*;

/// `vitalsd record --interval 500ms --top 0 --out TRACE ARGS`, returning
/// once the capture is running.
fn start(trace: &Path, args: &[&str]) -> Recording {
    let trace = trace.to_str().unwrap();
    let mut all = vec!["--interval", "500ms", "--top", "0", "--out", trace];
    all.extend_from_slice(args);
    Recording::start(&all, "capture started")
}

/// (cpu, switch) in file order, each with the prev pid implied by the
/// previous switch on that CPU (None for the first one seen).
fn switches(t: &Value) -> Vec<(u64, Option<i64>, Value)> {
    let mut last_next: HashMap<u64, i64> = HashMap::new();
    let mut out = Vec::new();
    for b in t["compact_sched"].as_array().unwrap() {
        let cpu = b["cpu"].as_u64().unwrap();
        for s in b["switches"].as_array().unwrap() {
            let prev = last_next.get(&cpu).copied();
            last_next.insert(cpu, s["next_pid"].as_i64().unwrap());
            out.push((cpu, prev, s.clone()));
        }
    }
    out
}

/// VOL_SW + INVOL_SW of `pid` in vitalsd's top table.
fn kernel_switches(table: &str, pid: i64) -> u64 {
    let row: Vec<&str> = table
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|f| f.first().and_then(|p| p.parse::<i64>().ok()) == Some(pid))
        .unwrap_or_else(|| panic!("no row for {pid} in\n{table}"));
    // PID PROCESS ONCPU_MS CORE_EQ% VOL_SW INVOL_SW ...
    row[4].parse::<u64>().unwrap() + row[5].parse::<u64>().unwrap()
}

/// `--capture-transport` values and the name vitalsd reports for each.
const RINGBUF: (&str, &str) = ("ringbuf", "ringbuf");
const PERF_ARRAY: (&str, &str) = ("perf", "perf_event_array");

#[test]
fn pipe_ping_pong_gives_every_switch_sleeping_prev_state_and_monotonic_cpus() {
    ping_pong_switches(RINGBUF);
}

/// The perf event array fallback delivers the same records.
#[test]
fn perf_array_ping_pong_gives_every_switch_and_monotonic_cpus() {
    ping_pong_switches(PERF_ARRAY);
}

fn ping_pong_switches((transport, reported): (&str, &str)) {
    const N: u64 = 3000;
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("t.pftrace");
    // Stopped with SIGINT once the ping-pong is done, not after a fixed
    // wall time the ping-pong might overrun on a slow machine (a QEMU TCG
    // guest of `cargo xtask vm-test`).
    let rec = start(
        &trace,
        &[
            "--duration",
            "600s",
            "--sched",
            "--capture-transport",
            transport,
        ],
    );
    let (mut w, tids) = Workload::spawn_ping_pong(N);
    let tids: HashSet<i64> = tids.into_iter().collect();
    w.go();
    w.expect("done");
    let pid = w.pid() as i64;
    unsafe { libc::kill(rec.child.id() as i32, libc::SIGINT) };
    let table = rec.wait();
    w.finish();
    assert!(table.contains("capture: "), "{table}");
    assert!(table.contains(&format!("transport {reported} ")), "{table}");

    let t = decode_trace_with(&trace, &["--capture"]);
    // trace_processor picks the prev_state encoding from this.
    let uname = nix::sys::utsname::uname().unwrap();
    assert_eq!(
        t["system_info"]["utsname"]["release"],
        uname.release().to_str().unwrap()
    );
    assert!(t["ftrace_event_bundles"].as_u64().unwrap() > 0);

    let sw = switches(&t);
    let ins = sw
        .iter()
        .filter(|(_, _, s)| tids.contains(&s["next_pid"].as_i64().unwrap()))
        .count() as u64;
    // Every switch the always-on counters saw is in the trace: the
    // workload's threads (the two and the main one) left a CPU as often in
    // the trace as its VOL_SW + INVOL_SW say. The first switch of each CPU
    // has no known prev, hence the slack.
    let mut threads = tids.clone();
    threads.insert(pid);
    let traced_outs = sw
        .iter()
        .filter(|(_, prev, _)| prev.is_some_and(|p| threads.contains(&p)))
        .count() as u64;
    let counted = kernel_switches(&table, pid);
    let ncpus = std::thread::available_parallelism().unwrap().get() as u64;
    eprintln!(
        "{transport}: {traced_outs} switch-outs traced, {counted} counted, {ins} switches in"
    );
    assert!(
        traced_outs + ncpus + 2 >= counted,
        "{traced_outs} switch-outs of {threads:?} traced, {counted} counted by the kernel\n{table}"
    );
    // The workload pins both threads to one CPU, so every round switches
    // twice, over either transport.
    let want = 2 * N;
    assert!(
        ins >= want,
        "{ins} switches into {tids:?}, want >= {want}\n{table}"
    );

    // Delta-decoded timestamps never go backwards on a CPU, across bundles.
    let mut last: HashMap<u64, u64> = HashMap::new();
    for (cpu, _, s) in &sw {
        let ts = s["ts"].as_u64().unwrap();
        let prev = last.insert(*cpu, ts).unwrap_or(0);
        assert!(ts >= prev, "cpu {cpu}: {ts} after {prev}");
    }
    let mut last: HashMap<u64, u64> = HashMap::new();
    for b in t["compact_sched"].as_array().unwrap() {
        let cpu = b["cpu"].as_u64().unwrap();
        for wk in b["wakings"].as_array().unwrap() {
            let ts = wk["ts"].as_u64().unwrap();
            let prev = last.insert(cpu, ts).unwrap_or(0);
            assert!(ts >= prev, "cpu {cpu} waking: {ts} after {prev}");
        }
    }

    // A thread blocked in read() leaves the CPU as TASK_INTERRUPTIBLE:
    // prev_state 1, which trace_processor shows as "S" (sleeping).
    let outs: Vec<i64> = sw
        .iter()
        .filter(|(_, prev, _)| prev.is_some_and(|p| tids.contains(&p)))
        .map(|(_, _, s)| s["prev_state"].as_i64().unwrap())
        .collect();
    let sleeping = outs.iter().filter(|&&s| s == 1).count() as u64;
    assert!(
        sleeping >= N,
        "{sleeping} of {} switch-outs of {tids:?} were S (prev_state 1); states {:?}",
        outs.len(),
        outs.iter().collect::<HashSet<_>>()
    );

    // Both threads were woken, and are named under their process.
    let woken = t["compact_sched"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|b| b["wakings"].as_array().unwrap().iter())
        .filter(|wk| tids.contains(&wk["pid"].as_i64().unwrap()))
        .count() as u64;
    assert!(woken >= N, "{woken} sched_waking for {tids:?}");
    for tid in &tids {
        let th = t["process_tree"]["threads"]
            .as_array()
            .unwrap()
            .iter()
            .find(|th| th["tid"].as_i64() == Some(*tid))
            .unwrap_or_else(|| panic!("no thread name for {tid}"));
        assert_eq!(th["tgid"].as_i64(), Some(pid));
        assert_eq!(th["name"], "vitals-workload");
    }
}

#[test]
fn sampled_fault_stacks_name_the_faulting_function() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("t.pftrace");
    let rec = start(
        &trace,
        &["--duration", "3s", "--faults", "--fault-period", "4"],
    );
    let mut w = Workload::spawn(&["touch", "4000"]);
    w.expect("ready");
    w.go();
    w.expect("done");
    let pid = w.pid() as u64;
    // Keep the workload alive until the recorder has symbolised.
    let table = rec.wait();
    w.finish();
    assert!(table.contains("fault samples"), "{table}");

    let t = decode_trace_with(&trace, &["--capture"]);
    // --faults alone writes no sched events.
    assert_eq!(t["ftrace_event_bundles"].as_u64(), Some(0));
    let mine: Vec<&Value> = t["samples"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["pid"].as_u64() == Some(pid))
        .collect();
    // 4000 faults at 1 in 4: about 1000 samples.
    assert!(mine.len() >= 500, "{} samples for {pid}", mine.len());
    let named = mine
        .iter()
        .filter(|s| {
            s["frames"]
                .as_array()
                .unwrap()
                .iter()
                .any(|f| f.as_str().is_some_and(|n| n.contains("vitals_touch_pages")))
        })
        .count();
    assert!(
        named * 2 >= mine.len(),
        "only {named} of {} samples show vitals_touch_pages; first: {}",
        mine.len(),
        mine[0]
    );
    let wl = workload_bin();
    assert!(
        mine.iter().any(|s| s["mappings"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m.as_str() == wl.to_str())),
        "no frame maps to {}",
        wl.display()
    );
}

/// The FIFO trick: a process runs from a file it then unlinks, and puts
/// FIFOs where its maps line and the file's old name point. Opening either
/// path for symbols would block the capture for good; the capture must
/// finish, its frames must say why they have no name, and the next capture
/// must run.
#[test]
fn a_fifo_in_place_of_a_mapped_file_neither_blocks_nor_fools_the_capture() {
    let dir = tempfile::tempdir().unwrap();
    let exe = dir.path().join("w");
    std::fs::copy(workload_bin(), &exe).unwrap();
    let mut w = Workload::spawn_exe(&exe, &["touch", "4000"]);
    w.expect("ready");
    std::fs::remove_file(&exe).unwrap();
    let deleted = dir.path().join("w (deleted)");
    for fifo in [&exe, &deleted] {
        nix::unistd::mkfifo(fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    }
    let trace = dir.path().join("t.pftrace");
    let rec = start(
        &trace,
        &["--duration", "3s", "--faults", "--fault-period", "4"],
    );
    w.go();
    w.expect("done");
    let pid = w.pid() as u64;
    // A blocked symboliser would hang here; the recording lasts 3 s.
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    let rec_pid = rec.child.id();
    std::thread::spawn(move || done_tx.send(rec.wait()));
    let table = done_rx
        .recv_timeout(std::time::Duration::from_secs(120))
        .unwrap_or_else(|_| {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(rec_pid as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
            panic!("the capture hung on the FIFO")
        });
    w.finish();
    assert!(table.contains("fault samples"), "{table}");
    let t = decode_trace_with(&trace, &["--capture"]);
    let frames: Vec<String> = t["samples"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["pid"].as_u64() == Some(pid))
        .flat_map(|s| s["frames"].as_array().unwrap().clone())
        .filter_map(|f| f.as_str().map(str::to_owned))
        .collect();
    assert!(!frames.is_empty(), "no samples of the workload");
    assert!(
        frames
            .iter()
            .any(|f| f.starts_with("[unsymbolised: ") && f.contains("regular file")),
        "frames in the FIFO'd file must say why they have no name: {frames:?}"
    );
    // And the next capture runs.
    let again = dir.path().join("again.pftrace");
    start(&again, &["--duration", "1s", "--faults"]).wait();
    decode_trace_with(&again, &["--capture"]);
}

#[test]
fn a_tiny_ring_buffer_loses_events_and_the_trace_says_so() {
    tiny_buffer_loses_events(RINGBUF);
}

/// One page per CPU of perf buffer: bpf_perf_event_output fails, the
/// kernel-side counter and the perf buffers' lost reports both see it.
#[test]
fn a_tiny_perf_array_loses_events_and_the_trace_says_so() {
    let table = tiny_buffer_loses_events(PERF_ARRAY);
    let reported: u64 = table
        .split("reported lost by perf buffers")
        .next()
        .and_then(|r| r.rsplit('(').next())
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no perf loss report in:\n{table}"));
    assert!(reported > 0, "{table}");
}

/// Returns vitalsd's output.
fn tiny_buffer_loses_events((transport, reported): (&str, &str)) -> String {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("t.pftrace");
    let rec = start(
        &trace,
        &[
            "--duration",
            "3s",
            "--sched",
            "--capture-buffer-kb",
            "4",
            "--capture-transport",
            transport,
        ],
    );
    let (mut w, _tids) = Workload::spawn_ping_pong(20000);
    w.go();
    w.expect("done");
    let table = rec.wait();
    w.finish();
    let lost: u64 = table
        .split("ring buffer lost: ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no loss figure in:\n{table}"));
    assert!(lost > 0, "{table}");
    let t = decode_trace_with(&trace, &["--capture"]);
    assert!(
        t["compact_sched"]
            .as_array()
            .unwrap()
            .iter()
            .any(|b| b["lost_events"] == true),
        "no bundle has lost_events"
    );
    let track = t["track_descriptors"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["name"] == "capture_ringbuf_lost_events")
        .expect("loss counter track");
    assert!(
        track["description"]
            .as_str()
            .is_some_and(|d| d.ends_with(&format!("transport: {reported}"))),
        "{track}"
    );
    let series = t["counters"][track["uuid"].to_string()].as_array().unwrap();
    assert_eq!(series.last().unwrap()[1].as_u64(), Some(lost));
    table
}

/// The classic-tracepoint programs (what bpfloader attaches), in both
/// layouts, capture the same records as the default tp_btf ones.
#[test]
fn classic_tracepoint_programs_capture_switches_and_wakings() {
    use vitalsd::bpf::{
        AccountingConfig, EventSizing, EventTransport, SchedPrograms, TracepointLayout,
    };
    for portable in [false, true] {
        let (programs, layout, transport) = lib_capture(AccountingConfig {
            force_classic_tracepoints: true,
            force_portable_layout: portable,
            capture: Some(EventSizing::default()),
            ..AccountingConfig::default()
        });
        assert_eq!(programs, SchedPrograms::Classic);
        assert_eq!(layout == TracepointLayout::Portable, portable);
        assert_eq!(transport, EventTransport::RingBuf);
    }
}

/// As on a kernel without BPF_MAP_TYPE_RINGBUF: the object loads with
/// CAPTURE_EVENTS rewritten to an array (the verifier never reaches the
/// ringbuf calls) and auto picks the perf array, for the tp_btf programs
/// and both classic layouts.
#[test]
fn without_ringbuf_the_object_loads_and_captures_through_the_perf_array() {
    use vitalsd::bpf::{
        AccountingConfig, EventSizing, EventTransport, SchedPrograms, TracepointLayout,
    };
    for (classic, portable) in [(false, false), (true, false), (true, true)] {
        let (programs, layout, transport) = lib_capture(AccountingConfig {
            force_classic_tracepoints: classic,
            force_portable_layout: portable,
            assume_no_ringbuf: true,
            capture: Some(EventSizing::default()),
            ..AccountingConfig::default()
        });
        assert_eq!(programs == SchedPrograms::Classic, classic);
        assert_eq!(layout == TracepointLayout::Portable, portable);
        assert_eq!(transport, EventTransport::PerfArray);
    }
}

/// Loads with `cfg`, captures a 500-round ping-pong and checks the counts;
/// with off-CPU on for every thread and no threshold, each of the
/// ping-pong's blocks is a long block, so every program layout and
/// transport is seen to record them too: at least one a round (the thread
/// a wakeup preempts leaves runnable and never blocks that round).
fn lib_capture(
    cfg: vitalsd::bpf::AccountingConfig,
) -> (
    vitalsd::bpf::SchedPrograms,
    vitalsd::bpf::TracepointLayout,
    vitalsd::bpf::EventTransport,
) {
    use vitalsd::{
        bpf::Accounting,
        event_set::EventSet,
        events::{EventOptions, EventRecorder, OffcpuWatch, WatchedProcesses},
        perfetto::TraceWriter,
    };
    require_root();
    let mut acc = Accounting::load(&cfg).unwrap();
    let opts = EventOptions {
        events: EventSet {
            sched: true,
            faults: false,
        },
        offcpu: Some(OffcpuWatch {
            min_block_ns: 0,
            processes: WatchedProcesses::All,
            follow_names: Vec::new(),
        }),
        ..EventOptions::default()
    };
    let cap = EventRecorder::start(&mut acc, &opts, Path::new("/proc")).unwrap();
    let (mut w, _tids) = Workload::spawn_ping_pong(500);
    w.go();
    w.expect("done");
    w.finish();
    let mut writer = TraceWriter::new(Vec::new());
    let stats = cap.stop(&mut acc, &mut writer, 1).unwrap();
    assert!(stats.switch_events >= 1000, "{stats:?}");
    assert!(stats.waking_events >= 500, "{stats:?}");
    assert_eq!(stats.lost_sched, 0, "{stats:?}");
    assert!(stats.fault.offcpu_blocks >= 500, "{stats:?}");
    assert_eq!(stats.lost_offcpu, 0, "{stats:?}");
    assert_eq!(stats.transport, Some(acc.capture_transport()));
    (acc.sched_programs(), acc.layout(), acc.capture_transport())
}
