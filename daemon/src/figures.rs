//! Named figures: what a source offers to history and the health rules,
//! as a small bounded record (figure → value) per sample and per process.
//! Each room declares its figures once (a `static Figure`) and fills them
//! in `Source::figures`; rules find them by name (`config::Metric::figure`),
//! history keeps the records, and the capture prelude reads them back.

/// One figure a room offers, declared once as a `static` in its room.
/// The name is what the rule table (`config::Metric::figure`) looks up.
#[derive(Debug, PartialEq, Eq)]
pub struct Figure {
    pub name: &'static str,
}

/// A bounded record of figures. `N` entries at most, 16 bytes each (a
/// pointer to the room's static declaration and the value), inline so a
/// history sample costs no allocation per record. A figure a room could
/// not read this window is absent, not zero.
#[derive(Debug, Clone, PartialEq)]
pub struct Figures<const N: usize> {
    entries: [Option<(&'static Figure, f64)>; N],
}

/// A sample's system-wide figures (busy %, loadavg raw and per CPU, six
/// PSI avg10: 9 today, one spare).
pub type SampleFigures = Figures<10>;
/// One kept process's figures (core-equivalent %, major faults/s, RSS,
/// the main thread's long blocks: 4, which keeps a history sample within
/// the hand-built one's memory, `history`'s size test).
pub type ProcessFigures = Figures<4>;

impl<const N: usize> Default for Figures<N> {
    fn default() -> Self {
        Self { entries: [None; N] }
    }
}

impl<const N: usize> Figures<N> {
    /// Sets `figure` (replacing an earlier value of it). The rooms' figures
    /// are fixed at build time and a unit test checks they fit, so a full
    /// record is a programming error: asserted in debug builds, and in
    /// release the figure is left out (logged) rather than growing.
    pub fn set(&mut self, figure: &'static Figure, value: f64) {
        let slot = self
            .entries
            .iter()
            .position(|e| e.is_some_and(|(f, _)| f.name == figure.name))
            .or_else(|| self.entries.iter().position(Option::is_none));
        match slot {
            Some(i) => self.entries[i] = Some((figure, value)),
            None => {
                debug_assert!(false, "figure record full: {}", figure.name);
                log::warn!("figure record full, {} left out", figure.name);
            }
        }
    }

    /// Sets `figure` when the room has a value for it this window.
    pub fn set_some(&mut self, figure: &'static Figure, value: Option<f64>) {
        if let Some(v) = value {
            self.set(figure, v);
        }
    }

    /// The value of the figure named `name`, if it was read.
    pub fn get(&self, name: &str) -> Option<f64> {
        self.entries
            .iter()
            .flatten()
            .find(|(f, _)| f.name == name)
            .map(|&(_, v)| v)
    }

    /// How many figures are set.
    pub fn len(&self) -> usize {
        self.entries.iter().flatten().count()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every figure set, in the order set.
    pub fn iter(&self) -> impl Iterator<Item = (&'static Figure, f64)> + '_ {
        self.entries.iter().flatten().copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    static A: Figure = Figure { name: "a" };
    static B: Figure = Figure { name: "b" };

    #[test]
    fn set_replaces_by_name_and_absent_stays_absent() {
        let mut f = Figures::<2>::default();
        f.set(&A, 1.0);
        f.set_some(&B, None);
        assert_eq!(f.get("b"), None);
        f.set(&A, 2.0);
        f.set(&B, 3.0);
        assert_eq!((f.get("a"), f.get("b"), f.len()), (Some(2.0), Some(3.0), 2));
    }

    /// An entry is a pointer and an f64: the niche of the reference holds
    /// the Option, so the record is 16 bytes per entry (history memory).
    #[test]
    fn an_entry_costs_16_bytes() {
        assert_eq!(std::mem::size_of::<ProcessFigures>(), 4 * 16);
        assert_eq!(std::mem::size_of::<SampleFigures>(), 10 * 16);
    }
}
