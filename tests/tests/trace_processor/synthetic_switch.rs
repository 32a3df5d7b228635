//! A switch recorded after an unseen one (a blind window, a lost record,
//! a task the kernel does not trace), judged by trace_processor.
//! CompactSched carries no prev pid: the importer takes the CPU's last
//! next as the prev. `compact_sched::build_bundle` therefore writes a
//! synthetic switch to the real prev first. Both traces here are built
//! from the same records, deterministically, with and without the prev's
//! comm (without it, no synthetic switch is written), so the test shows
//! the importer's wrong charge and its fix side by side.

use super::*;
use vitalsd::{
    perfetto::{
        compact_sched::{build_bundle, comm_from, Comm, CpuEvents, SwitchRec},
        protos::{trace_packet, TracePacket},
        SystemFacts, TraceWriter,
    },
    system::Utsname,
};

const MS: u64 = 1_000_000;
/// TASK_REPORT bits of the switch tracepoint's prev_state (Linux ≥ 4.14).
const STATE_R: i64 = 0;
const STATE_S: i64 = 1;

fn switch(ts: u64, prev_pid: i32, prev_state: i64, next_pid: i32, comm: &str) -> SwitchRec {
    SwitchRec {
        ts,
        prev_pid,
        prev_prio: 120,
        prev_state,
        next_pid,
        next_prio: 120,
        next_comm: comm_from(comm),
    }
}

/// CPU 0: idle, then 5 runs and blocks (S) for 6, which runs until 3 ms.
/// Between two bundles 6 switches to 7 unseen; at 3 ms 7 blocks (S) for
/// 8, which blocks at 4 ms. `comm_of` names 7 for the synthetic switch.
fn write_trace(path: &Path, comm_of: fn(i32) -> Option<Comm>) -> (u64, u64) {
    let mut w = TraceWriter::new(std::fs::File::create(path).unwrap());
    w.write_system_info(&SystemFacts {
        utsname: Utsname {
            sysname: "Linux".into(),
            release: "6.1.0".into(),
            version: "#1 SMP PREEMPT".into(),
            machine: "x86_64".into(),
        },
        hz: 100,
        page_size_bytes: 4096,
        num_cpus: 1,
        system_ram_bytes: None,
    })
    .unwrap();
    let mut cpu0 = CpuEvents::default();
    let bundles = [
        vec![
            switch(MS, 0, STATE_R, 5, "five"),
            switch(2 * MS, 5, STATE_S, 6, "six"),
        ],
        vec![
            switch(3 * MS, 7, STATE_S, 8, "eight"),
            switch(4 * MS, 8, STATE_S, 0, "swapper/0"),
        ],
    ];
    for switches in bundles {
        cpu0.switches = switches;
        let bundle = build_bundle(0, &mut cpu0, false, comm_of);
        cpu0.clear();
        w.write_packet(TracePacket {
            data: Some(trace_packet::Data::FtraceEvents(bundle)),
            ..Default::default()
        })
        .unwrap();
    }
    w.flush().unwrap();
    (cpu0.gaps, cpu0.synthetic)
}

/// (state, ts, dur) of `tid`'s thread_state rows, in time order.
fn states(t: &Imported, tid: i64) -> Vec<(String, i64, i64)> {
    t.q(&format!(
        "select s.state, s.ts, s.dur from thread_state s join thread using(utid) \
         where tid = {tid} order by s.ts"
    ))
    .iter()
    .map(|r| {
        (
            text(r, "state").unwrap_or("?").to_owned(),
            int(r, "ts"),
            int(r, "dur"),
        )
    })
    .collect()
}

/// The state `tid` is in from `ts` on, per trace_processor (the last row
/// starting at or before it).
fn state_from(rows: &[(String, i64, i64)], ts: u64) -> Option<&str> {
    rows.iter()
        .rev()
        .find(|(_, start, _)| *start <= ts as i64)
        .map(|(s, _, _)| s.as_str())
}

#[test]
fn a_switch_after_an_unseen_one_charges_the_real_prev_in_trace_processor() {
    let tp = trace_processor();
    let dir = tempfile::tempdir().unwrap();

    // Without the prev's comm: the importer charges 7's block to 6.
    let plain = dir.path().join("plain.pftrace");
    assert_eq!(write_trace(&plain, |_| None), (1, 0));
    let t = Imported::new(&tp, &plain);
    assert_import_errors(&t, "no synthetic switch", &[]);
    let (six, seven) = (states(&t, 6), states(&t, 7));
    eprintln!("without the synthetic switch: 6 {six:?}, 7 {seven:?}");
    assert_eq!(state_from(&six, 3 * MS), Some("S"), "6: {six:?}");
    assert!(seven.is_empty(), "7 unseen, yet has states: {seven:?}");

    // With it: 6 was switched out (shown preempted, R+) and 7 blocked.
    let fixed = dir.path().join("fixed.pftrace");
    assert_eq!(
        write_trace(&fixed, |pid| (pid == 7).then(|| comm_from("seven"))),
        (1, 1)
    );
    let t = Imported::new(&tp, &fixed);
    assert_import_errors(&t, "synthetic switch", &[]);
    let (six, seven, eight) = (states(&t, 6), states(&t, 7), states(&t, 8));
    eprintln!("with the synthetic switch: 6 {six:?}, 7 {seven:?}, 8 {eight:?}");
    assert_eq!(
        six.first().map(|(s, ts, dur)| (s.as_str(), *ts, *dur)),
        Some(("Running", 2 * MS as i64, MS as i64)),
        "6: {six:?}"
    );
    assert_eq!(state_from(&six, 3 * MS), Some("R+"), "6: {six:?}");
    assert_eq!(state_from(&seven, 3 * MS), Some("S"), "7: {seven:?}");
    let name = t.one("select name from thread where tid = 7");
    assert_eq!(text(&name, "name"), Some("seven"));
    // 8's slice and block are untouched by the synthetic switch.
    assert_eq!(
        eight.first().map(|(s, ts, dur)| (s.as_str(), *ts, *dur)),
        Some(("Running", 3 * MS as i64, MS as i64)),
        "8: {eight:?}"
    );
    assert_eq!(state_from(&eight, 4 * MS), Some("S"), "8: {eight:?}");
}
