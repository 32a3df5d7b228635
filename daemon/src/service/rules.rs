//! Rule evaluation: each tick the health rules look at the history; a rule
//! that fires starts its capture, and a heap profile of its offender when
//! it asks for one (in the capture's own session on the Perfetto backend).

use super::{
    heap::{heap_in_capture, heap_profile_offender},
    Service,
};
use crate::{
    config::Prelude,
    store::TriggerInfo,
    triggers::{Fired, SysfsProbe},
};

impl Service {
    /// Evaluates the health rules on the history; a rule that fires starts
    /// its capture (and, if it asks, a heap profile of its offender).
    pub(super) fn evaluate_rules(&mut self) {
        let boottime = crate::clock::boottime_ns();
        let conditions = self.engine.conditions().clone();
        let Some(fired) = self.engine.evaluate(
            &self.history,
            boottime,
            self.capture.is_some(),
            &SysfsProbe(&conditions),
        ) else {
            return;
        };
        let trigger = trigger_info(&fired);
        // A ring session of this rule (its prelude) becomes the capture.
        let from_ring = fired.capture.prelude == Prelude::Ring
            && self.capture_from_ring(&fired.rule, &fired.capture, &trigger);
        let backend = self.recording_backend();
        let mut heap = None;
        if fired.capture.heap_profile {
            // One session where it can: heapprofd joins the capture's on
            // a backend that has one (Perfetto). A ring was built without
            // heapprofd, and the eBPF backend has no session to join: a
            // session of its own.
            let joins = !from_ring && backend.heap_in_session();
            if joins {
                heap = heap_in_capture(
                    &fired,
                    &self.cfg,
                    &self.runner,
                    &self.shared,
                    &trigger,
                    self.heap.is_some(),
                );
            } else {
                heap_profile_offender(
                    &fired,
                    &self.cfg,
                    &self.runner,
                    &self.store,
                    &self.shared,
                    &trigger,
                    &mut self.heap,
                );
            }
        }
        if from_ring {
            return;
        }
        // The process the rule fired for; none for a system-wide metric.
        let offender: Vec<u32> = trigger
            .offender_pid
            .and_then(|p| u32::try_from(p).ok())
            .into_iter()
            .collect();
        self.capture =
            Some(self.start_recording(backend, heap, &fired.capture, trigger, &offender));
    }
}

fn trigger_info(f: &Fired) -> TriggerInfo {
    TriggerInfo {
        rule: f.rule.clone(),
        value: Some(f.value),
        threshold: Some(f.threshold),
        offender_pid: f.offender.as_ref().map(|o| o.pid),
        offender_name: f.offender.as_ref().map(|o| o.name.clone()),
    }
}
