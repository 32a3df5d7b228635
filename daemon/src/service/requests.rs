//! Control requests: the manual captures and heap profiles the control
//! socket's thread hands to the main loop, started there (one of each at a
//! time) and answered with the new entry's id or why not.

use std::time::Duration;

use tokio::sync::oneshot;

use super::{
    captures::start_capture,
    heap::{heap_request, start_heap},
    Service,
};
use crate::{config::CaptureSpec, control::server::Command, store::TriggerInfo};

impl Service {
    /// Manual captures and heap profiles asked for on the control socket;
    /// each gets its reply (the new capture's id, or why not) right away.
    pub(super) fn serve_requests(&mut self) {
        while let Ok(cmd) = self.commands.try_recv() {
            match cmd {
                Command::Capture {
                    duration,
                    sched,
                    faults,
                    reply,
                } => self.manual_capture(duration, sched, faults, reply),
                Command::Heap {
                    name,
                    pid,
                    duration,
                    reply,
                } => self.manual_heap(name, pid, duration, reply),
            }
        }
    }

    pub(super) fn manual_capture(
        &mut self,
        duration: Duration,
        sched: bool,
        faults: bool,
        reply: oneshot::Sender<Result<String, String>>,
    ) {
        if self.capture.is_some() {
            let _ = reply.send(Err("a capture is already running (one at a time)".into()));
            return;
        }
        let spec = CaptureSpec {
            duration: crate::config::Dur(duration),
            sched,
            faults,
            ..CaptureSpec::default()
        };
        let trigger = TriggerInfo {
            rule: "manual".into(),
            value: None,
            threshold: None,
            offender_pid: None,
            offender_name: None,
        };
        let c = start_capture(
            &self.cfg,
            &self.accounting_cfg,
            &self.store,
            &self.history,
            &spec,
            trigger,
            &self.shared,
        );
        let _ = reply.send(Ok(c.pending.id.clone()));
        self.capture = Some(c);
    }

    pub(super) fn manual_heap(
        &mut self,
        name: Option<String>,
        pid: Option<u64>,
        duration: Duration,
        reply: oneshot::Sender<Result<String, String>>,
    ) {
        if self.heap.is_some() {
            let _ = reply.send(Err(
                "a heapprofd session is already running (one at a time)".into(),
            ));
            return;
        }
        let trigger = TriggerInfo {
            rule: "manual-heap".into(),
            value: None,
            threshold: None,
            offender_pid: pid.map(|p| p as i32),
            offender_name: name.clone(),
        };
        let request = heap_request(&self.cfg, name, pid, duration, Vec::new());
        match start_heap(&self.runner, &self.store, request, trigger, &self.shared) {
            Ok(h) => {
                let _ = reply.send(Ok(h.pending.id.clone()));
                self.heap = Some(h);
            }
            Err(e) => {
                let _ = reply.send(Err(e));
            }
        }
    }
}
