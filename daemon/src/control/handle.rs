//! The answers to requests other than `export` (streamed by the server):
//! each a typed reply of [`super::protocol`], serialized into its frame.

use std::time::Duration;

use serde::Serialize;
use tokio::sync::oneshot;

use super::{
    printable,
    protocol::{
        DaemonStatus, Deleted, DumpReply, Request, Response, Started, Status, StoreSummary,
    },
    shared::{Command, Shared},
};
use crate::{event_set::EventSet, store::Store};

/// The answer to `req`, serialized.
pub(super) async fn handle(req: Request, shared: &Shared) -> Vec<u8> {
    match req {
        Request::Status {} => frame(&Response::ok(status(shared))),
        Request::Top { n } => frame(&Response::ok(shared.state.top(n))),
        Request::Capture {
            duration_s,
            sched,
            faults,
            offcpu,
        } => {
            if !(duration_s.is_finite() && duration_s > 0.0 && duration_s <= 3600.0) {
                return refuse("duration_s must be in (0, 3600]");
            }
            if let Some(Err(e)) = offcpu.as_ref().map(|o| o.check(sched)) {
                return refuse(e);
            }
            frame(
                &ask_main_loop(shared, |reply| Command::Capture {
                    duration: Duration::from_secs_f64(duration_s),
                    events: EventSet { sched, faults },
                    offcpu_pids: offcpu.map(|o| o.pids),
                    reply,
                })
                .await,
            )
        }
        Request::Heap {
            name,
            pid,
            duration_s,
        } => {
            if !(duration_s.is_finite() && duration_s > 0.0 && duration_s <= 86400.0) {
                return refuse("duration_s must be in (0, 86400]");
            }
            frame(
                &ask_main_loop(shared, |reply| Command::Heap {
                    name,
                    pid,
                    duration: Duration::from_secs_f64(duration_s),
                    reply,
                })
                .await,
            )
        }
        Request::List {} => frame(&Response::ok(shared.store.lock().unwrap().list())),
        Request::Delete { id } => match shared.store.lock().unwrap().delete(&id) {
            Ok(()) => frame(&Response::ok(Deleted { deleted: id })),
            Err(e) => refuse(e),
        },
        Request::Config {} => frame(&Response::ok(shared.state.config())),
        Request::Dump {} => frame(&Response::ok(DumpReply {
            text: dump_text(shared),
        })),
        Request::Export { .. } => refuse("export is streamed"),
    }
}

fn frame<T: Serialize>(resp: &Response<T>) -> Vec<u8> {
    serde_json::to_vec(resp).unwrap_or_default()
}

fn refuse(e: impl std::fmt::Display) -> Vec<u8> {
    frame(&Response::<()>::err(e))
}

/// The answer to `status`.
fn status(shared: &Shared) -> Status {
    let daemon = shared.state.status();
    let store = store_summary(&shared.store.lock().unwrap());
    Status {
        daemon,
        control: shared.counters.read(),
        store,
    }
}

/// Hands a command to the main loop and answers with the id it returns.
async fn ask_main_loop(
    shared: &Shared,
    command: impl FnOnce(oneshot::Sender<Result<String, String>>) -> Command,
) -> Response<Started> {
    let (reply, rx) = oneshot::channel();
    if shared.commands.send(command(reply)).is_err() {
        return Response::err("daemon is shutting down");
    }
    match rx.await {
        Ok(Ok(id)) => Response::ok(Started { id }),
        Ok(Err(e)) => Response::err(e),
        Err(_) => Response::err("daemon is shutting down"),
    }
}

fn store_summary(store: &Store) -> StoreSummary {
    StoreSummary {
        dir: store.dir().to_owned(),
        captures: store.list().len(),
        bytes: store.total_trace_bytes(),
        newest: store.newest().map(|m| m.id.clone()),
        newest_path: store
            .newest()
            .and_then(|m| store.get(&m.id).ok().map(|(_, p)| p)),
        heapprofd_bytes: store.heapprofd_bytes(),
        counters: store.counters,
    }
}

/// The bugreport section (`vitalsctl dump`): plain text, stable headings.
pub(super) fn dump_text(shared: &Shared) -> String {
    let st = shared.state.status();
    let store = shared.store.lock().unwrap();
    render_dump(&st, &store)
}

fn render_dump(st: &DaemonStatus, store: &Store) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let _ = writeln!(s, "------ VITALSD (vitalsctl dump) ------");
    let _ =
        writeln!(
        s,
        "version {} up since {} ms (unix), {} samples at {} ms, faults from {}, capabilities {}",
        st.version, st.started_unix_ms, st.samples, st.interval_ms, st.fault_source, st.capabilities
    );
    let _ = writeln!(s, "accounting: {}", st.accounting);
    let _ = writeln!(
        s,
        "cpu local busy {:.1}%  loadavg {:?}",
        st.local_busy_pct.unwrap_or(f64::NAN),
        st.loadavg
    );
    if let Some(c) = &st.capture {
        let _ = writeln!(
            s,
            "capture running: {} (rule {}, {} ms)",
            c.id, c.rule, c.duration_ms
        );
    }
    let _ = writeln!(
        s,
        "triggers: fired {}, skipped {:?}",
        st.triggers_fired, st.triggers_skipped
    );
    let _ = writeln!(s, "recent triggers:");
    for t in &st.recent_triggers {
        let _ = writeln!(
            s,
            "  {} {} value={:?} threshold={:?} offender={} -> {}",
            t.unix_ms,
            printable(&t.rule),
            t.value,
            t.threshold,
            // A process names itself: its control characters would reach
            // the bugreport's reader raw, or forge a line of this section.
            printable(t.offender.as_deref().unwrap_or("-")),
            printable(&t.outcome.to_string())
        );
    }
    let _ = writeln!(
        s,
        "drops: bpf {:?} procfs {:?}; samples skipped by read errors {:?}",
        st.bpf_drops, st.procfs_drops, st.sample_errors
    );
    let _ = writeln!(
        s,
        "store {}: {} captures, {} bytes, counters {:?}",
        store.dir().display(),
        store.list().len(),
        store.total_trace_bytes(),
        store.counters
    );
    if let Some(m) = store.newest() {
        if let Ok((_, p)) = store.get(&m.id) {
            let _ = writeln!(
                s,
                "newest capture: {} ({} bytes, rule {})",
                p.display(),
                m.trace_bytes,
                m.trigger.rule
            );
        }
    }
    if let Some(e) = &st.last_reload_error {
        let _ = writeln!(s, "last config reload failed: {e}");
    }
    s
}
