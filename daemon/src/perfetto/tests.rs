//! Writer tests. The interop tests decode our output with the official
//! Perfetto schema (tests/python/trace_summary.py, PyPI `perfetto`), so a
//! field-number or framing mistake fails here rather than in the UI.

use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{json, Value};

use super::*;
use crate::clock::ClockPair;
use crate::system::Utsname;

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("daemon/ has a parent")
        .to_owned()
}

/// The venv Python with the `perfetto` package. Missing is a failure, not a
/// skip: these tests are the only check that real Perfetto parses our files.
fn python() -> PathBuf {
    if let Some(p) = std::env::var_os("VITALS_PYTHON") {
        let p = PathBuf::from(p);
        assert!(
            p.exists(),
            "VITALS_PYTHON={} does not exist; run `cargo xtask setup` (creates .venv with the perfetto package) or fix VITALS_PYTHON",
            p.display()
        );
        return p;
    }
    let p = workspace_root().join(".venv/bin/python");
    assert!(
        p.exists(),
        "{} not found and VITALS_PYTHON unset: run `cargo xtask setup` to create the venv with the `perfetto` Python package",
        p.display()
    );
    p
}

/// Runs trace_summary.py on `path`: Ok(summary JSON) or Err(stderr).
fn summarize(path: &Path) -> Result<Value, String> {
    let script = workspace_root().join("tests/python/trace_summary.py");
    let out = Command::new(python())
        .arg(&script)
        .arg(path)
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", script.display()));
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    Ok(serde_json::from_slice(&out.stdout).expect("trace_summary.py prints JSON"))
}

fn summarize_bytes(bytes: &[u8]) -> Result<Value, String> {
    let mut f = tempfile::NamedTempFile::new().unwrap();
    f.write_all(bytes).unwrap();
    f.flush().unwrap();
    summarize(f.path())
}

const SEC: u64 = 1_000_000_000;

fn facts() -> SystemFacts {
    SystemFacts {
        utsname: Utsname {
            sysname: "Linux".into(),
            release: "6.1.0-test".into(),
            version: "#1 SMP PREEMPT".into(),
            machine: "aarch64".into(),
        },
        hz: 100,
        page_size_bytes: 16384,
        num_cpus: 8,
        system_ram_bytes: Some(8 << 30),
    }
}

const PROC_A: ProcessKey = ProcessKey {
    pid: 100,
    starttime_ticks: 5000,
};
const PROC_B: ProcessKey = ProcessKey {
    pid: 200,
    starttime_ticks: 6000,
};

fn faults_spec() -> CounterSpec {
    CounterSpec::new("faults.minor", CounterUnit::Count)
}

fn share_spec() -> CounterSpec {
    CounterSpec::new("cpu.share", CounterUnit::Custom("%".into()))
        .with_description("share of one CPU")
}

