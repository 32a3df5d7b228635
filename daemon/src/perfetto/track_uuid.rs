//! Track uuids derived from what the track stands for.
//!
//! Perfetto identifies tracks only by `TrackDescriptor.uuid`; two descriptors
//! with the same uuid are merged into one track, and uuid 0 means "no track"
//! (TrackEvent falls back to the thread/default track). Deriving the uuid from
//! (pid, starttime, name) keeps it stable across writer restarts and trace
//! files, and gives a reused pid (different starttime) a new track.
//!
//! The hash is FNV-1a followed by the splitmix64 finalizer: fixed by this
//! code, unlike std's DefaultHasher whose algorithm may change between Rust
//! releases.

use super::types::{ProcessKey, TrackUuid};

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

struct Hasher(u64);

impl Hasher {
    fn new(domain: &str) -> Self {
        let mut h = Self(FNV_OFFSET);
        h.bytes(domain.as_bytes());
        h
    }

    fn bytes(&mut self, bytes: &[u8]) -> &mut Self {
        // Length prefix so ("ab","c") and ("a","bc") differ.
        for b in (bytes.len() as u64).to_le_bytes().iter().chain(bytes) {
            self.0 ^= u64::from(*b);
            self.0 = self.0.wrapping_mul(FNV_PRIME);
        }
        self
    }

    fn u64(&mut self, v: u64) -> &mut Self {
        self.bytes(&v.to_le_bytes())
    }

    fn finish(&self) -> TrackUuid {
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        nonzero(z)
    }
}

fn nonzero(uuid: u64) -> TrackUuid {
    if uuid == 0 {
        1
    } else {
        uuid
    }
}

pub(crate) fn process_track(process: ProcessKey) -> TrackUuid {
    Hasher::new("vitalsd/process")
        .u64(process.pid as u32 as u64)
        .u64(process.starttime_ticks)
        .finish()
}

pub(crate) fn process_counter_track(process: ProcessKey, name: &str) -> TrackUuid {
    Hasher::new("vitalsd/process_counter")
        .u64(process.pid as u32 as u64)
        .u64(process.starttime_ticks)
        .bytes(name.as_bytes())
        .finish()
}

pub(crate) fn global_counter_track(name: &str) -> TrackUuid {
    Hasher::new("vitalsd/global_counter")
        .bytes(name.as_bytes())
        .finish()
}

/// The off-CPU track of thread `tid` (a capture's long blocks).
pub(crate) fn offcpu_thread_track(tid: u32) -> TrackUuid {
    Hasher::new("vitalsd/offcpu_thread")
        .u64(tid as u64)
        .finish()
}

/// A capture's blind-window track of `cpu`; None: their parent.
pub(crate) fn blind_window_track(cpu: Option<u32>) -> TrackUuid {
    Hasher::new("vitalsd/blind_window")
        .u64(cpu.map_or(u64::MAX, u64::from))
        .finish()
}

/// Next candidate after a (practically impossible) collision, deterministic
/// so the same sequence of requests always yields the same uuids.
pub(crate) fn rehash(uuid: TrackUuid, attempt: u64) -> TrackUuid {
    Hasher::new("vitalsd/rehash")
        .u64(uuid)
        .u64(attempt)
        .finish()
}
