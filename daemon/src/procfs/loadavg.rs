//! /proc/loadavg: "0.87 0.55 0.26 3/94 9719".
//!
//! Parsed by `procfs::LoadAverage`, which handles this format correctly and
//! returns errors (never panics) on bad input; we only feed it our buffer so
//! the read stays a single syscall.

use std::path::{Path, PathBuf};

use procfs::FromRead;
use thiserror::Error;

use super::read_into;

#[derive(Debug, Error)]
pub enum LoadAvgError {
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("parsing {path}: {message}")]
    Parse { path: PathBuf, message: String },
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LoadAvg {
    pub load1: f32,
    pub load5: f32,
    pub load15: f32,
    /// 4th field, before '/': runnable scheduling entities (threads), not
    /// processes.
    pub runnable_tasks: u32,
    /// 4th field, after '/': all threads on the system.
    pub total_tasks: u32,
    /// 5th field: the pid most recently handed out.
    pub last_pid: u32,
}

/// Parses the text of /proc/loadavg; the error is procfs's message.
pub fn parse_loadavg(text: &[u8]) -> Result<LoadAvg, String> {
    let l = procfs::LoadAverage::from_read(text).map_err(|e| e.to_string())?;
    Ok(LoadAvg {
        load1: l.one,
        load5: l.five,
        load15: l.fifteen,
        runnable_tasks: l.cur,
        total_tasks: l.max,
        last_pid: l.latest_pid,
    })
}

pub fn read_loadavg(proc_root: &Path, buf: &mut Vec<u8>) -> Result<LoadAvg, LoadAvgError> {
    let path = proc_root.join("loadavg");
    if let Err(source) = read_into(&path, buf) {
        return Err(LoadAvgError::Read { path, source });
    }
    parse_loadavg(buf).map_err(|message| LoadAvgError::Parse { path, message })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fourth_field_is_tasks_fifth_last_pid() {
        let l = parse_loadavg(b"0.87 0.55 0.26 3/94 9719\n").unwrap();
        assert_eq!((l.runnable_tasks, l.total_tasks, l.last_pid), (3, 94, 9719));
        assert!((l.load1 - 0.87).abs() < 1e-6);
        assert!((l.load15 - 0.26).abs() < 1e-6);
    }

    #[test]
    fn truncated_is_an_error() {
        assert!(parse_loadavg(b"0.87 0.55 0.26 3/").is_err());
        assert!(parse_loadavg(b"").is_err());
    }
}
