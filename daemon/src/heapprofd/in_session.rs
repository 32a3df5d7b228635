//! A heap profile joining another Perfetto session (a recording's, on a
//! backend that has one) instead of a session of its own.

use super::{config::HEAPPROFD_DATA_SOURCE, HeapProfileRequest};
use crate::perfetto::protos::{trace_config, TraceConfig};

/// How long traced waits for the data sources' last flush.
pub const FLUSH_TIMEOUT_MS: u32 = 5_000;

/// A heap profile in the capture's own session: the request (its outcome
/// is read back against it) and the android.heapprofd data source of the
/// TraceConfig heapprofd/config.rs made of it.
#[derive(Debug, Clone)]
pub struct HeapInSession {
    pub request: HeapProfileRequest,
    pub data_source: trace_config::DataSource,
    /// How long traced waits for heapprofd's dump at the end.
    pub flush_timeout_ms: u32,
}

impl HeapInSession {
    /// From the request's own TraceConfig; None if it has no heapprofd
    /// data source.
    pub fn new(request: HeapProfileRequest, config: &TraceConfig) -> Option<Self> {
        let data_source = config
            .data_sources
            .iter()
            .find(|d| {
                d.config.as_ref().and_then(|c| c.name.as_deref()) == Some(HEAPPROFD_DATA_SOURCE)
            })?
            .clone();
        Some(Self {
            flush_timeout_ms: config.flush_timeout_ms.unwrap_or(FLUSH_TIMEOUT_MS),
            request,
            data_source,
        })
    }
}
