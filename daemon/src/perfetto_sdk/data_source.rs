//! The producer's data source through the SDK: its registration and
//! callbacks, and writing packets into traced's shared memory buffer.
//!
//! The SDK calls the callbacks on its own IPC thread; `DataSource::trace`
//! writes on the calling thread's per-instance writer.

use ::perfetto_sdk::data_source::{
    DataSource as SdkDataSource, DataSourceArgsBuilder, DataSourceBufferExhaustedPolicy,
    TraceContext, TraceContextBase,
};
use perfetto_sdk_sys::{PerfettoDsImplTracerIterator, PerfettoDsTracerImplGetDropCount};

pub use ::perfetto_sdk::data_source::DataSourceError;
/// A postponed flush, acknowledged when the guard drops.
pub use ::perfetto_sdk::data_source::FlushGuard;
/// Perfetto's async stop: the instance keeps writing until the guard drops.
pub use ::perfetto_sdk::data_source::StopGuard;

/// A callback the SDK runs on its IPC thread, with the instance's index.
pub type Callback<A> = Box<dyn FnMut(u32, A) + Send + Sync>;
/// The setup callback, with the instance's encoded DataSourceConfig.
pub type SetupCallback = Box<dyn FnMut(u32, &[u8]) + Send + Sync>;

/// What the data source does on the SDK's IPC thread, per instance index.
pub struct Callbacks {
    pub on_setup: SetupCallback,
    pub on_start: Callback<()>,
    /// Stop once `StopGuard` drops.
    pub on_stop: Callback<StopGuard>,
    /// Acknowledge the flush once `FlushGuard` drops.
    pub on_flush: Callback<FlushGuard>,
}

/// A registered data source.
pub struct DataSource {
    ds: SdkDataSource<'static>,
}

/// Connects to the system backend (PERFETTO_PRODUCER_SOCK_NAME, else the
/// platform's socket) and registers `name`. The SDK reconnects by itself
/// when traced restarts and registers the data source again.
pub fn register(name: &str, callbacks: Callbacks) -> Result<DataSource, DataSourceError> {
    super::init_system_backend();
    let Callbacks {
        mut on_setup,
        mut on_start,
        mut on_stop,
        mut on_flush,
    } = callbacks;
    let args = DataSourceArgsBuilder::new()
        // Never stall the writer (and so the producer thread) on a full
        // shared memory buffer: drop, and the drop count says so.
        .buffer_exhausted_policy(DataSourceBufferExhaustedPolicy::Drop)
        .will_notify_on_stop(true)
        // traced's incremental_state_config.clear_period_ms: we then write
        // the track descriptors and ProcessTree again, so a ring buffer that
        // overwrote them still decodes.
        .handles_incremental_state_clear(true)
        .on_setup(move |inst, ds_config, _| on_setup(inst, ds_config))
        .on_start(move |inst, _| on_start(inst, ()))
        .on_stop(move |inst, args| on_stop(inst, args.postpone()))
        .on_flush(move |inst, args| on_flush(inst, args.postpone()))
        .build();
    let mut ds = SdkDataSource::new();
    ds.register(name, args)?;
    Ok(DataSource { ds })
}

/// One instance's writer for the duration of a `trace` callback.
pub struct Sink<'c, 'a> {
    ctx: &'c mut TraceContext<'a>,
}

impl Sink<'_, '_> {
    /// Appends one encoded TracePacket (its fields, no length prefix).
    pub fn packet(&mut self, body: &[u8]) {
        self.ctx.add_packet(|p| p.msg.append_bytes(body));
    }

    /// How many times this writer dropped data because traced's shared
    /// memory buffer was full (the SDK counts entries into drop mode, not
    /// packets).
    pub fn drop_count(&self) -> u64 {
        let base: &TraceContextBase = self.ctx;
        // The safe crate keeps the tracer private and does not wrap
        // PerfettoDsTracerImplGetDropCount, so read the iterator it wraps.
        const _: () = assert!(
            std::mem::size_of::<TraceContextBase>()
                == std::mem::size_of::<PerfettoDsImplTracerIterator>()
        );
        // SAFETY: TraceContextBase's only field is the
        // PerfettoDsImplTracerIterator of this iteration (perfetto-sdk
        // 1.2.1, pinned in Cargo.toml; the size assertion above catches a
        // layout change), whose tracer is valid during the callback.
        unsafe {
            let it = &*(base as *const TraceContextBase as *const PerfettoDsImplTracerIterator);
            PerfettoDsTracerImplGetDropCount(it.tracer)
        }
    }

    /// Commits what this instance wrote, then releases `guard` (a stop or
    /// flush acknowledgement). Released at once rather than in the flush's
    /// completion callback: the SDK posts the commit and the
    /// acknowledgement to the same IPC task runner, in that order, so
    /// traced has the data first; and the callback never runs when traced
    /// went away, which would leave the instance slot stopping forever
    /// (the SDK's own data source example does the same).
    pub fn flush_then<G>(&mut self, guard: G) {
        self.ctx.flush(|| {});
        drop(guard);
    }
}

impl DataSource {
    /// Calls `f` for each active instance: its index, whether its
    /// incremental state was cleared since the last call (traced asked, or
    /// it is new), and its sink.
    pub fn trace(&self, mut f: impl FnMut(u32, bool, &mut Sink<'_, '_>)) {
        self.ds.trace(|ctx| {
            let inst = ctx.instance_index();
            let mut cleared = false;
            ctx.with_incremental_state(|_, state| {
                cleared = state.was_cleared;
                state.was_cleared = false;
            });
            f(inst, cleared, &mut Sink { ctx });
        });
    }
}
