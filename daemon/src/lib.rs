//! vitalsd: an always-on CPU, scheduling and page-fault vitals daemon.
//!
//! One module per kernel source or concern; `tracker` is the one place where
//! raw counters become per-window deltas.

pub mod accounting;
pub mod android;
pub mod bpf;
pub mod capture;
pub mod clock;
pub mod config;
pub mod control;
pub mod event_set;
pub mod export;
pub mod heapprofd;
pub mod history;
pub mod perfetto;
pub mod perfetto_capture;
#[cfg(feature = "producer")]
pub mod perfetto_sdk;
pub mod privileges;
pub mod process_tracks;
pub mod procfs;
#[cfg(feature = "producer")]
pub mod producer;
pub mod record;
pub mod sched_procfs;
pub mod service;
pub mod snapshot;
pub mod store;
pub mod system;
pub mod tracker;
pub mod triggers;
