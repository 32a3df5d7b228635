//! The drain thread: polls the capture transport (the ring buffer's
//! records are submitted with BPF_RB_NO_WAKEUP, so no epoll; the perf
//! array's per-CPU buffers are polled the same way), decodes records and
//! hands them to the record loop in batches, so the kernel side never waits
//! on trace writing. The transports (`ringbuf`, `perf_array`) only read;
//! this is the one place that picks between them.

use std::{
    sync::{
        atomic::{AtomicBool, Ordering},
        mpsc, Arc,
    },
    thread::JoinHandle,
    time::Duration,
};

use super::{
    decode::Record,
    transport::{perf_array, ringbuf, EventOutput},
};

/// The drain thread of a running capture and the channel its batches
/// arrive on.
pub struct Drainer {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<EventOutput>>,
    pub rx: mpsc::Receiver<Vec<Record>>,
}

impl Drainer {
    /// Discards anything left from an earlier capture, then polls every
    /// `poll` until stopped.
    pub fn start(mut out: EventOutput, poll: Duration) -> std::io::Result<Self> {
        // Leftovers (records and perf loss reports) belong to no capture.
        drain_into(&mut out, &mut Vec::new());
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, rx) = mpsc::channel();
        let flag = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("capture-drain".into())
            .spawn(move || {
                loop {
                    // Read the flag before draining: after it is set, one
                    // more full drain picks up everything submitted so far.
                    let last = flag.load(Ordering::Acquire);
                    let mut batch = Vec::new();
                    drain_into(&mut out, &mut batch);
                    if !batch.is_empty() && tx.send(batch).is_err() {
                        break;
                    }
                    if last {
                        break;
                    }
                    std::thread::sleep(poll);
                }
                out
            })?;
        Ok(Self {
            stop,
            thread: Some(thread),
            rx,
        })
    }

    /// Final drain; returns the transport and the batches not yet taken.
    pub fn stop(self) -> (Option<EventOutput>, Vec<Vec<Record>>) {
        self.stop.store(true, Ordering::Release);
        let ring = self.thread.and_then(|t| t.join().ok());
        let batches = self.rx.try_iter().collect();
        (ring, batches)
    }
}

/// Everything readable now, decoded, from either transport.
fn drain_into(out: &mut EventOutput, batch: &mut Vec<Record>) {
    match out {
        EventOutput::Ring(ring) => ringbuf::drain(ring, batch),
        EventOutput::Perf(bufs) => perf_array::drain(bufs, batch),
    }
}
