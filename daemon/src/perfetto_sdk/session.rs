//! A system tracing session of the Perfetto C SDK, where vitalsd is
//! traced's consumer: setup with TraceConfig bytes, start, flush, stop,
//! read back, and traced's stop and error callbacks.
//!
//! Owned here rather than through perfetto-sdk 1.2.1's `TracingSession`,
//! which wraps neither the stop callback nor an empty read soundly, and
//! gives no access to its session pointer for the calls it lacks:
//! - perfetto-sdk's read_trace_blocking makes a slice of the NULL pointer
//!   the SDK passes for an empty read, which aborts a debug build (UB in
//!   release): we call PerfettoTracingSessionReadTraceBlocking ourselves;
//! - the C API does not pass traced's reason for ending a session on, so a
//!   C++ shim (cc/perfetto_session_error.cc) sets the C++ API's error
//!   callback on the same session.
//!
//! Every call may block for as long as traced does not answer (the SDK's
//! TracingMuxerImpl waits on its IPC thread): callers run them on a thread
//! of their own.

use std::{
    ffi::{c_char, c_void},
    time::Duration,
};

use perfetto_sdk_sys::{
    PerfettoTracingSessionDestroy, PerfettoTracingSessionFlushBlocking, PerfettoTracingSessionImpl,
    PerfettoTracingSessionReadTraceBlocking, PerfettoTracingSessionSetStopCb,
    PerfettoTracingSessionSetup, PerfettoTracingSessionStartBlocking,
    PerfettoTracingSessionStopBlocking, PerfettoTracingSessionSystemCreate,
};

unsafe extern "C" {
    /// cc/perfetto_session_error.cc: TracingSession::SetOnErrorCallback.
    fn VitalsPerfettoTracingSessionSetErrorCb(
        session: *mut PerfettoTracingSessionImpl,
        cb: Option<unsafe extern "C" fn(*mut c_void, u32, *const c_char, usize)>,
        user_arg: *mut c_void,
    );
}

type OnStop = Box<dyn FnOnce() + Send>;
type OnError = Box<dyn FnOnce(String) + Send>;

/// Runs on the SDK's thread when traced ended the session.
unsafe extern "C" fn on_traced_stop(_: *mut PerfettoTracingSessionImpl, user_arg: *mut c_void) {
    // SAFETY: user_arg is the Box<OnStop> leaked by on_stop; the SDK moves
    // the stop callback out before it runs it
    // (ConsumerImpl::NotifyStopComplete), so this runs at most once. A
    // session traced never stops leaks the closure: a few bytes.
    let f = unsafe { Box::from_raw(user_arg as *mut OnStop) };
    f();
}

/// Runs on the SDK's thread when traced ends the session with an error.
unsafe extern "C" fn on_traced_error(
    user_arg: *mut c_void,
    _code: u32,
    message: *const c_char,
    len: usize,
) {
    // SAFETY: user_arg is the Box<OnError> leaked by on_error; the SDK
    // moves the error callback out before it runs it
    // (ConsumerImpl::NotifyError), so this runs at most once. A session
    // that ends without an error leaks the closure: a few bytes.
    let f = unsafe { Box::from_raw(user_arg as *mut OnError) };
    let text = if message.is_null() {
        String::new()
    } else {
        // SAFETY: the shim passes the error string's `len` bytes, valid
        // during the call.
        let bytes = unsafe { std::slice::from_raw_parts(message as *const u8, len) };
        String::from_utf8_lossy(bytes).into_owned()
    };
    f(text);
}

/// Runs on the SDK's thread for each part of the trace read back.
unsafe extern "C" fn on_read<F: FnMut(&[u8], bool)>(
    _: *mut PerfettoTracingSessionImpl,
    data: *const c_void,
    size: usize,
    has_more: bool,
    user_arg: *mut c_void,
) {
    // SAFETY: user_arg is read_blocking's &mut F, alive until
    // PerfettoTracingSessionReadTraceBlocking returns, which it does only
    // after the has_more = false call (and no call follows that one); the
    // calls come one after another on the SDK's thread.
    let f = unsafe { &mut *(user_arg as *mut F) };
    // The SDK passes NULL, 0 for an empty read (traced refused the
    // session, or the consumer is gone): perfetto-sdk's own trampoline
    // makes a slice of that, which aborts a debug build.
    let bytes: &[u8] = if data.is_null() || size == 0 {
        &[]
    } else {
        // SAFETY: the SDK's buffer of `size` bytes, valid during the call.
        unsafe { std::slice::from_raw_parts(data as *const u8, size) }
    };
    f(bytes, has_more);
}

