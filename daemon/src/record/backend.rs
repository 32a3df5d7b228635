//! The eBPF recording backend: the capture tier (every switch and waking,
//! sampled fault stacks) for the recording's window only, switched on by
//! the CAPTURE flag in the daemon's own programs: loading a second set
//! would run every always-on program twice per event while the recording
//! lasts (#14). Its samples are the daemon's ticks, at `sampling.interval`.
//!
//! The file writing stays on the recording's thread, fed each tick's value
//! through a channel: the main loop's tick is not held up by a large
//! tick's sched records or a slow disk, and the store's commit already
//! happens when the thread ends. Dropping the channel's sender (the daemon
//! stopping) ends the recording at once.

use std::sync::mpsc;

use super::{record_fed, Feed, RecordError, RecordOptions};
use crate::{
    events::{EventOptions, OffcpuWatch, WatchedProcesses},
    export,
    history::VitalsSample,
    recording_backend::{
        Daemon, Prepared, Recorded, RecordingBackend, RecordingFailed, Target, Window,
    },
};

pub struct EbpfBackend;

impl RecordingBackend for EbpfBackend {
    fn name(&self) -> &'static str {
        "ebpf"
    }

    fn available(&self, has_bpf: bool) -> bool {
        has_bpf
    }

    fn prepare(&self, daemon: Daemon<'_>, window: Window, target: &Target) -> Prepared {
        let (tx, ticks) = mpsc::channel();
        let feed = Feed {
            programs: daemon.programs.cloned(),
            first: daemon.pipeline.last().share(),
            origin: daemon.pipeline.origin(),
            ticks,
        };
        let mut opts = RecordOptions {
            duration: window.duration,
            out: target.out.clone(),
            interval: window.interval,
            proc_root: window.proc_root,
            drop_privileges: false,
            capture: EventOptions {
                events: window.events,
                ..EventOptions::default()
            },
            max_bytes: Some(window.max_bytes),
        };
        let samples: Vec<VitalsSample> = daemon.history.iter().cloned().collect();
        let offcpu = window.offcpu;
        Prepared {
            run: Box::new(move |_stop| {
                // Resolved here, off the main loop: the names need a walk
                // of /proc. Processes started after this join by name at
                // a later tick (`Recording::take`).
                opts.capture.offcpu = offcpu.map(|r| r.resolve(&opts.proc_root));
                let notes = opts.capture.offcpu.iter().map(watched_note).collect();
                let summary = record_fed(feed, &opts, |w| export::write_history(w, &samples))
                    .map_err(failed)?;
                Ok(Recorded {
                    wall_ms: summary.wall_monotonic_ns / 1_000_000,
                    cut_at_bytes: summary.cut_at_max_bytes.then_some(summary.bytes_written),
                    notes,
                    heapprofd: None,
                })
            }),
            ticks: Some(tx),
            session_out: None,
        }
    }
}

/// The store entry's note of what the off-CPU stacks watched.
fn watched_note(w: &OffcpuWatch) -> String {
    match &w.processes {
        WatchedProcesses::All => format!("off-cpu: every thread, blocks >= {} ns", w.min_block_ns),
        WatchedProcesses::Tgids(t) => {
            format!("off-cpu: pids {t:?}, blocks >= {} ns", w.min_block_ns)
        }
    }
}

/// Whole packets a recording put on the disk before its error are worth
/// keeping; a recording that never started (no eBPF) left none.
fn failed(e: RecordError) -> RecordingFailed {
    let keeps_partial = !matches!(e, RecordError::CaptureNeedsBpf(_));
    RecordingFailed {
        error: Box::new(e),
        keeps_partial,
    }
}
