//! Dropping to the capabilities the steady state needs.
//!
//! Loading and attaching needs CAP_BPF + CAP_PERFMON (and CAP_SYS_ADMIN to
//! mount tracefs). Afterwards only map reads remain, and bpf(2) checks
//! CAP_BPF on every call while kernel.unprivileged_bpf_disabled is set (the
//! default on Android and Debian), so CAP_BPF stays. Everything else goes,
//! from every set including the bounding set, and no_new_privs is set so no
//! exec'd child can regain anything.

use caps::{CapSet, Capability, CapsHashSet};
use thiserror::Error;

#[derive(Debug, Error)]
pub enum PrivilegeError {
    #[error("capset({set:?}): {source}")]
    Caps {
        set: CapSet,
        #[source]
        source: caps::errors::CapsError,
    },
    #[error("prctl(PR_SET_NO_NEW_PRIVS): {0}")]
    NoNewPrivs(#[source] nix::Error),
}

/// The capabilities `vitalsd record` keeps after attaching. The service keeps
/// more ([`crate::service::DAEMON_CAPS`]: a capture attaches programs later),
/// and that is the set init/vitalsd.rc grants.
pub const STEADY_STATE_CAPS: &[Capability] = &[Capability::CAP_BPF];

/// Drops every capability not in `keep` and sets no_new_privs. Returns the
/// effective set afterwards.
pub fn drop_to(keep: &[Capability]) -> Result<CapsHashSet, PrivilegeError> {
    let keep: CapsHashSet = keep.iter().copied().collect();
    let err = |set| move |source| PrivilegeError::Caps { set, source };
    // Bounding set first: dropping from it needs CAP_SETPCAP, which is
    // itself about to go.
    for cap in caps::all() {
        if !keep.contains(&cap) && caps::has_cap(None, CapSet::Bounding, cap).unwrap_or(false) {
            caps::drop(None, CapSet::Bounding, cap).map_err(err(CapSet::Bounding))?;
        }
    }
    caps::clear(None, CapSet::Ambient).map_err(err(CapSet::Ambient))?;
    caps::clear(None, CapSet::Inheritable).map_err(err(CapSet::Inheritable))?;
    let permitted = caps::read(None, CapSet::Permitted).map_err(err(CapSet::Permitted))?;
    let kept: CapsHashSet = permitted.intersection(&keep).copied().collect();
    caps::set(None, CapSet::Effective, &kept).map_err(err(CapSet::Effective))?;
    caps::set(None, CapSet::Permitted, &kept).map_err(err(CapSet::Permitted))?;
    nix::sys::prctl::set_no_new_privs().map_err(PrivilegeError::NoNewPrivs)?;
    caps::read(None, CapSet::Effective).map_err(err(CapSet::Effective))
}

/// "CAP_BPF, CAP_PERFMON" style, sorted, for logs and the status output.
pub fn describe(set: &CapsHashSet) -> String {
    let mut v: Vec<String> = set.iter().map(|c| c.to_string()).collect();
    v.sort();
    if v.is_empty() {
        "(none)".into()
    } else {
        v.join(", ")
    }
}
