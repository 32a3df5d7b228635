//! Check 1d: the CTS tier against the compiled policy. The binary policies
//! that check 1b builds with AOSP's checkpolicy (platform policy +
//! `sepolicy/` as shipped, no platform change, user and userdebug) are
//! queried with setools' `sesearch`, not a parser of ours:
//!
//! - everything the CTS tier uses is granted: another domain's
//!   `/proc/<pid>/task/<tid>/{schedstat,status}` (r_dir_file on domain), its
//!   own, `/proc/stat`, `loadavg` and PSI, the traced consumer and producer
//!   sockets, and the exec into `perfetto` (the capture backend's client);
//! - nothing of the eBPF tier is: no `bpf` or `perf_event` permission, no
//!   `fs_bpf`, no tracefs. Each of these queries must find its rule in the
//!   eBPF tier's policy (`bpf-user.policy`), so none passes vacuously.

use std::{path::Path, process::Command};

use anyhow::{bail, Context, Result};

/// A query for rules whose source is vitalsd itself (`-ds`: no attribute
/// expansion on the source, so generic `domain` rules do not count as
/// grants of vitalsd's), as sesearch arguments, and what it is for.
struct Query {
    args: &'static [&'static str],
    what: &'static str,
}

/// What the CTS tier uses; each must match at least one rule.
const USES: &[Query] = &[
    Query {
        args: &[
            "-A",
            "-s",
            "vitalsd",
            "-t",
            "system_server",
            "-c",
            "file",
            "-p",
            "read,open",
        ],
        what: "another domain's /proc/<pid>/task/<tid>/{schedstat,status} (r_dir_file domain)",
    },
    Query {
        args: &[
            "-A",
            "-s",
            "vitalsd",
            "-t",
            "system_server",
            "-c",
            "dir",
            "-p",
            "search",
        ],
        what: "walking /proc/<pid>/task of another domain",
    },
    Query {
        args: &[
            "-A",
            "-s",
            "vitalsd",
            "-t",
            "vitalsd",
            "-c",
            "file",
            "-p",
            "read,open",
        ],
        what: "its own /proc/thread-self/schedstat (the start-up probe)",
    },
    Query {
        args: &[
            "-A",
            "-s",
            "vitalsd",
            "-t",
            "proc_stat",
            "-c",
            "file",
            "-p",
            "read,open",
        ],
        what: "/proc/stat",
    },
    Query {
        args: &[
            "-A",
            "-s",
            "vitalsd",
            "-t",
            "proc_pressure_cpu",
            "-c",
            "file",
            "-p",
            "read,open",
        ],
        what: "/proc/pressure/cpu",
    },
    Query {
        args: &[
            "-A",
            "-s",
            "vitalsd",
            "-t",
            "traced",
            "-c",
            "unix_stream_socket",
            "-p",
            "connectto",
        ],
        what: "connecting to traced (consumer and producer sockets)",
    },
    Query {
        args: &[
            "-A",
            "-s",
            "vitalsd",
            "-t",
            "traced_consumer_socket",
            "-c",
            "sock_file",
            "-p",
            "write",
        ],
        what: "/dev/socket/traced_consumer (the in-process capture and heapprofd route)",
    },
    Query {
        args: &[
            "-A",
            "-s",
            "vitalsd",
            "-t",
            "traced_producer_socket",
            "-c",
            "sock_file",
            "-p",
            "write",
        ],
        what: "/dev/socket/traced_producer (the linux.vitals data source)",
    },
    Query {
        args: &[
            "-A",
            "-s",
            "vitalsd",
            "-t",
            "perfetto_exec",
            "-c",
            "file",
            "-p",
            "execute",
        ],
        what: "exec'ing /system/bin/perfetto (the client capture route)",
    },
    Query {
        args: &[
            "-T",
            "-s",
            "vitalsd",
            "-t",
            "perfetto_exec",
            "-c",
            "process",
        ],
        what: "the transition into the perfetto domain, which keeps uid 1000",
    },
];

/// The eBPF tier's grants; none may match in the shipped policy, each must
/// match in the eBPF tier's.
const EBPF_ONLY: &[Query] = &[
    Query {
        args: &["-A", "-ds", "-s", "vitalsd", "-c", "bpf"],
        what: "bpf map reads and program runs",
    },
    Query {
        args: &["-A", "-ds", "-s", "vitalsd", "-t", "fs_bpf"],
        what: "bpffs pins",
    },
    Query {
        args: &["-A", "-ds", "-s", "vitalsd", "-c", "perf_event"],
        what: "perf events",
    },
    Query {
        args: &["-A", "-ds", "-s", "vitalsd", "-t", "debugfs_tracing"],
        what: "tracefs",
    },
];

/// The rules `q` finds in `policy` (one a line).
fn rules(q: &Query, policy: &Path) -> Result<Vec<String>> {
    let out = Command::new("sesearch")
        .args(q.args)
        .arg(policy)
        .output()
        .context("running sesearch (apt-get install -y setools)")?;
    if !out.status.success() {
        bail!(
            "sesearch {:?} {}: {}",
            q.args,
            policy.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(str::to_owned)
        .collect())
}

/// `work`: check 1b's directory, holding base-{user,userdebug}.policy and
/// bpf-user.policy.
pub fn check(work: &Path) -> Result<String> {
    let mut report = Vec::new();
    let mut failures = Vec::new();
    let ebpf_policy = work.join("bpf-user.policy");
    for q in EBPF_ONLY {
        if rules(q, &ebpf_policy)?.is_empty() {
            failures.push(format!(
                "the eBPF tier's policy has no rule for {} ({:?}): the query cannot tell",
                q.what, q.args
            ));
        }
    }
    for variant in ["user", "userdebug"] {
        let policy = work.join(format!("base-{variant}.policy"));
        for q in USES {
            if rules(q, &policy)?.is_empty() {
                failures.push(format!("{variant}: not granted: {} ({:?})", q.what, q.args));
            }
        }
        for q in EBPF_ONLY {
            let found = rules(q, &policy)?;
            if !found.is_empty() {
                failures.push(format!(
                    "{variant}: the shipped policy grants {} ({:?}): {found:?}",
                    q.what, q.args
                ));
            }
        }
        report.push(format!(
            "  {variant}: sesearch finds all {} grants the CTS tier uses and none of the {} \
             eBPF-tier ones (each found in the eBPF tier's policy)",
            USES.len(),
            EBPF_ONLY.len()
        ));
    }
    if !failures.is_empty() {
        bail!("{}", failures.join("\n"));
    }
    Ok(report.join("\n"))
}