struct Written {
    /// (process, spec name) -> uuid, in creation order.
    tracks: Vec<(ProcessKey, &'static str, TrackUuid)>,
    global: TrackUuid,
    packets: u64,
    bytes: u64,
}

/// The small trace of the brief: clock snapshot, system info, process tree,
/// 2 processes x 2 counter tracks x 3 values (+ one global counter), cpu
/// stats, psi, process stats.
fn write_sample<W: Write>(w: &mut TraceWriter<W>) -> Written {
    write_sample_header(w);
    let (tracks, global) = write_sample_counters(w);
    write_sample_stats(w);
    Written {
        tracks,
        global,
        packets: w.packets_written(),
        bytes: w.bytes_written(),
    }
}

/// Clock snapshot, system info and the process tree of two processes.
fn write_sample_header<W: Write>(w: &mut TraceWriter<W>) {
    w.write_clock_snapshot(ClockPair {
        boottime_ns: SEC,
        monotonic_ns: SEC - 250,
    })
    .unwrap();
    w.write_system_info(&facts()).unwrap();
    w.write_process_tree(
        SEC,
        &[
            ProcessTreeEntry {
                pid: 100,
                ppid: 1,
                cmdline: vec!["/system/bin/foo".into(), "--bar".into()],
                cmdline_is_comm: false,
                uid: Some(1000),
                threads: vec![(100, "foo".into()), (101, "worker".into())],
            },
            ProcessTreeEntry {
                pid: 200,
                ppid: 2,
                cmdline: vec!["kworker/0:1".into()],
                cmdline_is_comm: true,
                uid: None,
                threads: vec![],
            },
        ],
    )
    .unwrap();
}

/// Two counter tracks per process with three values each, then one global
/// counter; returns the tracks in creation order and the global one.
fn write_sample_counters<W: Write>(
    w: &mut TraceWriter<W>,
) -> (Vec<(ProcessKey, &'static str, TrackUuid)>, TrackUuid) {
    let mut tracks = Vec::new();
    for (i, ts) in [2 * SEC, 3 * SEC, 4 * SEC].into_iter().enumerate() {
        let i = i as i64;
        for (proc, name) in [(PROC_A, "foo"), (PROC_B, "kworker/0:1")] {
            let faults = w.process_counter_track(proc, name, &faults_spec()).unwrap();
            let share = w.process_counter_track(proc, name, &share_spec()).unwrap();
            if i == 0 {
                tracks.push((proc, "faults.minor", faults));
                tracks.push((proc, "cpu.share", share));
            }
            w.write_counter(ts, faults, CounterValue::Int(proc.pid as i64 * 10 + i))
                .unwrap();
            w.write_counter(ts, share, CounterValue::Double(0.5 + i as f64))
                .unwrap();
        }
    }
    let global = w
        .global_counter_track(&CounterSpec::new(
            "loadavg.1m",
            CounterUnit::Custom("load".into()),
        ))
        .unwrap();
    w.write_counter(4 * SEC, global, CounterValue::Double(1.25))
        .unwrap();
    (tracks, global)
}

/// cpu_stat, psi and process stats at 4 s.
fn write_sample_stats<W: Write>(w: &mut TraceWriter<W>) {
    w.write_cpu_stats(
        4 * SEC,
        &[
            CpuTimesNs {
                cpu_id: 0,
                user_ns: 11,
                user_nice_ns: 12,
                system_mode_ns: 13,
                idle_ns: 14,
                io_wait_ns: 15,
                irq_ns: 16,
                softirq_ns: 17,
                steal_ns: 18,
            },
            CpuTimesNs {
                cpu_id: 1,
                user_ns: 21,
                ..Default::default()
            },
        ],
    )
    .unwrap();
    w.write_psi(
        4 * SEC,
        &[
            (PsiResource::CpuSome, 1),
            (PsiResource::CpuFull, 2),
            (PsiResource::IoSome, 3),
            (PsiResource::IoFull, 4),
            (PsiResource::MemorySome, 5),
            (PsiResource::MemoryFull, 6),
        ],
    )
    .unwrap();
    w.write_process_stats(
        4 * SEC,
        &[
            ProcessStatsEntry {
                pid: 100,
                vm_size_kb: Some(1000),
                vm_rss_kb: Some(500),
                rss_anon_kb: Some(300),
                rss_file_kb: Some(150),
                rss_shmem_kb: Some(50),
                vm_swap_kb: Some(7),
                runtime_user_mode_ns: Some(3 * SEC),
                runtime_kernel_mode_ns: Some(SEC),
            },
            ProcessStatsEntry {
                pid: 200,
                vm_rss_kb: Some(0),
                ..Default::default()
            },
        ],
    )
    .unwrap();
}

fn index_of(packets: &[Value], pred: impl Fn(&Value) -> bool) -> Option<usize> {
    packets.iter().position(pred)
}

#[test]
fn perfetto_sample_trace_decodes_with_official_schema() {
    let file = tempfile::NamedTempFile::new().unwrap();
    let mut w = TraceWriter::new(BufWriter::new(file.reopen().unwrap()));
    let written = write_sample(&mut w);
    w.flush().unwrap();
    drop(w.into_inner());
    assert_eq!(
        std::fs::metadata(file.path()).unwrap().len(),
        written.bytes,
        "bytes_written matches the file size"
    );

    let s = summarize(file.path())
        .unwrap_or_else(|e| panic!("official schema rejected the trace: {e}"));
    let packets = s["packets"].as_array().unwrap();
    // 3 (clock, sysinfo, tree) + 2 process + 4 counter + 1 global descriptors
    // + 13 counter values + cpu, psi, process stats.
    assert_eq!(s["packet_count"], json!(written.packets));
    assert_eq!(written.packets, 3 + 2 + 4 + 1 + 13 + 3);
    check_sequence(&s, packets);
    check_header(&s);
    check_track_descriptors(&s, packets, &written);
    check_counter_values(&s, &written);
    check_stats(&s);
}

/// One sequence; the first packet clears incremental state, no other does.
fn check_sequence(s: &Value, packets: &[Value]) {
    assert_eq!(s["sequence_ids"], json!([DEFAULT_SEQUENCE_ID]));
    assert_eq!(packets[0]["kind"], "clock_snapshot");
    assert_eq!(packets[0]["sequence_flags"], json!(1));
    assert_eq!(packets[0]["first_packet_on_sequence"], json!(true));
    for p in &packets[1..] {
        assert_eq!(p["sequence_flags"], Value::Null, "{p}");
        assert_eq!(p["first_packet_on_sequence"], Value::Null, "{p}");
        assert_eq!(p["trusted_packet_sequence_id"], json!(DEFAULT_SEQUENCE_ID));
    }
}

/// Clocks, SystemInfo and the process tree as written.
fn check_header(s: &Value) {
    // Clocks: BOOTTIME(6) and MONOTONIC(3), BOOTTIME primary.
    assert_eq!(
        s["clock_snapshots"],
        json!([{"timestamp": SEC, "primary_trace_clock": 6,
                "clocks": [{"clock_id": 6, "timestamp": SEC}, {"clock_id": 3, "timestamp": SEC - 250}]}])
    );

    let si = &s["system_info"];
    assert_eq!(
        si["utsname"],
        json!({"sysname": "Linux", "release": "6.1.0-test", "version": "#1 SMP PREEMPT", "machine": "aarch64"})
    );
    assert_eq!(si["hz"], json!(100));
    assert_eq!(si["page_size"], json!(16384));
    assert_eq!(si["num_cpus"], json!(8));
    assert_eq!(si["system_ram_bytes"], json!(8u64 << 30));

    assert_eq!(
        s["process_tree"]["processes"],
        json!([
            {"pid": 100, "ppid": 1, "cmdline": ["/system/bin/foo", "--bar"], "uid": 1000},
            {"pid": 200, "ppid": 2, "cmdline": ["kworker/0:1"], "cmdline_is_comm": true},
        ])
    );
    assert_eq!(
        s["process_tree"]["threads"],
        json!([{"tid": 100, "tgid": 100, "name": "foo"}, {"tid": 101, "tgid": 100, "name": "worker"}])
    );
}

/// Track descriptors: parents, names, units; every counter event follows
/// its track's descriptor.
fn check_track_descriptors(s: &Value, packets: &[Value], written: &Written) {
    let tds = s["track_descriptors"].as_array().unwrap();
    let td = |uuid: TrackUuid| {
        tds.iter()
            .find(|t| t["uuid"] == json!(uuid))
            .unwrap_or_else(|| panic!("no descriptor for {uuid}"))
    };
    assert_eq!(tds.len(), 7);
    let mut uuids: Vec<u64> = tds.iter().map(|t| t["uuid"].as_u64().unwrap()).collect();
    uuids.sort_unstable();
    uuids.dedup();
    assert_eq!(uuids.len(), 7, "uuids are unique");
    assert!(!uuids.contains(&0));
    for &(proc, name, uuid) in &written.tracks {
        let t = td(uuid);
        assert_eq!(t["name"], json!(name));
        assert_eq!(t["process"], Value::Null);
        let parent = td(t["parent_uuid"]
            .as_u64()
            .expect("counter track has a parent"));
        assert_eq!(parent["process"]["pid"], json!(proc.pid));
        let pname = if proc == PROC_A { "foo" } else { "kworker/0:1" };
        assert_eq!(parent["process"]["process_name"], json!(pname));
        assert_eq!(parent["counter"], Value::Null);
        match name {
            "faults.minor" => {
                assert_eq!(t["counter"], json!({"unit": "UNIT_COUNT"}));
                assert_eq!(t["description"], Value::Null);
            }
            "cpu.share" => {
                assert_eq!(t["counter"], json!({"unit_name": "%"}));
                assert_eq!(t["description"], json!("share of one CPU"));
            }
            _ => unreachable!(),
        }
        // Parent descriptor before child descriptor before first value.
        let parent_at = index_of(packets, |p| p["uuid"] == parent["uuid"]).unwrap();
        let child_at = index_of(packets, |p| p["uuid"] == json!(uuid)).unwrap();
        let first_value_at = index_of(packets, |p| p["track_uuid"] == json!(uuid)).unwrap();
        assert!(parent_at < child_at && child_at < first_value_at);
    }
    let g = td(written.global);
    assert_eq!(g["parent_uuid"], Value::Null);
    assert_eq!(g["name"], "loadavg.1m");
    assert_eq!(g["counter"], json!({"unit_name": "load"}));

    // Every counter event follows its track's descriptor.
    for (i, p) in packets.iter().enumerate() {
        if p["kind"] == "track_event" {
            let d = index_of(packets, |q| q["uuid"] == p["track_uuid"]).expect("described");
            assert!(d < i, "descriptor of {p} at {d}");
        }
    }
}

/// Counter values: ints as counter_value, doubles as double_counter_value.
fn check_counter_values(s: &Value, written: &Written) {
    let counters = &s["counters"];
    for &(proc, name, uuid) in &written.tracks {
        let expect = match name {
            "faults.minor" => {
                let base = proc.pid as i64 * 10;
                json!([[2 * SEC, base], [3 * SEC, base + 1], [4 * SEC, base + 2]])
            }
            _ => json!([[2 * SEC, 0.5], [3 * SEC, 1.5], [4 * SEC, 2.5]]),
        };
        assert_eq!(counters[uuid.to_string()], expect, "{name} of {proc:?}");
    }
    assert_eq!(
        counters[written.global.to_string()],
        json!([[4 * SEC, 1.25]])
    );
}

/// SysStats (cpu_stat, psi) and ProcessStats as written.
fn check_stats(s: &Value) {
    // SysStats: cpu_stat and psi in separate packets at the given time.
    let sys = s["sys_stats"].as_array().unwrap();
    assert_eq!(sys.len(), 2);
    assert_eq!(sys[0]["ts"], json!(4 * SEC));
    assert_eq!(
        sys[0]["cpu_stat"],
        json!([
            {"cpu_id": 0, "user_ns": 11, "user_nice_ns": 12, "system_mode_ns": 13, "idle_ns": 14,
             "io_wait_ns": 15, "irq_ns": 16, "softirq_ns": 17, "steal_ns": 18},
            {"cpu_id": 1, "user_ns": 21, "user_nice_ns": 0, "system_mode_ns": 0, "idle_ns": 0,
             "io_wait_ns": 0, "irq_ns": 0, "softirq_ns": 0, "steal_ns": 0},
        ])
    );
    assert_eq!(
        sys[1]["psi"],
        json!([
            {"resource": "PSI_RESOURCE_CPU_SOME", "total_ns": 1},
            {"resource": "PSI_RESOURCE_CPU_FULL", "total_ns": 2},
            {"resource": "PSI_RESOURCE_IO_SOME", "total_ns": 3},
            {"resource": "PSI_RESOURCE_IO_FULL", "total_ns": 4},
            {"resource": "PSI_RESOURCE_MEMORY_SOME", "total_ns": 5},
            {"resource": "PSI_RESOURCE_MEMORY_FULL", "total_ns": 6},
        ])
    );

    // ProcessStats: kB and ns as given; unknown values stay absent, not 0.
    assert_eq!(
        s["process_stats"],
        json!([{"ts": 4 * SEC, "processes": [
            {"pid": 100, "vm_size_kb": 1000, "vm_rss_kb": 500, "rss_anon_kb": 300,
             "rss_file_kb": 150, "rss_shmem_kb": 50, "vm_swap_kb": 7,
             "runtime_user_mode": 3 * SEC, "runtime_kernel_mode": SEC},
            {"pid": 200, "vm_rss_kb": 0},
        ]}])
    );
    assert_eq!(s["ftrace_event_bundles"], json!(0));
    assert_eq!(s["perf_samples"], json!(0));
}

/// Offsets where each whole `Trace.packet` record ends.
fn packet_ends(bytes: &[u8]) -> Vec<usize> {
    let mut ends = Vec::new();
    let mut buf = bytes;
    while !buf.is_empty() {
        assert_eq!(buf[0], 0x0a, "record starts with the Trace.packet tag");
        buf = &buf[1..];
        let len = prost::encoding::decode_varint(&mut buf).unwrap() as usize;
        buf = &buf[len..];
        ends.push(bytes.len() - buf.len());
    }
    ends
}

#[test]
fn perfetto_truncated_after_any_packet_still_decodes() {
    let mut w = TraceWriter::new(Vec::new());
    let written = write_sample(&mut w);
    let bytes = w.into_inner();
    let ends = packet_ends(&bytes);
    assert_eq!(ends.len() as u64, written.packets);

    for (n, &end) in std::iter::once(&0).chain(&ends).enumerate() {
        let s = summarize_bytes(&bytes[..end])
            .unwrap_or_else(|e| panic!("prefix of {n} packets ({end} bytes) rejected: {e}"));
        assert_eq!(s["packet_count"], json!(n), "prefix of {end} bytes");
    }
    // A cut inside a packet is reported as an error, not silently accepted.
    let torn = ends[3] + 2;
    assert!(
        summarize_bytes(&bytes[..torn]).is_err(),
        "torn packet must not decode"
    );
}

#[test]
fn perfetto_tracks_are_stable_and_deduplicated() {
    let mut w = TraceWriter::new(Vec::new());
    let a = w
        .process_counter_track(PROC_A, "foo", &faults_spec())
        .unwrap();
    assert_eq!(w.packets_written(), 2, "process + counter descriptor");
    let again = w
        .process_counter_track(PROC_A, "foo", &faults_spec())
        .unwrap();
    assert_eq!(a, again);
    assert_eq!(w.packets_written(), 2, "no new descriptor");

    let b = w
        .process_counter_track(PROC_A, "foo", &share_spec())
        .unwrap();
    assert_eq!(w.packets_written(), 3, "process descriptor reused");
    assert_ne!(a, b);

    // Same pid, new starttime: a new process instance gets new tracks.
    let reused = ProcessKey {
        pid: PROC_A.pid,
        starttime_ticks: PROC_A.starttime_ticks + 1,
    };
    let c = w
        .process_counter_track(reused, "foo", &faults_spec())
        .unwrap();
    assert_ne!(a, c);
    assert_eq!(w.packets_written(), 5);

    // A new writer derives the same uuids.
    let mut w2 = TraceWriter::new(Vec::new());
    assert_eq!(
        w2.process_counter_track(PROC_A, "x", &faults_spec())
            .unwrap(),
        a
    );
    let g1 = w2.global_counter_track(&faults_spec()).unwrap();
    assert_ne!(g1, a, "global and process tracks of one name differ");
    assert_eq!(w2.global_counter_track(&faults_spec()).unwrap(), g1);
}

#[test]
fn perfetto_counter_needs_known_finite_track() {
    let mut w = TraceWriter::new(Vec::new());
    assert!(matches!(
        w.write_counter(1, 42, CounterValue::Int(1)),
        Err(PerfettoError::UnknownTrack { track: 42 })
    ));
    let t = w.global_counter_track(&faults_spec()).unwrap();
    assert!(matches!(
        w.write_counter(1, t, CounterValue::Double(f64::NAN)),
        Err(PerfettoError::NonFiniteValue { .. })
    ));
    assert_eq!(w.packets_written(), 1);
}

/// Accepts `budget` bytes, then fails (like a full disk).
struct FailingWriter {
    written: Vec<u8>,
    budget: usize,
}

impl Write for FailingWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.written.len() >= self.budget {
            return Err(io::Error::other("disk full"));
        }
        let n = buf.len().min(self.budget - self.written.len());
        self.written.extend_from_slice(&buf[..n]);
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[test]
fn perfetto_writer_stops_after_failed_write() {
    let mut w = TraceWriter::new(FailingWriter {
        written: Vec::new(),
        budget: 10,
    });
    let err = w.write_system_info(&facts()).unwrap_err();
    assert!(
        matches!(
            err,
            PerfettoError::Write {
                kind: "system_info",
                index: 0,
                ..
            }
        ),
        "{err}"
    );
    assert!(matches!(
        w.write_clock_snapshot(ClockPair {
            boottime_ns: 1,
            monotonic_ns: 1
        }),
        Err(PerfettoError::Poisoned)
    ));
    assert_eq!(w.packets_written(), 0);
    assert_eq!(w.bytes_written(), 0);
}

#[test]
fn perfetto_write_packet_stamps_sequence_and_first_flags() {
    use prost::Message;
    use protos::{trace_packet, TracePacket};

    let mut w = TraceWriter::new(Vec::new());
    let packet = TracePacket {
        trusted_packet_sequence_id: Some(999),
        sequence_flags: Some(trace_packet::SequenceFlags::SeqNeedsIncrementalState as u32),
        data: Some(trace_packet::Data::PerfSample(Default::default())),
        ..Default::default()
    };
    w.write_packet(packet.clone()).unwrap();
    w.write_packet(packet).unwrap();
    let trace = protos::Trace::decode(w.into_inner().as_slice()).unwrap();
    let [first, second] = &trace.packet[..] else {
        panic!("two packets")
    };
    assert_eq!(first.trusted_packet_sequence_id, Some(DEFAULT_SEQUENCE_ID));
    assert_eq!(first.sequence_flags, Some(3), "cleared | needs");
    assert_eq!(first.first_packet_on_sequence, Some(true));
    assert_eq!(second.trusted_packet_sequence_id, Some(DEFAULT_SEQUENCE_ID));
    assert_eq!(second.sequence_flags, Some(2));
    assert_eq!(second.first_packet_on_sequence, None);
}

/// A run of samples written at once is, packet for packet, what writing
/// each sample on its own gives, read by prost and by the official schema
/// (trace_summary.py): the copies' timestamp ahead of their shared fields
/// changes nothing a reader sees.
#[test]
fn perfetto_run_of_samples_reads_as_its_samples_one_by_one() {
    use prost::Message;
    use protos::{trace_packet, InternedData, PerfSample, TracePacket};

    let seq = std::num::NonZeroU32::new(7).unwrap();
    let first = TracePacket {
        timestamp: Some(1_000),
        sequence_flags: Some(trace_packet::SequenceFlags::SeqNeedsIncrementalState as u32),
        interned_data: Some(InternedData {
            function_names: vec![protos::InternedString {
                iid: Some(1),
                str: Some(b"read".to_vec()),
            }],
            ..Default::default()
        }),
        data: Some(trace_packet::Data::PerfSample(PerfSample {
            cpu: Some(1),
            pid: Some(2),
            tid: Some(3),
            callstack_iid: Some(1),
            ..Default::default()
        })),
        ..Default::default()
    };
    let step_ns = 1_000_000;
    let mut run = TraceWriter::new(Vec::new());
    run.write_run_on_sequence(seq, first.clone(), step_ns, 4)
        .unwrap();
    let mut one_by_one = TraceWriter::new(Vec::new());
    for i in 0..4 {
        let mut p = first.clone();
        if i > 0 {
            p.interned_data = None;
        }
        p.timestamp = Some(1_000 + i * step_ns);
        one_by_one.write_packet_on_sequence(seq, p).unwrap();
    }
    assert_eq!(run.packets_written(), 4);
    assert_eq!(run.bytes_written(), one_by_one.bytes_written());
    let (run, one_by_one) = (run.into_inner(), one_by_one.into_inner());
    let decoded = |b: &[u8]| protos::Trace::decode(b).unwrap().packet;
    let packets = decoded(&run);
    assert_eq!(packets, decoded(&one_by_one));
    // Only the first is the sequence's first, and carries the interned data.
    assert_eq!(packets[0].first_packet_on_sequence, Some(true));
    assert!(packets[1..]
        .iter()
        .all(|p| p.first_packet_on_sequence.is_none() && p.interned_data.is_none()));
    assert_eq!(packets[3].timestamp, Some(1_000 + 3 * step_ns));
    assert_eq!(summarize_bytes(&run), summarize_bytes(&one_by_one));

    // One alone, or none.
    let mut w = TraceWriter::new(Vec::new());
    w.write_run_on_sequence(seq, first.clone(), step_ns, 1)
        .unwrap();
    w.write_run_on_sequence(seq, first, step_ns, 0).unwrap();
    assert_eq!(w.packets_written(), 1);
}

/// A run without a timestamp is `count` alike packets, the one with the
/// interned data (and the sequence's first-packet flags) ahead.
#[test]
fn perfetto_run_without_timestamp_writes_its_first_ahead() {
    use prost::Message;
    use protos::{trace_packet, InternedData, TracePacket};

    let seq = std::num::NonZeroU32::new(7).unwrap();
    let first = TracePacket {
        interned_data: Some(InternedData {
            function_names: vec![protos::InternedString {
                iid: Some(1),
                str: Some(b"read".to_vec()),
            }],
            ..Default::default()
        }),
        data: Some(trace_packet::Data::PerfSample(Default::default())),
        ..Default::default()
    };
    let mut w = TraceWriter::new(Vec::new());
    w.write_run_on_sequence(seq, first, 1_000, 3).unwrap();
    let packets = protos::Trace::decode(w.into_inner().as_slice())
        .unwrap()
        .packet;
    assert_eq!(packets.len(), 3);
    assert!(packets[0].interned_data.is_some());
    assert_eq!(packets[0].first_packet_on_sequence, Some(true));
    assert!(packets[1..]
        .iter()
        .all(|p| p.interned_data.is_none() && p.timestamp.is_none()));
}
