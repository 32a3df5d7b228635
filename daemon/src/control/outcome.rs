//! What came of a trigger (a rule that fired, or a manual request), as
//! `status` reports it in `recent_triggers[].outcome`. On the wire it is
//! the text it has always been (the variants' docs quote it); text this
//! version does not write reads as [`TriggerOutcome::Other`].

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TriggerOutcome {
    /// `captured <id>`, or `captured <id> (cut short: <error>)` when the
    /// recording failed part-way and what reached the disk was kept.
    Captured {
        id: String,
        cut_short: Option<String>,
    },
    /// `failed: <error>`, or `failed (<backend> backend): <error>`: nothing
    /// was stored.
    Failed {
        backend: Option<String>,
        error: String,
    },
    /// `heap profile <id> (usable)`, or `(see outcome)` when heapprofd's
    /// report in the entry's metadata says something went wrong.
    HeapProfile { id: String, usable: bool },
    /// `heap profile not stored: <why>`.
    HeapNotStored { why: String },
    /// `heap profile refused: <error>`: the session never started.
    HeapRefused { error: String },
    /// `heap profile failed: <why>` (its thread panicked).
    HeapFailed { why: String },
    /// `heap profile not started: <error>`: a rule's heap profile.
    HeapNotStarted { error: String },
    /// Any other text (another version of vitalsd), kept as is.
    Other(String),
}

impl TriggerOutcome {
    /// Reads the text the daemon writes; never fails (see [`Self::Other`]).
    pub fn parse(s: &str) -> Self {
        let text = |t: &str| t.to_owned();
        if let Some(rest) = s.strip_prefix("captured ") {
            let (id, cut_short) = match rest.split_once(" (cut short: ") {
                Some((id, e)) => match e.strip_suffix(')') {
                    Some(e) => (id, Some(text(e))),
                    None => return Self::Other(text(s)),
                },
                None => (rest, None),
            };
            if !id.contains(' ') {
                return Self::Captured {
                    id: text(id),
                    cut_short,
                };
            }
        }
        if let Some(error) = s.strip_prefix("failed: ") {
            return Self::Failed {
                backend: None,
                error: text(error),
            };
        }
        if let Some((backend, error)) = s
            .strip_prefix("failed (")
            .and_then(|r| r.split_once(" backend): "))
        {
            return Self::Failed {
                backend: Some(text(backend)),
                error: text(error),
            };
        }
        let heap = [
            ("heap profile not stored: ", 0),
            ("heap profile refused: ", 1),
            ("heap profile failed: ", 2),
            ("heap profile not started: ", 3),
        ];
        for (head, kind) in heap {
            if let Some(t) = s.strip_prefix(head) {
                return match kind {
                    0 => Self::HeapNotStored { why: text(t) },
                    1 => Self::HeapRefused { error: text(t) },
                    2 => Self::HeapFailed { why: text(t) },
                    _ => Self::HeapNotStarted { error: text(t) },
                };
            }
        }
        if let Some(rest) = s.strip_prefix("heap profile ") {
            for (tail, usable) in [(" (usable)", true), (" (see outcome)", false)] {
                if let Some(id) = rest.strip_suffix(tail).filter(|id| !id.contains(' ')) {
                    return Self::HeapProfile {
                        id: text(id),
                        usable,
                    };
                }
            }
        }
        Self::Other(text(s))
    }
}

impl std::fmt::Display for TriggerOutcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Captured { id, cut_short } => {
                write!(f, "captured {id}")?;
                match cut_short {
                    Some(e) => write!(f, " (cut short: {e})"),
                    None => Ok(()),
                }
            }
            Self::Failed {
                backend: None,
                error,
            } => write!(f, "failed: {error}"),
            Self::Failed {
                backend: Some(b),
                error,
            } => write!(f, "failed ({b} backend): {error}"),
            Self::HeapProfile { id, usable } => {
                let how = if *usable { "usable" } else { "see outcome" };
                write!(f, "heap profile {id} ({how})")
            }
            Self::HeapNotStored { why } => write!(f, "heap profile not stored: {why}"),
            Self::HeapRefused { error } => write!(f, "heap profile refused: {error}"),
            Self::HeapFailed { why } => write!(f, "heap profile failed: {why}"),
            Self::HeapNotStarted { error } => write!(f, "heap profile not started: {error}"),
            Self::Other(s) => f.write_str(s),
        }
    }
}

impl Serialize for TriggerOutcome {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for TriggerOutcome {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(Self::parse(&String::deserialize(d)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every outcome text the daemon wrote before outcomes were typed reads
    /// as its variant and writes back unchanged.
    #[test]
    fn outcome_texts_read_as_their_variants() {
        let id = "1700000000000-3-manual";
        let cases = [
            (
                format!("captured {id}"),
                TriggerOutcome::Captured {
                    id: id.into(),
                    cut_short: None,
                },
            ),
            (
                format!(
                    "captured {id} (cut short: writing: No space left on device (os error 28))"
                ),
                TriggerOutcome::Captured {
                    id: id.into(),
                    cut_short: Some("writing: No space left on device (os error 28)".into()),
                },
            ),
            (
                "failed: capture thread panicked".into(),
                TriggerOutcome::Failed {
                    backend: None,
                    error: "capture thread panicked".into(),
                },
            ),
            (
                "failed (perfetto backend): traced refused: x; y".into(),
                TriggerOutcome::Failed {
                    backend: Some("perfetto".into()),
                    error: "traced refused: x; y".into(),
                },
            ),
            (
                format!("heap profile {id} (usable)"),
                TriggerOutcome::HeapProfile {
                    id: id.into(),
                    usable: true,
                },
            ),
            (
                format!("heap profile {id} (see outcome)"),
                TriggerOutcome::HeapProfile {
                    id: id.into(),
                    usable: false,
                },
            ),
            (
                "heap profile not stored: client wrote nothing".into(),
                TriggerOutcome::HeapNotStored {
                    why: "client wrote nothing".into(),
                },
            ),
            (
                "heap profile refused: busy".into(),
                TriggerOutcome::HeapRefused {
                    error: "busy".into(),
                },
            ),
            (
                "heap profile failed: thread panicked".into(),
                TriggerOutcome::HeapFailed {
                    why: "thread panicked".into(),
                },
            ),
            (
                "heap profile not started: not allowlisted".into(),
                TriggerOutcome::HeapNotStarted {
                    error: "not allowlisted".into(),
                },
            ),
            (
                "skipped: cooldown".into(),
                TriggerOutcome::Other("skipped: cooldown".into()),
            ),
        ];
        for (text, outcome) in cases {
            let json = serde_json::to_string(&text).unwrap();
            assert_eq!(
                serde_json::from_str::<TriggerOutcome>(&json).unwrap(),
                outcome,
                "{text}"
            );
            assert_eq!(serde_json::to_string(&outcome).unwrap(), json);
        }
    }
}
