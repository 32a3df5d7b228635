//! The kernel's scheduler clock against CLOCK_MONOTONIC.
//!
//! The kernel accounts a task's runtime (`/proc/<pid>/schedstat`) on its
//! runqueue clock, `sched_clock_cpu()`; vitalsd times slices with
//! `bpf_ktime_get_ns()`, CLOCK_MONOTONIC. On hardware the two advance
//! together (NTP slews CLOCK_MONOTONIC by at most 500 ppm), but in QEMU TCG
//! guests they can drift apart by percent (measured: schedstat ran 2 %
//! ahead on x86_64 5.10 and 7 % on arm64 5.10). Tests that bound
//! vitalsd's nanoseconds by the kernel's convert between the two with
//! the rate measured here.
//!
//! The sched clock is read through printk: every /dev/kmsg record carries
//! `local_clock()` (the writing CPU's `sched_clock_cpu()`) in microseconds.

use std::{
    fs::OpenOptions,
    io::{Read, Write},
    os::unix::fs::OpenOptionsExt,
    sync::atomic::{AtomicU32, Ordering},
};

/// One reading of both clocks: the sched clock's value at one printk, and
/// the CLOCK_MONOTONIC interval its write() ran in (the printk happened at
/// some instant inside it).
#[derive(Debug, Clone, Copy)]
pub struct ClockPair {
    pub sched_ns: u64,
    pub monotonic_lo_ns: u64,
    pub monotonic_hi_ns: u64,
}

/// Bounds on the sched clock's rate against CLOCK_MONOTONIC between two
/// readings: whatever instant inside each write the printk took, the rate
/// lies between `lo` and `hi`.
#[derive(Debug, Clone, Copy)]
pub struct RateBounds {
    pub lo: f64,
    pub hi: f64,
}

fn monotonic_ns() -> u64 {
    let ts = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).expect("clock_gettime");
    ts.tv_sec() as u64 * 1_000_000_000 + ts.tv_nsec() as u64
}

/// Both clocks as seen on `cpu`: a task's runtime is on its own CPU's
/// sched clock, and in a TCG guest CPUs' sched clocks can run at rates of
/// their own. A short-lived thread pinned there writes the markers. Of
/// several probes the one whose write() took least is kept: in a guest on
/// a loaded host a vCPU stalls for milliseconds, which widens a probe's
/// interval (a rate read from interval midpoints was off by 1.6 % there).
pub fn read_clocks_on(cpu: usize) -> ClockPair {
    std::thread::spawn(move || {
        let mut set = nix::sched::CpuSet::new();
        set.set(cpu).expect("cpu index");
        nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set)
            .unwrap_or_else(|e| panic!("pinning the clock probe to CPU {cpu}: {e}"));
        (0..5)
            .map(|_| read_clocks())
            .min_by_key(|p| p.monotonic_hi_ns - p.monotonic_lo_ns)
            .unwrap()
    })
    .join()
    .expect("clock probe thread")
}

/// Writes a marker to /dev/kmsg and reads back its timestamp, with the
/// monotonic interval of the write.
pub fn read_clocks() -> ClockPair {
    static SEQ: AtomicU32 = AtomicU32::new(0);
    let marker = format!(
        "vitals-tests clock probe {} {}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    );
    let mut kmsg = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NONBLOCK)
        .open("/dev/kmsg")
        .expect("opening /dev/kmsg (root)");
    let before = monotonic_ns();
    // The newline ends the record: without one printk may hold it open
    // for a continuation, and readers see only finished records. "<7>"
    // (KERN_DEBUG) keeps it off a console, where it would interleave with
    // what a guest's checks print.
    kmsg.write_all(format!("<7>{marker}\n").as_bytes())
        .expect("writing to /dev/kmsg");
    let after = monotonic_ns();
    // Reading the same fd returns records from the oldest kept one on;
    // each read is one record, until EAGAIN.
    let mut buf = vec![0u8; 8192];
    let mut found = None;
    loop {
        match kmsg.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                let rec = String::from_utf8_lossy(&buf[..n]);
                if let Some((head, msg)) = rec.split_once(';') {
                    if msg.trim_end() == marker {
                        found = head.split(',').nth(2).and_then(|t| t.parse::<u64>().ok());
                    }
                }
            }
            // EPIPE: records were overwritten under us; keep reading.
            Err(e) if e.raw_os_error() == Some(libc::EPIPE) => continue,
            // EAGAIN: no more records.
            Err(_) => break,
        }
    }
    let sched_us = found.unwrap_or_else(|| {
        panic!("marker {marker:?} not found in /dev/kmsg (rate-limited by printk.devkmsg?)")
    });
    ClockPair {
        sched_ns: sched_us * 1000,
        monotonic_lo_ns: before,
        monotonic_hi_ns: after,
    }
}

/// Sched-clock nanoseconds per CLOCK_MONOTONIC nanosecond between `a` and
/// `b`, as bounds: the monotonic time between the two printks is at least
/// from the end of `a`'s write to the start of `b`'s, at most from the
/// start of `a`'s to the end of `b`'s. printk's timestamps are whole
/// microseconds, so one more microsecond each way.
pub fn sched_per_monotonic(a: ClockPair, b: ClockPair) -> RateBounds {
    let shortest = b.monotonic_lo_ns.saturating_sub(a.monotonic_hi_ns);
    let longest = b.monotonic_hi_ns.saturating_sub(a.monotonic_lo_ns);
    assert!(
        shortest > 0,
        "clock readings out of order or overlapping: {a:?} then {b:?}"
    );
    let sched = b.sched_ns as f64 - a.sched_ns as f64;
    RateBounds {
        lo: (sched - 1000.0) / longest as f64,
        hi: (sched + 1000.0) / shortest as f64,
    }
}
