//! The drain thread: polls the capture transport (the timeline's and
//! fault samples' records are submitted to the ring buffer with
//! BPF_RB_NO_WAKEUP, so no wait on its fd would end; the perf array's
//! per-CPU buffers are polled the same way), decodes records and hands
//! them to the record loop in batches, so the kernel side never waits on
//! trace writing. An off-CPU-only capture's records wake a waiting reader
//! instead (`Pace::Wakeup`). The transports (`ringbuf`, `perf_array`)
//! only read; this is the one place that picks between them.

use std::{
    os::fd::AsFd,
    sync::{
        atomic::{AtomicBool, Ordering},
        mpsc, Arc,
    },
    thread::JoinHandle,
    time::Duration,
};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};

use super::{
    decode::Record,
    transport::{perf_array, ringbuf, EventOutput},
};

/// How the drain thread waits between two drains.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pace {
    /// Sleeps this long: records that wake no reader (the timeline's and
    /// fault samples, many a second).
    Poll(Duration),
    /// Waits on the ring buffer's fd for at most this long (which bounds
    /// how late a stop is seen): an off-CPU-only capture, whose few
    /// records each wake a reader that had caught up (the programs'
    /// `RING_WAKES`). An idle drain then wakes ten times a second where
    /// the 5 ms poll woke it 200 times (record --offcpu on this project's
    /// host: 238 context switches of the drain thread in 10 s, against
    /// about 2000). The perf array polls at `POLL_EVERY` instead.
    Wakeup(Duration),
}

/// The poll's period: the perf array and the records that wake no reader.
const POLL_EVERY: Duration = Duration::from_millis(5);

impl Pace {
    /// The timeline's and fault samples' pace.
    pub const POLL: Pace = Pace::Poll(POLL_EVERY);
    /// An off-CPU-only capture's.
    pub const WAKEUP: Pace = Pace::Wakeup(Duration::from_millis(100));
}

/// The drain thread of a running capture and the channel its batches
/// arrive on.
pub struct Drainer {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<EventOutput>>,
    pub rx: mpsc::Receiver<Vec<Record>>,
}

impl Drainer {
    /// Discards anything left from an earlier capture, then drains at
    /// `pace` until stopped.
    pub fn start(mut out: EventOutput, pace: Pace) -> std::io::Result<Self> {
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
                    wait(&out, pace);
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

/// Waits until the next drain, at `pace`.
fn wait(out: &EventOutput, pace: Pace) {
    match (pace, out) {
        (Pace::Wakeup(most), EventOutput::Ring(ring)) => {
            let mut fds = [PollFd::new(ring.as_fd(), PollFlags::POLLIN)];
            let timeout = PollTimeout::try_from(most).unwrap_or(PollTimeout::MAX);
            // EINTR or an error: the drain that follows reads what there
            // is, and the next wait tries again.
            if let Err(e) = poll(&mut fds, timeout) {
                log::debug!("capture drain: poll of the ring buffer: {e}");
            }
        }
        (Pace::Wakeup(_), EventOutput::Perf(_)) => std::thread::sleep(POLL_EVERY),
        (Pace::Poll(every), _) => std::thread::sleep(every),
    }
}

/// Everything readable now, decoded, from either transport.
fn drain_into(out: &mut EventOutput, batch: &mut Vec<Record>) {
    match out {
        EventOutput::Ring(ring) => ringbuf::drain(ring, batch),
        EventOutput::Perf(bufs) => perf_array::drain(bufs, batch),
    }
}
