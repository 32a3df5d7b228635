//! The recording backends the daemon has, and `capture.backend` resolved
//! against them: the one place that names a backend. A new backend is its
//! own room implementing [`RecordingBackend`] and one line in [`BACKENDS`].

use crate::{
    config::BackendChoice, perfetto_capture::backend::PerfettoBackend,
    record::backend::EbpfBackend, recording_backend::RecordingBackend,
};

/// In `auto`'s order of preference: the first available one is chosen.
static BACKENDS: &[&dyn RecordingBackend] = &[&EbpfBackend, &PerfettoBackend];

/// The backend a recording started now runs on, for a daemon that has
/// (`has_bpf`) eBPF accounting or not: `auto` takes the first available
/// (eBPF with eBPF accounting, else Perfetto); a named backend is taken
/// as asked (an eBPF recording /proc-only then fails, saying why).
pub(super) fn resolve(choice: BackendChoice, has_bpf: bool) -> &'static dyn RecordingBackend {
    let found = match choice.named() {
        Some(name) => BACKENDS.iter().find(|b| b.name() == name),
        None => BACKENDS.iter().find(|b| b.available(has_bpf)),
    };
    // The last registered backend is available everywhere (Perfetto).
    *found.unwrap_or(BACKENDS.last().expect("a registered backend"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(choice: BackendChoice, has_bpf: bool) -> &'static str {
        resolve(choice, has_bpf).name()
    }

    #[test]
    fn auto_is_ebpf_only_with_ebpf_accounting() {
        assert_eq!(name(BackendChoice::Auto, true), "ebpf");
        assert_eq!(name(BackendChoice::Auto, false), "perfetto");
        assert_eq!(name(BackendChoice::Perfetto, true), "perfetto");
        // An eBPF recording /proc-only: chosen, and it fails as such.
        assert_eq!(name(BackendChoice::Ebpf, false), "ebpf");
    }

    #[test]
    fn every_choice_names_a_registered_backend() {
        for choice in [BackendChoice::Ebpf, BackendChoice::Perfetto] {
            let asked = choice.named().unwrap();
            assert!(
                BACKENDS.iter().any(|b| b.name() == asked),
                "{asked} is not registered"
            );
        }
    }
}