/// A system tracing session (the consumer side), destroyed on drop.
pub struct TracingSession(*mut PerfettoTracingSessionImpl);

impl TracingSession {
    /// A session with traced through the system backend (call
    /// [`super::init_system_backend`] first); None when the backend cannot
    /// make one.
    pub fn system() -> Option<Self> {
        // SAFETY: no preconditions; NULL when the backend cannot make one.
        let p = unsafe { PerfettoTracingSessionSystemCreate() };
        (!p.is_null()).then_some(Self(p))
    }

    /// PerfettoTracingSessionSetStopCb: `f` runs (once, on the SDK's
    /// thread) when traced ends the session. Set before start.
    pub fn on_stop(&mut self, f: impl FnOnce() + Send + 'static) {
        let arg = Box::into_raw(Box::new(Box::new(f) as OnStop)) as *mut c_void;
        // SAFETY: a live session; the SDK keeps the callback with the
        // session's consumer and calls it at most once (on_traced_stop).
        unsafe { PerfettoTracingSessionSetStopCb(self.0, Some(on_traced_stop), arg) };
    }

    /// The C++ API's error callback (through the shim): `f` gets traced's
    /// reason (once, on the SDK's thread) when it ends the session with
    /// one. Set before start.
    pub fn on_error(&mut self, f: impl FnOnce(String) + Send + 'static) {
        let arg = Box::into_raw(Box::new(Box::new(f) as OnError)) as *mut c_void;
        // SAFETY: a live session, a perfetto::TracingSession as the shim
        // expects (PerfettoTracingSessionSystemCreate); the SDK keeps the
        // callback with the session's consumer and calls it at most once.
        unsafe { VitalsPerfettoTracingSessionSetErrorCb(self.0, Some(on_traced_error), arg) };
    }

    /// `config`: an encoded TraceConfig (the SDK copies it).
    pub fn setup(&mut self, config: &[u8]) {
        // SAFETY: a live session; the SDK reads `config` during the call.
        unsafe {
            PerfettoTracingSessionSetup(self.0, config.as_ptr() as *mut c_void, config.len())
        };
    }

    pub fn start_blocking(&mut self) {
        // SAFETY: a live session.
        unsafe { PerfettoTracingSessionStartBlocking(self.0) };
    }

    /// Zero: the TraceConfig's flush_timeout_ms.
    pub fn flush_blocking(&mut self, timeout: Duration) {
        let ms = timeout.as_millis().min(u128::from(u32::MAX)) as u32;
        // SAFETY: a live session.
        unsafe { PerfettoTracingSessionFlushBlocking(self.0, ms) };
    }

    /// Returns at once when traced already ended the session.
    pub fn stop_blocking(&mut self) {
        // SAFETY: a live session.
        unsafe { PerfettoTracingSessionStopBlocking(self.0) };
    }

    /// PerfettoTracingSessionReadTraceBlocking: `f` gets the trace in
    /// parts, on the SDK's thread, with whether more follows (the last call
    /// has false; an empty read is one empty part). Returns once the SDK
    /// has read everything.
    pub fn read_blocking<F: FnMut(&[u8], bool) + Send>(&mut self, mut f: F) {
        let arg = &mut f as *mut F as *mut c_void;
        // SAFETY: a live session; `f` outlives the blocking call (on_read).
        unsafe { PerfettoTracingSessionReadTraceBlocking(self.0, Some(on_read::<F>), arg) };
    }
}

impl Drop for TracingSession {
    fn drop(&mut self) {
        // SAFETY: created by PerfettoTracingSessionSystemCreate, destroyed
        // once.
        unsafe { PerfettoTracingSessionDestroy(self.0) };
    }
}
