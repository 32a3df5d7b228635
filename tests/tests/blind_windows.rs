//! No blind windows from our own reads (#22 item 2): the always-on read
//! takes the counters through mmap, not bpf() lookups. A bpf() lookup
//! raises `bpf_prog_active` on the reader's CPU, and, preempted inside it
//! (Linux 5.11+), hides every switch there from the classic programs.

use std::path::Path;

use vitals_tests::*;

/// `vitalsd record` on the classic path under strace, while 30 short
/// children exit: between the attach and the end, no bpf() call copies a
/// map value (lookups, batches, deletes): the counters are read through
/// the arrays' mappings and freed tasks through EXITED_RING's (this kernel
/// has ring buffers). What remains is BPF_MAP_GET_NEXT_KEY on the empty
/// fallback hashes, which does not raise bpf_prog_active. strace, the
/// kernel's syscall stream as ptrace sees it, is the witness.
#[test]
fn always_on_read_copies_no_counters_through_bpf() {
    require_root();
    let strace = Path::new("/usr/bin/strace");
    assert!(strace.exists(), "strace missing: apt-get install -y strace");
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("bpf.strace");
    let trace = dir.path().join("t.pftrace");
    let vitalsd = vitalsd_bin();
    let run = Workload::spawn_exe(
        strace,
        &[
            "-f",
            "-qq",
            "-e",
            "trace=bpf",
            "-o",
            log.to_str().unwrap(),
            vitalsd.to_str().unwrap(),
            "record",
            "--classic-tracepoints",
            "--duration",
            "3s",
            "--interval",
            "200ms",
            "--out",
            trace.to_str().unwrap(),
        ],
    );
    // Freed tasks while it records (it attaches within a second or so).
    let mut children = Workload::spawn(&["children", "30", "5"]);
    children.expect("ready");
    std::thread::sleep(std::time::Duration::from_millis(1500));
    children.go();
    assert_eq!(children.read_children().len(), 30);
    children.finish();
    // Its summary (stdout, piped to us) is far below a pipe's buffer.
    run.finish();
    let text = std::fs::read_to_string(&log).unwrap();
    let calls: Vec<&str> = text
        .lines()
        .filter_map(|l| l.split("bpf(").nth(1))
        .filter_map(|l| l.split(',').next())
        .collect();
    // The read loop starts after the last program is attached.
    let attached = calls
        .iter()
        .rposition(|c| *c == "BPF_LINK_CREATE" || *c == "BPF_PROG_LOAD")
        .expect("no program attached");
    let reads = &calls[attached + 1..];
    let count = |cmd: &str| reads.iter().filter(|c| **c == cmd).count();
    let mut seen: Vec<(&str, usize)> = Vec::new();
    for c in reads {
        match seen.iter_mut().find(|(name, _)| name == c) {
            Some((_, n)) => *n += 1,
            None => seen.push((c, 1)),
        }
    }
    // ~15 reads at 200 ms in 3 s; each walks EXITED at least once.
    assert!(
        count("BPF_MAP_GET_NEXT_KEY") >= 10,
        "too few reads seen: {seen:?}"
    );
    for copying in [
        "BPF_MAP_LOOKUP_ELEM",
        "BPF_MAP_LOOKUP_BATCH",
        "BPF_MAP_LOOKUP_AND_DELETE_BATCH",
        "BPF_MAP_DELETE_ELEM",
    ] {
        assert_eq!(count(copying), 0, "{copying} during the reads: {seen:?}");
    }
}
