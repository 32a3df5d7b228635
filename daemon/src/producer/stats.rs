//! The producer's counters, for `vitalsctl status`.

use std::{
    collections::BTreeMap,
    sync::{
        atomic::{AtomicU64, Ordering},
        Mutex,
    },
};

/// Written by the producer's thread and the SDK's callbacks, read by the
/// main loop when it publishes.
#[derive(Debug, Default)]
pub struct Stats {
    /// Connections to traced after the first (traced restarted, the SDK
    /// reconnected); seen on our own socket, see `connection`.
    pub reconnects: AtomicU64,
    /// Times the connection to traced was seen lost.
    pub disconnects: AtomicU64,
    pub sessions_started: AtomicU64,
    pub sessions_stopped: AtomicU64,
    pub flushes: AtomicU64,
    pub packets_written: AtomicU64,
    /// Increases of the SDK writers' drop counts: traced's shared memory
    /// buffer was full and data was dropped rather than waited for.
    pub smb_drops: AtomicU64,
    /// Samples the producer's thread was too busy to take.
    pub ticks_dropped: AtomicU64,
    pub config_errors: AtomicU64,
    pub encode_errors: AtomicU64,
    pub last_error: Mutex<Option<String>>,
}

impl Stats {
    pub(super) fn config_error(&self, e: String) {
        self.config_errors.fetch_add(1, Ordering::Relaxed);
        *self.last_error.lock().unwrap() = Some(e);
    }

    pub(super) fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    /// Every counter by name.
    pub fn counters(&self) -> BTreeMap<String, u64> {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        BTreeMap::from([
            ("reconnects".into(), get(&self.reconnects)),
            ("disconnects".into(), get(&self.disconnects)),
            ("sessions_started".into(), get(&self.sessions_started)),
            ("sessions_stopped".into(), get(&self.sessions_stopped)),
            ("flushes".into(), get(&self.flushes)),
            ("packets_written".into(), get(&self.packets_written)),
            ("smb_drops".into(), get(&self.smb_drops)),
            ("ticks_dropped".into(), get(&self.ticks_dropped)),
            ("config_errors".into(), get(&self.config_errors)),
            ("encode_errors".into(), get(&self.encode_errors)),
        ])
    }
}
