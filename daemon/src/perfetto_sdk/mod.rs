//! The one place that talks to the Perfetto C SDK (`perfetto-sdk`,
//! `perfetto-sdk-sys`, and our C++ shim in `daemon/cc/`); the rest of the
//! daemon uses the safe API here. Only with the `producer` feature, which
//! links the SDK.
//!
//! - [`init_system_backend`]: the SDK's one-per-process system backend;
//! - [`data_source`]: the producer's data source (registration, callbacks,
//!   writing packets into traced's shared memory buffer);
//! - [`session`]: a system tracing session where vitalsd is traced's
//!   consumer (the in-process heapprofd route);
//! - [`activate_trigger`]: a producer's trigger, for ring sessions;
//! - [`visit_fields`]: the SDK's protobuf decoder, for a DataSourceConfig.

pub mod data_source;
pub mod session;

use ::perfetto_sdk::{
    pb_decoder::{PbDecoder, PbDecoderField},
    producer::{Backends, Producer, ProducerInitArgsBuilder},
};

/// The shared memory buffer size we ask traced for. Our packets per
/// interval are small (changed counters only); traced may pick another size.
const SHMEM_SIZE_HINT_KB: u32 = 256;

/// Initialises the SDK with the system backend, once per process: the
/// producer, the in-process heapprofd consumer and the ring sessions'
/// triggers share it, and any may come first.
pub fn init_system_backend() {
    static INIT: std::sync::Once = std::sync::Once::new();
    INIT.call_once(|| {
        Producer::init(
            ProducerInitArgsBuilder::new()
                .backends(Backends::SYSTEM)
                .shmem_size_hint_kb(SHMEM_SIZE_HINT_KB)
                .build(),
        )
    });
}

/// The SDK's producer asks traced to activate `name` (traced accepts
/// triggers from producers; the call returns at once, the producer
/// connection sends it).
pub fn activate_trigger(name: &str) -> Result<(), String> {
    let name = std::ffi::CString::new(name).map_err(|e| format!("trigger name: {e}"))?;
    init_system_backend();
    let mut names = [name.as_ptr(), std::ptr::null()];
    // SAFETY: a NULL-terminated array of NUL-terminated strings, alive for
    // the call (the SDK copies them); 0: the SDK's default TTL.
    unsafe { perfetto_sdk_sys::PerfettoProducerActivateTriggers(names.as_mut_ptr(), 0) };
    Ok(())
}

/// Calls `f` with the id and bytes of each length-delimited field of the
/// encoded protobuf message `msg`, in order, through the SDK's decoder;
/// stops at `f`'s first error, or at a malformed field (`malformed` makes
/// the error from the decoder's words).
pub fn visit_fields<E>(
    msg: &[u8],
    mut f: impl FnMut(u32, &[u8]) -> Result<(), E>,
    malformed: impl Fn(String) -> E,
) -> Result<(), E> {
    for field in PbDecoder::new(msg) {
        if let (id, PbDecoderField::Delimited(bytes)) =
            field.map_err(|e| malformed(e.to_string()))?
        {
            f(id, bytes)?;
        }
    }
    Ok(())
}
