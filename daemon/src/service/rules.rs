//! Rule evaluation: each tick the health rules look at the history; a rule
//! that fires starts its capture, and a heap profile of its offender when
//! it asks for one (in the capture's own session on the Perfetto backend).

use super::{
    heap::{heap_in_capture, heap_profile_offender},
    recordings::{start_recording, RecordingEngine},
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
        let engine = self.recording_engine();
        let mut heap = None;
        if fired.capture.heap_profile {
            // One session where it can: heapprofd joins a Perfetto
            // capture's. A ring was built without heapprofd, and the eBPF
            // engine has no session to join: a session of its own.
            let joins = !from_ring && matches!(engine, RecordingEngine::Perfetto(_));
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
        self.capture = Some(start_recording(
            &self.cfg,
            engine,
            heap,
            &self.store,
            &self.history,
            &fired.capture,
            trigger,
            &self.shared,
        ));
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
