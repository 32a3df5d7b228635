//! The recording sink fed a pipeline's ticks (a daemon capture's window),
//! on a fake procfs tree and /proc-only, so without root.

use std::{sync::mpsc, time::Duration};

use prost::Message;
use vitals_proto::protos::{trace_packet::Data, Trace};

use super::*;
use crate::{
    pipeline::Pipeline,
    procfs::testutil::{FakeProc, Task},
};

const CPU: [u64; 10] = [100, 0, 50, 1000, 10, 0, 5, 0, 0, 0];

fn fake_proc() -> FakeProc {
    let fake = FakeProc::new();
    fake.set_stat(CPU, &[(0, CPU)]);
    fake.set_process(&Task {
        pid: 42,
        comm: "worker",
        minflt: 1,
        majflt: 0,
        utime: 5,
        stime: 5,
        starttime: 9,
    });
    fake
}

fn opts(fake: &FakeProc, out: PathBuf) -> RecordOptions {
    RecordOptions {
        duration: Duration::from_secs(3600),
        out,
        interval: Duration::from_secs(1),
        proc_root: fake.root().to_path_buf(),
        drop_privileges: false,
        capture: EventOptions::default(),
        max_bytes: None,
    }
}

/// What a trace file holds: packets of ProcessStats, and ProcessTree
/// entries' pids.
fn stats_and_tree(path: &std::path::Path) -> (usize, Vec<i32>) {
    let trace = Trace::decode(&*std::fs::read(path).unwrap()).unwrap();
    let mut stats = 0;
    let mut pids = Vec::new();
    for p in trace.packet {
        match p.data {
            Some(Data::ProcessStats(_)) => stats += 1,
            Some(Data::ProcessTree(t)) => pids.extend(t.processes.iter().map(|p| p.pid())),
            _ => {}
        }
    }
    (stats, pids)
}

/// A fed recording writes the ticks it is handed, one sample each, and
/// ends with those it has when the feed is dropped (the daemon stopping):
/// it never samples procfs itself.
#[test]
fn a_fed_recording_writes_each_tick_and_ends_when_the_feed_drops() {
    let fake = fake_proc();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("fed.pftrace");
    let mut pipeline = Pipeline::open(fake.root(), 100, None);
    pipeline.tick();
    let (tx, ticks) = mpsc::channel();
    let feed = Feed {
        programs: Err(ProcOnly::Asked),
        first: pipeline.last().share(),
        origin: None,
        ticks,
    };
    for _ in 0..2 {
        pipeline.tick();
        tx.send(Ok(pipeline.last().share())).unwrap();
    }
    drop(tx);
    let summary = record_fed(feed, &opts(&fake, out.clone()), |_| Ok(())).unwrap();
    assert_eq!(summary.samples, 2);
    let (stats, pids) = stats_and_tree(&out);
    assert_eq!(stats, 2, "one ProcessStats per tick handed over");
    assert_eq!(pids, [42], "named from the first tick's scan");
}

/// A tick the daemon failed to take cuts the recording short with its
/// error, as a recording that read for itself failed; what it wrote stays.
#[test]
fn a_failed_tick_cuts_the_fed_recording_short() {
    let fake = fake_proc();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("cut.pftrace");
    let mut pipeline = Pipeline::open(fake.root(), 100, None);
    pipeline.tick();
    let (tx, ticks) = mpsc::channel();
    let feed = Feed {
        programs: Err(ProcOnly::Asked),
        first: pipeline.last().share(),
        origin: None,
        ticks,
    };
    pipeline.tick();
    tx.send(Ok(pipeline.last().share())).unwrap();
    tx.send(Err("reading the eBPF maps: EIO".into())).unwrap();
    let err = record_fed(feed, &opts(&fake, out.clone()), |_| Ok(())).unwrap_err();
    assert_eq!(err.to_string(), "reading the eBPF maps: EIO");
    assert_eq!(
        stats_and_tree(&out).0,
        1,
        "the tick before the failure is kept"
    );
}

/// A capture's tier needs the programs: /proc-only it fails before any
/// trace is written.
#[test]
fn a_fed_capture_without_ebpf_needs_bpf() {
    let fake = fake_proc();
    let dir = tempfile::tempdir().unwrap();
    let mut o = opts(&fake, dir.path().join("none.pftrace"));
    o.capture.events.sched = true;
    let (_tx, ticks) = mpsc::channel();
    let feed = Feed {
        programs: Err(ProcOnly::Asked),
        first: Tick::default(),
        origin: None,
        ticks,
    };
    let err = record_fed(feed, &o, |_| Ok(())).unwrap_err();
    assert!(matches!(err, RecordError::CaptureNeedsBpf(_)), "{err}");
}
