//! A rule's prelude (`capture.prelude = "ring"`): a Perfetto session kept
//! running in a ring buffer (fill policy RING_BUFFER: the newest data
//! overwrites the oldest) and stopped by a Perfetto trigger when the rule
//! fires, so the capture holds the minutes before it fired and the
//! capture's duration after (the trigger's stop_delay_ms).
//!
//! traced ends a STOP_TRACING session whose trigger does not come within
//! trigger_timeout_ms without a trace; the daemon then starts another.
//! Triggers are activated through the consumer route: the `perfetto`
//! client shipped with Perfetto v58 has no `--trigger` flag, but runs a
//! TraceConfig holding only `activate_triggers` and exits (perfetto_cmd);
//! the in-process route asks the Perfetto SDK's producer
//! (PerfettoProducerActivateTriggers).

use std::{
    io::Write,
    process::{Command, Stdio},
    time::Duration,
};

use super::config::CaptureRequest;
use crate::{
    heapprofd::{config::encode, ConsumerRoute, RunnerConfig},
    perfetto::protos::{trace_config, TraceConfig},
};

/// How long a ring session waits for its trigger before traced ends it
/// (and the daemon starts a fresh one).
pub const TRIGGER_TIMEOUT: Duration = Duration::from_secs(3600);

/// The trigger a rule's ring session stops on.
pub fn trigger_name(rule: &str) -> String {
    format!("vitalsd.{}", sanitize(rule))
}

/// The ring session's unique_session_name: one per rule across vitalsd
/// instances.
pub fn session_name(rule: &str) -> String {
    format!("vitalsd_ring_{}", sanitize(rule))
}

fn sanitize(rule: &str) -> String {
    rule.chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect()
}

/// `req`'s capture as a ring kept until `rule`'s trigger, then
/// `req.duration` more.
pub fn ring_config(req: &CaptureRequest, rule: &str) -> TraceConfig {
    use trace_config::{buffer_config::FillPolicy, trigger_config};
    let mut c = req.trace_config();
    for b in &mut c.buffers {
        b.fill_policy = Some(FillPolicy::RingBuffer as i32);
    }
    // The trigger ends it, or its timeout.
    c.duration_ms = None;
    c.unique_session_name = Some(session_name(rule));
    c.trigger_config = Some(trace_config::TriggerConfig {
        trigger_mode: Some(trigger_config::TriggerMode::StopTracing as i32),
        triggers: vec![trigger_config::Trigger {
            name: Some(trigger_name(rule)),
            stop_delay_ms: Some(req.duration.as_millis().min(u128::from(u32::MAX)) as u32),
            ..Default::default()
        }],
        trigger_timeout_ms: Some(TRIGGER_TIMEOUT.as_millis() as u32),
        ..Default::default()
    });
    c
}

/// How long traced may run a ring session: until its trigger timeout, then
/// the stop delay.
pub fn session_ms(req: &CaptureRequest) -> u64 {
    (TRIGGER_TIMEOUT + req.duration).as_millis() as u64
}

/// Activates `name` with traced through `runner.consumer`; Err says why not.
pub fn activate(runner: &RunnerConfig, name: &str) -> Result<(), String> {
    match runner.consumer {
        ConsumerRoute::PerfettoClient => activate_with_client(runner, name),
        #[cfg(feature = "producer")]
        ConsumerRoute::InProcess => crate::perfetto_sdk::activate_trigger(name),
        #[cfg(not(feature = "producer"))]
        ConsumerRoute::InProcess => Err("in_process needs the `producer` feature".into()),
    }
}

/// `perfetto --config -` with a TraceConfig of only `activate_triggers`.
fn activate_with_client(runner: &RunnerConfig, name: &str) -> Result<(), String> {
    let bin = &runner.perfetto_bin;
    let config = TraceConfig {
        activate_triggers: vec![name.to_owned()],
        ..Default::default()
    };
    let mut child = Command::new(bin)
        .args(["--config", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("spawning {}: {e}", bin.display()))?;
    if let Some(mut stdin) = child.stdin.take() {
        let _ = stdin.write_all(&encode(&config));
    }
    let out = child
        .wait_with_output()
        .map_err(|e| format!("waiting for {}: {e}", bin.display()))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{} activating {name}: {}: {}",
            bin.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event_set::EventSet;

    #[test]
    fn a_ring_waits_for_its_rules_trigger_then_runs_the_capture_duration() {
        let req = CaptureRequest {
            duration: Duration::from_secs(10),
            events: EventSet {
                sched: true,
                faults: false,
            },
            max_bytes: 1 << 20,
            vitals_data_source: None,
            poll: Duration::from_secs(1),
            heap: None,
        };
        let c = ring_config(&req, "cpu busy");
        assert_eq!(c.duration_ms, None);
        assert_eq!(
            c.buffers[0].fill_policy,
            Some(trace_config::buffer_config::FillPolicy::RingBuffer as i32)
        );
        assert_eq!(
            c.unique_session_name.as_deref(),
            Some("vitalsd_ring_cpu_busy")
        );
        let t = c.trigger_config.unwrap();
        assert_eq!(
            t.trigger_mode,
            Some(trace_config::trigger_config::TriggerMode::StopTracing as i32)
        );
        assert_eq!(t.triggers[0].name.as_deref(), Some("vitalsd.cpu_busy"));
        assert_eq!(t.triggers[0].stop_delay_ms, Some(10_000));
        assert_eq!(t.trigger_timeout_ms, Some(3_600_000));
    }
}
