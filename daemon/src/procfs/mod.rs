//! procfs readers, one per kernel file. Each takes an injectable root.
//!
//! Every reader is split in two: a pure parser over bytes (`parse_*`, fed
//! arbitrary input by the property tests) and a thin reader that does one
//! `open` + one `read` into a reused buffer and attaches the path to errors.
//! Nothing here computes deltas: that is the sources' job (`sources/`).

pub mod cmdline;
pub mod loadavg;
pub mod pid_stat;
pub mod pid_status;
pub mod pressure;
pub mod sampler;
pub mod schedstat;
pub mod stat;

#[cfg(test)]
pub(crate) mod testutil;

use std::io::{self, Read};
use std::path::{Path, PathBuf};

use thiserror::Error;

pub use cmdline::parse_cmdline;
pub use loadavg::{parse_loadavg, LoadAvg, LoadAvgError};
pub use pid_stat::{parse_pid_stat, Comm, PidStat};
pub use pid_status::{parse_ctxt_switches, parse_pid_status, CtxtSwitches, PidStatus};
pub use pressure::{parse_pressure, Pressure, PressureError, PsiRecord, PsiResource, PsiState};
pub use sampler::{
    scan_once, scan_repeat, ProcessSample, Sample, SampleOptions, Sampler, SamplerError,
    ScanCounts, ScanStats, ThreadSample,
};
pub use stat::{parse_stat, CpuTimes, StatError, SystemStat};

/// The default procfs mount point.
pub const DEFAULT_PROC_ROOT: &str = "/proc";

/// A procfs file that could not be read or parsed, with its path.
#[derive(Debug, Error)]
pub enum FileError {
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("parsing {path}: {source}")]
    Parse {
        path: PathBuf,
        #[source]
        source: ParseError,
    },
}

/// What went wrong inside a file's text. Shared by all parsers; each reader
/// wraps it with the path that failed.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ParseError {
    #[error("missing field {0}")]
    MissingField(&'static str),
    #[error("field {field} is not a number: {text:?}")]
    BadNumber { field: &'static str, text: String },
    #[error("malformed: {0}")]
    Malformed(&'static str),
}

pub(crate) fn bad_number(field: &'static str, text: &[u8]) -> ParseError {
    // Cap the copy: the input may be arbitrary bytes.
    let text = String::from_utf8_lossy(&text[..text.len().min(32)]).into_owned();
    ParseError::BadNumber { field, text }
}

/// Parses an unsigned decimal without going through `str` (procfs text is
/// ASCII; this keeps the hot path free of UTF-8 validation).
pub(crate) fn parse_u64(field: &'static str, text: &[u8]) -> Result<u64, ParseError> {
    if text.is_empty() {
        return Err(ParseError::MissingField(field));
    }
    let mut v: u64 = 0;
    for &b in text {
        if !b.is_ascii_digit() {
            return Err(bad_number(field, text));
        }
        v = v
            .checked_mul(10)
            .and_then(|v| v.checked_add(u64::from(b - b'0')))
            .ok_or_else(|| bad_number(field, text))?;
    }
    Ok(v)
}

/// Signed variant for fields the kernel prints with `%d` (pid, ppid).
pub(crate) fn parse_i64(field: &'static str, text: &[u8]) -> Result<i64, ParseError> {
    let (neg, digits) = match text.first() {
        Some(b'-') => (true, &text[1..]),
        _ => (false, text),
    };
    let v = parse_u64(field, digits)?;
    let v = i64::try_from(v).map_err(|_| bad_number(field, text))?;
    Ok(if neg { -v } else { v })
}

/// Is this I/O error the normal "the task went away" race? Between readdir
/// and open a process can exit (ENOENT), and once it is reaped reads of its
/// already-open files fail with ESRCH. Neither is an error of ours.
pub fn is_vanished(err: &io::Error) -> bool {
    matches!(err.raw_os_error(), Some(libc::ENOENT) | Some(libc::ESRCH))
}

/// Reads a whole procfs file into `buf` (cleared first) with one `read(2)`
/// in the common case.
///
/// The files read here are generated in one go by single_open/seq_file, which
/// fills the caller's buffer as far as it can: a short read means EOF. Only
/// when the buffer came back full do we grow it and read again, so the
/// buffer's capacity converges on the largest file and stays there.
pub fn read_into(path: &Path, buf: &mut Vec<u8>) -> io::Result<()> {
    let mut file = std::fs::File::open(path)?;
    buf.clear();
    if buf.capacity() < 4096 {
        buf.reserve(4096);
    }
    loop {
        let len = buf.len();
        let cap = buf.capacity();
        buf.resize(cap, 0);
        let n = match file.read(&mut buf[len..]) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {
                buf.truncate(len);
                continue;
            }
            Err(e) => {
                buf.truncate(len);
                return Err(e);
            }
        };
        buf.truncate(len + n);
        if n == 0 || len + n < cap {
            return Ok(());
        }
        buf.reserve(cap);
    }
}

/// How reading a task's file ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReadOutcome {
    Ok,
    /// The task exited meanwhile (ENOENT/ESRCH): normal, not an error.
    Vanished,
    /// Any other failure (EACCES under hidepid or SELinux, …), logged at
    /// debug with the path; the caller counts it.
    Failed,
}

/// Reads a task's procfs file into `buf`, telling a vanished task from a
/// failure: the one rule every per-task reader follows.
pub(crate) fn read_task_file(path: &Path, buf: &mut Vec<u8>) -> ReadOutcome {
    match read_into(path, buf) {
        Ok(()) => ReadOutcome::Ok,
        Err(e) if is_vanished(&e) => ReadOutcome::Vanished,
        Err(e) => {
            log::debug!("reading {}: {e}", path.display());
            ReadOutcome::Failed
        }
    }
}

/// A path under a procfs root, rebuilt for each file in one reused buffer:
/// a scan opens thousands of files, and none of them costs an allocation.
pub(crate) struct ProcPath {
    root_len: usize,
    buf: Vec<u8>,
}

impl ProcPath {
    pub(crate) fn new(root: &Path) -> Self {
        use std::os::unix::ffi::OsStrExt;
        let mut buf = Vec::with_capacity(256);
        buf.extend_from_slice(root.as_os_str().as_bytes());
        Self {
            root_len: buf.len(),
            buf,
        }
    }

    /// `<root><parts>`, e.g. `format_args!("/{pid}/stat")`.
    pub(crate) fn set(&mut self, parts: std::fmt::Arguments<'_>) -> &Path {
        use std::io::Write;
        self.buf.truncate(self.root_len);
        // Writing into a Vec<u8> cannot fail.
        let _ = self.buf.write_fmt(parts);
        self.get()
    }

    /// The path last set.
    pub(crate) fn get(&self) -> &Path {
        use std::os::unix::ffi::OsStrExt;
        Path::new(std::ffi::OsStr::from_bytes(&self.buf))
    }
}

/// Splits on ASCII whitespace (space, tab, newline), skipping empties.
pub(crate) fn fields(line: &[u8]) -> impl Iterator<Item = &[u8]> {
    line.split(|b| b.is_ascii_whitespace())
        .filter(|f| !f.is_empty())
}

#[cfg(test)]
mod tests;
