//! vitalsd: an always-on CPU, scheduling and page-fault vitals daemon.
//!
//! One pipeline (`pipeline`) runs one room per kernel source (`sources`),
//! each owning its reading, its deltas, its counter tracks and its columns.

pub mod accounting;
pub mod android;
pub mod bpf;
pub mod clock;
pub mod config;
pub mod control;
pub mod event_set;
pub mod events;
pub mod export;
pub mod figures;
pub mod heapprofd;
pub mod history;
pub mod perfetto;
pub mod perfetto_capture;
#[cfg(feature = "producer")]
pub mod perfetto_sdk;
pub mod pipeline;
pub mod privileges;
pub mod process_tracks;
pub mod procfs;
#[cfg(feature = "producer")]
pub mod producer;
pub mod record;
pub mod recording_backend;
pub mod service;
pub mod snapshot;
pub mod sources;
pub mod store;
pub mod system;
pub mod tracker;
pub mod triggers;
