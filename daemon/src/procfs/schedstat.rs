//! /proc/<pid>/task/<tid>/schedstat: the scheduler's own per-task
//! accounting, "sum_exec_runtime run_delay pcount\n" (fs/proc/base.c
//! proc_pid_schedstat).
//!
//! - `sum_exec_runtime`: ns on a CPU, as `update_curr()` charges it (irq
//!   and steal time left out where the kernel accounts them); for a task
//!   on a CPU right now it lags by at most one tick (nothing here calls
//!   update_curr(), which stat's task_sched_runtime() does);
//! - `run_delay`: ns spent runnable on a runqueue, waiting for a CPU;
//! - `pcount`: times the task was switched *in* (sched_info_arrive).
//!
//! The file exists with CONFIG_SCHED_INFO (selected by SCHEDSTATS and by
//! TASK_DELAY_ACCT; GKI kernels have both). When sched_info is compiled in
//! but switched off the kernel prints "0 0 0": `run_delay` and `pcount`
//! are then unusable, which `probe` detects on the caller's own thread.

use std::path::Path;

use super::{fields, parse_u64, read_into, FileError, ParseError};

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Schedstat {
    pub sum_exec_runtime_ns: u64,
    pub run_delay_ns: u64,
    /// Switch-ins so far.
    pub timeslices: u64,
}

/// Parses the one line of a schedstat file. Extra fields (none today) are
/// ignored.
pub fn parse_schedstat(text: &[u8]) -> Result<Schedstat, ParseError> {
    let mut f = fields(text);
    let mut next = |name| parse_u64(name, f.next().ok_or(ParseError::MissingField(name))?);
    Ok(Schedstat {
        sum_exec_runtime_ns: next("sum_exec_runtime")?,
        run_delay_ns: next("run_delay")?,
        timeslices: next("pcount")?,
    })
}

/// Reads one schedstat file (`<root>/<pid>/task/<tid>/schedstat`, or a
/// process's `<root>/<pid>/schedstat`, which is its leader thread's).
pub fn read_schedstat(path: &Path, buf: &mut Vec<u8>) -> Result<Schedstat, FileError> {
    read_into(path, buf).map_err(|source| FileError::Read {
        path: path.to_owned(),
        source,
    })?;
    parse_schedstat(buf).map_err(|source| FileError::Parse {
        path: path.to_owned(),
        source,
    })
}

/// Why the kernel's per-task scheduler accounting cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SchedstatMissing {
    #[error(
        "{path} cannot be read ({error}): the kernel needs CONFIG_SCHED_INFO \
         (CONFIG_SCHEDSTATS or CONFIG_TASK_DELAY_ACCT)"
    )]
    NoFile { path: String, error: String },
    #[error(
        "{path} reads \"0 0 0\" for a thread that has run: sched_info is compiled in but off \
         (CONFIG_SCHED_INFO without schedstats or delay accounting enabled)"
    )]
    Disabled { path: String },
}

/// Checks, on the calling thread, that schedstat is present and live: a
/// thread that is running right now has been switched in at least once.
pub fn probe(proc_root: &Path) -> Result<Schedstat, SchedstatMissing> {
    let path = proc_root.join("thread-self/schedstat");
    let path_name = path.display().to_string();
    let mut buf = Vec::new();
    let s = read_schedstat(&path, &mut buf).map_err(|e| SchedstatMissing::NoFile {
        path: path_name.clone(),
        error: e.to_string(),
    })?;
    if s.timeslices == 0 {
        return Err(SchedstatMissing::Disabled { path: path_name });
    }
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_three_fields() {
        assert_eq!(
            parse_schedstat(b"1532894 20314 17\n"),
            Ok(Schedstat {
                sum_exec_runtime_ns: 1_532_894,
                run_delay_ns: 20_314,
                timeslices: 17
            })
        );
    }

    #[test]
    fn rejects_short_and_bad_text() {
        assert_eq!(
            parse_schedstat(b"12 34\n"),
            Err(ParseError::MissingField("pcount"))
        );
        assert!(parse_schedstat(b"12 x 3\n").is_err());
        assert!(parse_schedstat(b"").is_err());
    }

    /// The real kernel: this thread has been switched in, so its
    /// schedstat is live. (Its sum_exec_runtime can still read 0: unlike
    /// stat's task_sched_runtime(), schedstat does not bring a running
    /// task's runtime up to date; update_curr() does, at the next tick or
    /// switch.)
    #[test]
    fn probe_finds_this_kernels_schedstat() {
        let s = probe(Path::new("/proc")).expect("this kernel has schedstat");
        assert!(s.timeslices > 0);
    }

    #[test]
    fn probe_names_a_missing_file() {
        let dir = tempfile::tempdir().unwrap();
        let e = probe(dir.path()).unwrap_err();
        assert!(matches!(e, SchedstatMissing::NoFile { .. }), "{e}");
        assert!(e.to_string().contains("CONFIG_SCHED_INFO"), "{e}");
    }

    #[test]
    fn probe_names_switched_off_sched_info() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("thread-self")).unwrap();
        std::fs::write(dir.path().join("thread-self/schedstat"), "0 0 0\n").unwrap();
        let e = probe(dir.path()).unwrap_err();
        assert!(matches!(e, SchedstatMissing::Disabled { .. }), "{e}");
    }
}
