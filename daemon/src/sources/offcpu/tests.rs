use std::collections::{BTreeMap, HashMap};

use vitals_common::{OffcpuCounters, WakerCounters, WakerKey};

use super::*;
use crate::{accounting::ProcessCounters, sources::ebpf::BpfDelta};

fn key(wakee: u32, waker: u32) -> WakerKey {
    WakerKey {
        wakee_tgid: wakee,
        waker_tgid: waker,
    }
}

fn c(wakeups: u64, blocked_ns: u64) -> WakerCounters {
    WakerCounters {
        wakeups,
        blocked_ns,
    }
}

#[test]
fn pair_deltas_take_the_change_and_a_reinserted_pair_whole() {
    let prev = HashMap::from([(key(7, 9), c(10, 1_000)), (key(8, 9), c(5, 500))]);
    let cur = HashMap::from([
        (key(7, 9), c(13, 4_000)),
        // Deleted (wakee ended) and inserted again by a new process.
        (key(8, 9), c(2, 50)),
        (key(7, 0), c(4, 100)),
        // No wakeup this window: left out.
        (key(6, 9), c(0, 0)),
    ]);
    let d = pair_deltas(&prev, &cur);
    assert_eq!(
        d,
        [
            WakerPair {
                key: key(7, 0),
                wakeups: 4,
                blocked_ns: 100
            },
            WakerPair {
                key: key(7, 9),
                wakeups: 3,
                blocked_ns: 3_000
            },
            WakerPair {
                key: key(8, 9),
                wakeups: 2,
                blocked_ns: 50
            },
        ],
        "most wakeups first"
    );
    assert_eq!(pair_label(&key(7, 0)), "7<-irq");
    assert_eq!(pair_label(&key(7, 9)), "7<-9");
}

fn row(tgid: u32, long_blocks: u64, main: u64, ended: bool) -> ProcessCounters {
    ProcessCounters {
        tgid,
        offcpu: OffcpuCounters {
            long_blocks,
            ..Default::default()
        },
        main_thread_long_blocks: main,
        ended,
        ..Default::default()
    }
}

#[test]
fn a_tick_gives_columns_figures_status_and_summary() {
    let mut room = Offcpu::new(None, OffcpuSettings::default());
    let mut tick = Tick {
        wakers: HashMap::from([(key(7, 9), c(2, 30_000_000))]),
        rows: vec![row(7, 5, 3, false)],
        ..Default::default()
    };
    room.read(&mut tick);
    tick.wakers = HashMap::from([(key(7, 9), c(5, 90_000_000)), (key(8, 7), c(1, 1_000))]);
    tick.rows = vec![row(7, 6, 4, false), row(8, 1, 1, true)];
    tick.deltas.insert(
        7,
        BpfDelta {
            tgid: 7,
            blocked_s_ns: 60_000_000,
            blocked_d_ns: 2_500_000,
            long_blocks: 1,
            ..Default::default()
        },
    );
    room.read(&mut tick);
    assert_eq!(room.window_pairs()[0].wakeups, 3);
    assert_eq!(room.window_pairs()[0].blocked_ns, 60_000_000);

    let task = crate::sources::tasks::quiet_process_window(7);
    let mut top = TopRow::default();
    room.columns(&tick, &task.processes[0], &mut top);
    let o = top.offcpu.expect("off-CPU columns");
    assert_eq!(
        (o.blocked_s_ms, o.blocked_d_ms, o.long_blocks),
        (60.0, 2.5, 1)
    );

    let mut f = ProcessFigures::default();
    room.process_figures(&tick, &task.processes[0], &mut f);
    assert_eq!(f.get("offcpu.main_thread_long_blocks"), Some(4.0));

    let mut status = BTreeMap::new();
    room.status(&mut status);
    assert_eq!(status["offcpu_wakers"]["7<-9.wakeups"], 3);
    assert_eq!(status["offcpu_wakers"]["7<-9.blocked_us"], 60_000);
    assert_eq!(status["offcpu"]["long_block_us"], 16_000);
    let summary = room.summary().unwrap();
    assert!(
        summary.contains("7<-9 5 wakeups 90.0 ms"),
        "since the room opened: {summary}"
    );
    // Process 8 ended: its pairs are no baseline any more.
    assert!(!room.prev.keys().any(|k| k.wakee_tgid == 8));
}
