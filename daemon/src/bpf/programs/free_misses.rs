//! `free_missed`: runs of the sched_process_free program the kernel
//! skipped. A classic tracepoint program is skipped while `bpf_prog_active`
//! is raised on its CPU (`trace_call_bpf()`), which any process's map
//! syscall does; the RCU callback that frees a task may run right then, in
//! softirq. The skipped free leaves the task's counters in their slot, as
//! if it were alive. The kernel counts each skip in the program's
//! `recursion_misses` (Linux 5.12+, `bpf_prog_inc_misses_counter`), shown
//! in its fdinfo; reading that file is no bpf() call, so it opens no blind
//! window of its own. Before 5.12 the line is absent and nothing is
//! counted (README, Reliability).

use std::{
    os::fd::{AsFd, AsRawFd, OwnedFd},
    path::PathBuf,
};

/// The attached sched_process_free program, watched for skipped runs.
#[derive(Debug, Default)]
pub(crate) struct FreeMisses {
    /// A duplicate of the program's fd, so the fdinfo path stays valid
    /// whoever holds the program.
    fd: Option<OwnedFd>,
    /// The last figure read, kept when a read fails.
    last: u64,
    /// The kernel shows the count (5.12+), as of the last read.
    counted: bool,
    warned: bool,
}

impl FreeMisses {
    /// Watches the program behind `prog`; none (a count of 0) if its fd
    /// cannot be duplicated (EMFILE), which is logged.
    pub(crate) fn watch(prog: impl AsFd) -> Self {
        match prog.as_fd().try_clone_to_owned() {
            Ok(fd) => Self {
                fd: Some(fd),
                ..Self::default()
            },
            Err(e) => {
                log::warn!("free_missed not counted: duplicating sched_process_free's fd: {e}");
                Self::default()
            }
        }
    }

    fn fdinfo(&self) -> Option<PathBuf> {
        let fd = self.fd.as_ref()?;
        Some(PathBuf::from(format!(
            "/proc/self/fdinfo/{}",
            fd.as_raw_fd()
        )))
    }

    /// Whether the kernel counts the skips (the last `read` found them).
    pub(crate) fn counted(&self) -> bool {
        self.counted
    }

    /// The program's skipped runs so far (cumulative, like the DROPS
    /// counters).
    pub(crate) fn read(&mut self) -> u64 {
        let Some(path) = self.fdinfo() else {
            return 0;
        };
        match std::fs::read_to_string(&path) {
            Ok(text) => {
                // Absent before 5.12: nothing to count with.
                if let Some(n) = recursion_misses(&text) {
                    self.last = self.last.max(n);
                    self.counted = true;
                }
            }
            Err(e) if !self.warned => {
                self.warned = true;
                log::warn!("free_missed: reading {}: {e}", path.display());
            }
            Err(_) => {}
        }
        self.last
    }
}

/// The `recursion_misses:\t<n>` line of a program's fdinfo.
fn recursion_misses(fdinfo: &str) -> Option<u64> {
    fdinfo.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        (k.trim() == "recursion_misses").then(|| v.trim().parse().ok())?
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_kernels_recursion_misses_line() {
        // As 6.18 prints it (kernel/bpf/syscall.c, bpf_prog_show_fdinfo).
        let text = "pos:\t0\nflags:\t02000002\nmnt_id:\t16\nino:\t2074\n\
                    prog_type:\t5\nprog_jited:\t1\nprog_tag:\tf0ba435b1ad97e15\n\
                    memlock:\t4096\nprog_id:\t4391\nrun_time_ns:\t0\nrun_cnt:\t0\n\
                    recursion_misses:\t28\nverified_insns:\t173\n";
        assert_eq!(recursion_misses(text), Some(28));
        // 5.10 has no such line; a malformed figure counts as none.
        assert_eq!(recursion_misses("prog_id:\t1\nrun_cnt:\t0\n"), None);
        assert_eq!(recursion_misses("recursion_misses:\tlots\n"), None);
    }
}
