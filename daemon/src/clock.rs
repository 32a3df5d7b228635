//! The two clocks every sample carries.
//!
//! CLOCK_BOOTTIME keeps counting through suspend and is Perfetto's default
//! trace clock; CLOCK_MONOTONIC stops in suspend and is what
//! bpf_ktime_get_ns() returns. A window's length on both tells how much of it
//! the device spent asleep.

use nix::time::{clock_gettime, ClockId};

/// One reading of both clocks, taken back to back.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct ClockPair {
    pub boottime_ns: u64,
    pub monotonic_ns: u64,
}

fn read_ns(id: ClockId) -> u64 {
    // clock_gettime on these two clocks cannot fail on Linux >= 2.6.39.
    let ts = clock_gettime(id).expect("clock_gettime(BOOTTIME/MONOTONIC)");
    ts.tv_sec() as u64 * 1_000_000_000 + ts.tv_nsec() as u64
}

impl ClockPair {
    pub fn now() -> Self {
        Self {
            boottime_ns: read_ns(ClockId::CLOCK_BOOTTIME),
            monotonic_ns: read_ns(ClockId::CLOCK_MONOTONIC),
        }
    }
}

pub fn boottime_ns() -> u64 {
    read_ns(ClockId::CLOCK_BOOTTIME)
}

pub fn monotonic_ns() -> u64 {
    read_ns(ClockId::CLOCK_MONOTONIC)
}
