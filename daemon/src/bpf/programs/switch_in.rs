//! The off-CPU capture's switch-in program, on `finish_task_switch`, the
//! first function a task runs in its own context after a switch
//! (kernel/sched/core.c): loaded with the tp_btf programs, attached only
//! while an off-CPU capture runs (`CaptureControl::
//! offcpu_user_at_switch_in`). fentry where the kernel finds the function
//! by its BTF name; else a kprobe. The function is static, and compilers
//! often specialise it (GCC's IPA-SRA names the copy
//! `finish_task_switch.isra.0`, which fentry cannot find by the BTF
//! name), so the kprobe takes the name /proc/kallsyms has, as bcc's
//! offwaketime does, looked up once at load. Neither (fentry refused and
//! CONFIG_KPROBES off, as on this project's CI host): captures walk user
//! stacks at the switch-out.

use std::{
    io::{BufRead, BufReader},
    path::Path,
};

use aya::{
    programs::{fentry::FEntryLinkId, kprobe::KProbeLinkId, FEntry, KProbe},
    Btf, Ebpf,
};
use vitals_common::names;

use super::{
    super::{
        attach_err,
        object::btf::{KernelBtf, SWITCH_IN_FUNC},
        BpfError,
    },
    program, program_err,
};

/// Which switch-in program loaded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum SwitchIn {
    Fentry,
    /// On `symbol`, finish_task_switch's name in kallsyms.
    Kprobe {
        symbol: String,
    },
}

/// Its link while a capture runs.
pub(crate) enum SwitchInLink {
    Fentry(FEntryLinkId),
    Kprobe(KProbeLinkId),
}

/// Loads (verifies) a switch-in program: fentry, else the kprobe. None
/// (logged) where neither loads.
pub(super) fn load(ebpf: &mut Ebpf, kernel_btf: Option<&KernelBtf>, btf: &Btf) -> Option<SwitchIn> {
    const FALLBACK: &str = "off-CPU captures take the user stack at each blocking switch-out";
    if kernel_btf.is_some_and(KernelBtf::has_switch_in_func) {
        let name = names::PROG_OFFCPU_SWITCH_IN_FENTRY;
        match program::<FEntry>(ebpf, name)
            .and_then(|p| p.load(SWITCH_IN_FUNC, btf).map_err(program_err(name)))
        {
            Ok(()) => return Some(SwitchIn::Fentry),
            // ENOENT where kallsyms has only a specialised copy.
            Err(e) => log::info!("{e}: trying a kprobe on {SWITCH_IN_FUNC}"),
        }
    }
    // A kernel without kprobes (CONFIG_KPROBES off) has no kprobe PMU,
    // which perf_event_open needs at every attach: say so once, here.
    if !Path::new(KPROBE_PMU).exists() {
        log::info!("no {KPROBE_PMU} (no kprobes): {FALLBACK}");
        return None;
    }
    // The name next: without one the kprobe is not worth verifying.
    let kallsyms = Path::new(KALLSYMS);
    let symbol = match finish_task_switch_symbol(kallsyms) {
        Ok(Some(s)) => s,
        Ok(None) => {
            log::info!(
                "{}: {FALLBACK}",
                BpfError::NoSymbol {
                    symbol: SWITCH_IN_FUNC,
                    path: kallsyms.into()
                }
            );
            return None;
        }
        Err(source) => {
            log::info!(
                "{}: {FALLBACK}",
                BpfError::Kallsyms {
                    path: kallsyms.into(),
                    source
                }
            );
            return None;
        }
    };
    let name = names::PROG_OFFCPU_SWITCH_IN;
    match program::<KProbe>(ebpf, name).and_then(|p| p.load().map_err(program_err(name))) {
        Ok(()) => Some(SwitchIn::Kprobe { symbol }),
        Err(e) => {
            log::info!("{e}: {FALLBACK}");
            None
        }
    }
}

const KALLSYMS: &str = "/proc/kallsyms";
/// The kprobe PMU aya's attach opens (its `type` file).
const KPROBE_PMU: &str = "/sys/bus/event_source/devices/kprobe";

