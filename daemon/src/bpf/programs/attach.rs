//! Attaching (or, with `PinMode::PinTo`, pinning) one program or all the
//! maps: what loading with aya and attaching bpfloader's pins share.

use std::path::Path;

use aya::{
    programs::{
        perf_event::{PerfEventConfig, PerfEventScope, SamplePolicy, SoftwareEvent},
        PerfEvent, TracePoint,
    },
    Ebpf,
};

use super::{
    super::{
        attach_err,
        object::{pinned_map_path, pinned_prog_path},
        program_err, BpfError,
    },
    program,
};

/// Loads `name` and attaches it, or with `pin_to` pins it there instead.
pub(super) fn attach_tracepoint(
    ebpf: &mut Ebpf,
    name: &'static str,
    category: &str,
    event: &str,
    pin_to: Option<&Path>,
) -> Result<(), BpfError> {
    let prog: &mut TracePoint = program(ebpf, name)?;
    prog.load().map_err(program_err(name))?;
    if let Some(dir) = pin_to {
        let path = pinned_prog_path(dir, name);
        return prog.pin(&path).map_err(|e| BpfError::Pin {
            path,
            message: e.to_string(),
        });
    }
    prog.attach(category, event)
        .map_err(attach_err(name, format!("tracepoint {category}/{event}")))?;
    Ok(())
}

/// One perf software event per online CPU with sample_period 1, so the
/// program runs on every counted fault, in the faulting task's context.
pub(super) fn attach_perf_sw(
    ebpf: &mut Ebpf,
    name: &'static str,
    event: SoftwareEvent,
    cpus: &[u32],
    pin_to: Option<&Path>,
) -> Result<(), BpfError> {
    let prog: &mut PerfEvent = program(ebpf, name)?;
    prog.load().map_err(program_err(name))?;
    if let Some(dir) = pin_to {
        let path = pinned_prog_path(dir, name);
        return prog.pin(&path).map_err(|e| BpfError::Pin {
            path,
            message: e.to_string(),
        });
    }
    attach_perf_on_cpus(prog, name, event, cpus, "")
}

/// Attaches a perf-event program to software `event` on every CPU of
/// `cpus`, counting every event (period 1); `whence` ends error messages
/// (" (pinned)" for bpfloader's programs). The one attach loop for the
/// loaded and the pinned fault programs.
pub(super) fn attach_perf_on_cpus(
    prog: &mut PerfEvent,
    name: &'static str,
    event: SoftwareEvent,
    cpus: &[u32],
    whence: &str,
) -> Result<(), BpfError> {
    for &cpu in cpus {
        prog.attach(
            PerfEventConfig::Software(event),
            PerfEventScope::AllProcessesOneCpu { cpu },
            SamplePolicy::Period(1),
            false,
        )
        .map_err(attach_err(
            name,
            format!("perf software event {event:?} on cpu {cpu}{whence}"),
        ))?;
    }
    Ok(())
}

/// Pins every map of `ebpf` in `dir` under bpfloader's names (`PinMode::PinTo`).
pub(super) fn pin_maps(ebpf: &Ebpf, dir: &Path) -> Result<(), BpfError> {
    // Internal maps (.rodata, .bss) stay with the programs that use
    // them; bpffs refuses names with a '.' anyway.
    for (name, map) in ebpf.maps().filter(|(n, _)| !n.starts_with('.')) {
        let path = pinned_map_path(dir, name);
        map.pin(&path).map_err(|e| BpfError::Pin {
            path: path.clone(),
            message: e.to_string(),
        })?;
    }
    log::info!(
        "eBPF programs and maps pinned in {} (not attached)",
        dir.display()
    );
    Ok(())
}
