//! Control requests: the manual captures and heap profiles the control
//! socket's thread hands to the main loop, started there (one of each at a
//! time) and answered with the new entry's id or why not.

use std::time::Duration;

use tokio::sync::oneshot;

use super::{
    heap::{heap_request, start_heap},
    Service,
};
use crate::{
    config::{Config, RecordingSpec},
    control::server::Command,
    event_set::EventSet,
    heapprofd::normalize_cmdline,
    store::TriggerInfo,
    triggers::SysfsProbe,
};

impl Service {
    /// Manual captures and heap profiles asked for on the control socket;
    /// each gets its reply (the new capture's id, or why not) right away.
    pub(super) fn serve_requests(&mut self) {
        while let Ok(cmd) = self.commands.try_recv() {
            match cmd {
                Command::Capture {
                    duration,
                    events,
                    offcpu_pids,
                    reply,
                } => self.manual_capture(duration, events, offcpu_pids, reply),
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
        events: EventSet,
        offcpu_pids: Option<Vec<u32>>,
        reply: oneshot::Sender<Result<String, String>>,
    ) {
        if self.capture.is_some() {
            let _ = reply.send(Err("a capture is already running (one at a time)".into()));
            return;
        }
        if offcpu_pids.as_ref().is_some_and(Vec::is_empty)
            && !self.cfg.capture.offcpu_watches_without_offender()
        {
            let _ = reply.send(Err("offcpu: no process to watch: give pids, or name \
                                    processes in the config's capture.offcpu_watch (or set \
                                    capture.offcpu_watch_all)"
                .into()));
            return;
        }
        if let Err(why) = self.admit_manual(false) {
            let _ = reply.send(Err(why));
            return;
        }
        let spec = RecordingSpec {
            duration: crate::config::Dur(duration),
            events,
            offcpu: offcpu_pids.is_some(),
            ..RecordingSpec::default()
        };
        let trigger = TriggerInfo {
            rule: "manual".into(),
            value: None,
            threshold: None,
            offender_pid: None,
            offender_name: None,
        };
        let pids = offcpu_pids.unwrap_or_default();
        let c = self.start_recording(self.recording_backend(), None, &spec, trigger, &pids);
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
        let target = match heap_target_allowed(&self.cfg, name.as_deref(), pid) {
            Ok(t) => t,
            Err(why) => {
                let _ = reply.send(Err(why));
                return;
            }
        };
        if let Err(why) = self.admit_manual(true) {
            let _ = reply.send(Err(why));
            return;
        }
        log::info!("manual heap profile of {target} admitted");
        let trigger = TriggerInfo {
            rule: "manual-heap".into(),
            value: None,
            threshold: None,
            offender_pid: pid.map(|p| p as i32),
            offender_name: name.clone(),
        };
        let installers = self.cfg.heapprofd.installers.clone();
        let request = heap_request(&self.cfg, name, pid, duration, installers);
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

    /// The device conditions and, for captures, the manual budget; the
    /// refusal names its reason.
    fn admit_manual(&mut self, heap: bool) -> Result<(), String> {
        let conditions = self.engine.conditions().clone();
        self.engine
            .admit_manual(crate::clock::boottime_ns(), &SysfsProbe(&conditions), heap)
            .map_err(|(reason, detail)| {
                log::info!("manual request refused: {} {detail}", reason.name());
                format!("refused: {} {detail}", reason.name())
                    .trim_end()
                    .to_owned()
            })
    }
}

/// The names a manual heap profile may target: `heapprofd.allowlist` and
/// every rule's `capture.heap_allowlist`, compared as heapprofd does
/// (normalised cmdline). A pid target is checked by its own cmdline.
fn heap_target_allowed(
    cfg: &Config,
    name: Option<&str>,
    pid: Option<u64>,
) -> Result<String, String> {
    let allowed: Vec<&str> = cfg
        .heapprofd
        .allowlist
        .iter()
        .chain(cfg.rules.iter().flat_map(|r| &r.capture.heap_allowlist))
        .map(|a| normalize_cmdline(a))
        .collect();
    let target = match (name, pid) {
        (Some(n), _) => normalize_cmdline(n).to_owned(),
        (None, Some(p)) => {
            let path = cfg.sampling.proc_root.join(format!("{p}/cmdline"));
            let cmdline = std::fs::read(&path)
                .map_err(|e| format!("heap profile of pid {p}: reading {}: {e}", path.display()))?;
            normalize_cmdline(&String::from_utf8_lossy(&cmdline)).to_owned()
        }
        (None, None) => return Err("heap profile: name a process or a pid".into()),
    };
    if allowed.contains(&target.as_str()) {
        Ok(target)
    } else if allowed.is_empty() {
        Err(format!(
            "heap profile of {target:?} refused: no process is allowlisted \
             (heapprofd.allowlist or a rule's capture.heap_allowlist)"
        ))
    } else {
        Err(format!(
            "heap profile of {target:?} refused: not on the allowlist ({})",
            allowed.join(", ")
        ))
    }
}
