//! The event set: which kernel events a recording switches on in the
//! programs already running (the capture tier), carried as one type from
//! the request (control socket, a rule's `capture = { … }`, `vitalsd
//! record`'s flags) down to the programs' CAPTURE flag.
//!
//! The defaults, which differ by path (and are what users see today):
//! - a rule's `capture = { … }` that names neither `sched` nor `faults`
//!   (or a rule with no `capture` at all) records the CPU timeline:
//!   [`EventSet::RULE_DEFAULT`];
//! - `vitalsctl capture` and `vitalsd record` with neither `--sched` nor
//!   `--faults` switch no events on (a counters-only recording):
//!   [`EventSet::NONE`], the `Default`.
//!
//! The config file, the control socket's JSON and the CLI keep the names
//! `sched` and `faults`.

use serde::{Deserialize, Serialize};
use vitals_common::capture as cap;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventSet {
    /// Every sched_switch and sched_waking on every CPU (the CPU timeline).
    pub sched: bool,
    /// Sampled user page faults with their call stacks.
    pub faults: bool,
}

impl EventSet {
    /// No events: the recording has the always-on counters only.
    pub const NONE: Self = Self {
        sched: false,
        faults: false,
    };

    /// What a rule's capture records unless it says otherwise.
    pub const RULE_DEFAULT: Self = Self {
        sched: true,
        faults: false,
    };

    /// Whether any event is switched on.
    pub fn any(self) -> bool {
        self.sched || self.faults
    }

    /// The programs' CAPTURE flag (`vitals_common::capture::FLAG_*`).
    pub fn flags(self) -> u32 {
        (if self.sched { cap::FLAG_SCHED } else { 0 })
            | (if self.faults { cap::FLAG_FAULTS } else { 0 })
    }
}

#[cfg(test)]
mod tests {
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
}
