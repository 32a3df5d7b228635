//! When BPF is denied: telling a denial (no capability, bpf(2) refused,
//! no BPF in the kernel) from any other load error, so `vitalsd run` and
//! `record` can go on in a /proc-only mode instead of exiting, and saying
//! exactly what was refused.

use std::{error::Error as StdError, fmt, io};

use super::{Accounting, AccountingChoice, AccountingConfig, BpfError};

/// Why accounting is /proc-only.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProcOnly {
    /// Asked for (`accounting = "proc"`).
    Asked,
    /// BPF was denied: what was refused, e.g. "bpf(BPF_MAP_CREATE): EPERM
    /// (Operation not permitted)".
    Denied(String),
}

impl fmt::Display for ProcOnly {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProcOnly::Asked => write!(f, "proc-only (asked for: accounting = proc)"),
            ProcOnly::Denied(what) => write!(f, "proc-only (bpf denied: {what})"),
        }
    }
}

/// The counters a /proc-only mode does not have, for the trace and logs.
pub const PROC_ONLY_MISSING: &str = "on-CPU ns, runqueue wait, voluntary/involuntary switches and \
     eBPF fault counts per process, the eBPF drop counters, and captures";

/// What the CTS tier (schedstat, no eBPF) still lacks.
pub const CTS_MISSING: &str = "eBPF fault counts (entries, retries included) and the eBPF drop \
     counters; a thread's runqueue wait and switches after its last scan when it exits between \
     scans";

/// What `open` gives: the programs, or the /proc-only mode and why.
// Made once at start-up and moved once into its reader: boxing the
// handle would buy nothing.
#[allow(clippy::large_enum_variant)]
pub enum Opened {
    /// Loaded (or attached from pins) and counting.
    Ebpf(Accounting),
    /// No eBPF: asked for, or BPF denied (logged by the caller).
    ProcOnly(ProcOnly),
}

/// Opens the accounting programs as `cfg.choice` says. Both outcomes the
/// daemon and `record` run with are `Ok`, so a caller matches one enum
/// after one `?`; `Err` is left for what stops them: a load error that is
/// not a denial (a bad config, a missing tracepoint, a verifier rejection),
/// or any error under `AccountingChoice::Bpf`.
pub fn open(cfg: &AccountingConfig) -> Result<Opened, BpfError> {
    let choice = cfg.choice;
    if choice == AccountingChoice::Proc {
        return Ok(Opened::ProcOnly(ProcOnly::Asked));
    }
    match Accounting::load(cfg) {
        Ok(acc) => Ok(Opened::Ebpf(acc)),
        Err(e) if choice == AccountingChoice::Auto => match denial(&e) {
            Some(what) => Ok(Opened::ProcOnly(ProcOnly::Denied(what))),
            None => Err(e),
        },
        Err(e) => Err(e),
    }
}

/// What was refused, when `err` is a denial: the capability check (which
/// names the capabilities, and is confirmed by asking bpf(2) itself for
/// the errno), or EPERM/EACCES/ENOSYS from a syscall of the load. None
/// for anything else (a bad config, a missing tracepoint, a verifier
/// rejection), which stays an error.
pub fn denial(err: &BpfError) -> Option<String> {
    match err {
        BpfError::MissingCapabilities { missing, .. } => Some(match probe_bpf() {
            Err(e) => format!("bpf(BPF_MAP_CREATE): {}; no {missing}", errno_text(&e)),
            Ok(()) => format!(
                "no {missing}; bpf(BPF_MAP_CREATE) alone is allowed, loading tracing programs is not"
            ),
        }),
        BpfError::Unsupported(what) => Some(format!("no usable BPF in this kernel: {what}")),
        _ => {
            let io = denied_io_error(err)?;
            Some(format!("{err}: {}", errno_text(io)))
        }
    }
}

/// The first io::Error with a denial errno in `err`'s source chain.
fn denied_io_error<'a>(err: &'a (dyn StdError + 'static)) -> Option<&'a io::Error> {
    let mut cur: Option<&(dyn StdError + 'static)> = Some(err);
    while let Some(e) = cur {
        if let Some(io) = e.downcast_ref::<io::Error>() {
            if matches!(
                io.raw_os_error(),
                Some(libc::EPERM | libc::EACCES | libc::ENOSYS)
            ) {
                return Some(io);
            }
        }
        cur = e.source();
    }
    None
}

/// "EPERM (Operation not permitted)".
fn errno_text(e: &io::Error) -> String {
    let name = match e.raw_os_error() {
        Some(libc::EPERM) => "EPERM",
        Some(libc::EACCES) => "EACCES",
        Some(libc::ENOSYS) => "ENOSYS",
        Some(libc::EINVAL) => "EINVAL",
        _ => "errno",
    };
    let text = e.to_string();
    let text = text.split(" (os error").next().unwrap_or(&text);
    format!("{name} ({text})")
}

/// Asks the kernel for the smallest map (a one-entry array) and closes it:
/// the errno bpf(2) gives this process. EPERM without CAP_BPF while
/// kernel.unprivileged_bpf_disabled is set (Debian's and Android's
/// default), ENOSYS on a kernel built without CONFIG_BPF_SYSCALL.
fn probe_bpf() -> Result<(), io::Error> {
    // union bpf_attr's BPF_MAP_CREATE prefix: map_type, key_size,
    // value_size, max_entries, map_flags; the rest zero.
    let mut attr = [0u32; 30];
    attr[0] = 2; // BPF_MAP_TYPE_ARRAY
    attr[1] = 4;
    attr[2] = 4;
    attr[3] = 1;
    const BPF_MAP_CREATE: libc::c_long = 0;
    let fd = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_MAP_CREATE,
            attr.as_mut_ptr(),
            std::mem::size_of_val(&attr),
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    unsafe { libc::close(fd as i32) };
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn denials_are_told_from_other_errors() {
        let create = |errno| BpfError::Map {
            name: "TASKS",
            source: aya::maps::MapError::CreateError {
                name: "TASKS".into(),
                io_error: io::Error::from_raw_os_error(errno),
            },
        };
        let what = denial(&create(libc::EPERM)).expect("EPERM from bpf(2) is a denial");
        assert!(what.ends_with("EPERM (Operation not permitted)"), "{what}");
        assert!(what.contains("TASKS"), "{what}");
        assert_eq!(
            denial(&create(libc::EINVAL)),
            None,
            "EINVAL is a bug, not a denial"
        );
        assert_eq!(denial(&BpfError::NoFaultTracepoint), None);
        assert!(denial(&BpfError::Unsupported("no BTF".into())).is_some());
    }

    #[test]
    fn choice_parses_and_proc_is_never_loaded() {
        assert_eq!("proc".parse(), Ok(AccountingChoice::Proc));
        assert_eq!("auto".parse(), Ok(AccountingChoice::Auto));
        assert!("x".parse::<AccountingChoice>().is_err());
        let cfg = AccountingConfig {
            choice: AccountingChoice::Proc,
            ..Default::default()
        };
        match open(&cfg).unwrap() {
            Opened::ProcOnly(why) => assert_eq!(why, ProcOnly::Asked),
            Opened::Ebpf(_) => panic!("accounting = proc loaded eBPF"),
        }
    }
}
