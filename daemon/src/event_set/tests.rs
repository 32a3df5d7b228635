use super::*;

#[test]
fn flags_are_the_programs_bits() {
    assert_eq!(EventSet::NONE.flags(), 0);
    assert!(!EventSet::NONE.any());
    let both = EventSet {
        sched: true,
        faults: true,
    };
    assert_eq!(both.flags(), cap::FLAG_SCHED | cap::FLAG_FAULTS);
    assert_eq!(EventSet::RULE_DEFAULT.flags(), cap::FLAG_SCHED);
    assert_eq!(
        EventSet {
            sched: false,
            faults: true
        }
        .flags(),
        cap::FLAG_FAULTS
    );
}

#[test]
fn the_default_is_no_events() {
    assert_eq!(EventSet::default(), EventSet::NONE);
}

/// `vitalsctl capture` with neither `--sched` nor `--faults` sends a
/// request naming neither: no events (a counters-only recording).
#[test]
fn a_capture_request_naming_neither_switches_no_events_on() {
    let r: crate::control::Request = serde_json::from_str(r#"{"cmd":"capture"}"#).unwrap();
    let crate::control::Request::Capture { sched, faults, .. } = r else {
        panic!("not a capture request: {r:?}");
    };
    assert_eq!(EventSet { sched, faults }, EventSet::NONE);
}