/// Attaches the loaded switch-in program.
pub(super) fn attach(ebpf: &mut Ebpf, which: &SwitchIn) -> Result<SwitchInLink, BpfError> {
    match which {
        SwitchIn::Fentry => {
            let name = names::PROG_OFFCPU_SWITCH_IN_FENTRY;
            program::<FEntry>(ebpf, name)?
                .attach()
                .map(SwitchInLink::Fentry)
                .map_err(attach_err(name, "fentry/finish_task_switch"))
        }
        SwitchIn::Kprobe { symbol } => {
            let name = names::PROG_OFFCPU_SWITCH_IN;
            program::<KProbe>(ebpf, name)?
                .attach(symbol.as_str(), 0)
                .map(SwitchInLink::Kprobe)
                .map_err(attach_err(name, "kprobe/finish_task_switch"))
        }
    }
}

/// Detaches it (logged on failure: the link dies with the programs).
pub(super) fn detach(ebpf: &mut Ebpf, link: SwitchInLink) {
    let res = match link {
        SwitchInLink::Fentry(l) => {
            let name = names::PROG_OFFCPU_SWITCH_IN_FENTRY;
            program::<FEntry>(ebpf, name).and_then(|p| p.detach(l).map_err(program_err(name)))
        }
        SwitchInLink::Kprobe(l) => {
            let name = names::PROG_OFFCPU_SWITCH_IN;
            program::<KProbe>(ebpf, name).and_then(|p| p.detach(l).map_err(program_err(name)))
        }
    };
    if let Err(e) = res {
        log::warn!("detaching the switch-in program: {e}");
    }
}

/// The kernel's symbol for finish_task_switch in the kallsyms file at
/// `path` (`/proc/kallsyms`): the plain name if the kernel has it, else
/// its first compiler-specialised copy (`finish_task_switch.<suffix>`).
/// None if neither is there (then logged by the caller, and captures
/// walk user stacks at the switch-out). Read once, at load: ~200k lines,
/// through one reused line buffer.
pub(crate) fn finish_task_switch_symbol(path: &Path) -> Result<Option<String>, std::io::Error> {
    const NAME: &str = SWITCH_IN_FUNC;
    let mut file = BufReader::with_capacity(64 << 10, std::fs::File::open(path)?);
    let mut specialised = None;
    let mut line = String::new();
    loop {
        line.clear();
        if file.read_line(&mut line)? == 0 {
            break;
        }
        // "<address> <type> <name>[\t[<module>]]"; only the kernel's own
        // text (t/T), not a module's.
        let mut f = line.split_whitespace();
        let (Some(_), Some(kind), Some(name)) = (f.next(), f.next(), f.next()) else {
            continue;
        };
        if !kind.eq_ignore_ascii_case("t") || f.next().is_some() {
            continue;
        }
        if name == NAME {
            return Ok(Some(name.to_string()));
        }
        if specialised.is_none()
            && name
                .strip_prefix(NAME)
                .is_some_and(|rest| rest.starts_with('.'))
        {
            specialised = Some(name.to_string());
        }
    }
    Ok(specialised)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lookup(text: &str) -> Option<String> {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("kallsyms");
        std::fs::write(&p, text).unwrap();
        finish_task_switch_symbol(&p).unwrap()
    }

    #[test]
    fn the_plain_name_wins_over_a_specialised_copy() {
        let t = "ffffffff813ae3c0 t finish_task_switch.isra.0\n\
                 ffffffff813ae500 T finish_task_switch\n";
        assert_eq!(lookup(t).as_deref(), Some("finish_task_switch"));
    }

    #[test]
    fn a_specialised_copy_where_the_plain_name_is_gone() {
        let t = "ffffffff813ae000 t finish_task_switched_x\n\
                 ffffffff813ae3c0 t finish_task_switch.isra.0\n\
                 ffffffff813ae4c0 t finish_task_switch.isra.1\n";
        assert_eq!(lookup(t).as_deref(), Some("finish_task_switch.isra.0"));
    }

    #[test]
    fn data_symbols_modules_and_absence_give_none() {
        let t = "ffffffff82000000 d finish_task_switch\n\
                 ffffffffc0000000 t finish_task_switch\t[some_module]\n\
                 ffffffff813ae3c0 t schedule\n";
        assert_eq!(lookup(t), None);
    }

    #[test]
    fn this_kernel_has_one() {
        // Names are readable without CAP_SYSLOG (only addresses are hidden).
        assert!(finish_task_switch_symbol(Path::new("/proc/kallsyms"))
            .unwrap()
            .is_some_and(|s| s.starts_with("finish_task_switch")));
    }
}
