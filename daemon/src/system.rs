//! Facts about the running kernel and machine that every reader needs.
//!
//! USER_HZ and the page size come from sysconf, never from constants: Android
//! devices ship 16 KiB pages, and USER_HZ is a per-architecture ABI value.

use std::path::{Path, PathBuf};

use thiserror::Error;

#[derive(Debug, Error)]
pub enum SystemError {
    #[error("sysconf({name}) failed: {source}")]
    Sysconf {
        name: &'static str,
        #[source]
        source: nix::Error,
    },
    #[error("sysconf({name}) is not supported on this system")]
    SysconfMissing { name: &'static str },
    #[error("uname(2) failed: {0}")]
    Uname(#[source] nix::Error),
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: malformed CPU list {text:?}")]
    CpuList { path: PathBuf, text: String },
}

fn sysconf(var: nix::unistd::SysconfVar, name: &'static str) -> Result<u64, SystemError> {
    match nix::unistd::sysconf(var) {
        Ok(Some(v)) if v > 0 => Ok(v as u64),
        Ok(_) => Err(SystemError::SysconfMissing { name }),
        Err(source) => Err(SystemError::Sysconf { name, source }),
    }
}

/// USER_HZ: the unit of the tick counters in /proc/stat and /proc/<pid>/stat.
pub fn clock_ticks_per_second() -> Result<u64, SystemError> {
    sysconf(nix::unistd::SysconfVar::CLK_TCK, "_SC_CLK_TCK")
}

/// Page size in bytes (4 KiB or 16 KiB on Android arm64).
pub fn page_size_bytes() -> Result<u64, SystemError> {
    sysconf(nix::unistd::SysconfVar::PAGE_SIZE, "_SC_PAGESIZE")
}

/// The kernel's utsname, as SystemInfo wants it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Utsname {
    pub sysname: String,
    pub release: String,
    pub version: String,
    pub machine: String,
}

pub fn utsname() -> Result<Utsname, SystemError> {
    let u = nix::sys::utsname::uname().map_err(SystemError::Uname)?;
    Ok(Utsname {
        sysname: u.sysname().to_string_lossy().into_owned(),
        release: u.release().to_string_lossy().into_owned(),
        version: u.version().to_string_lossy().into_owned(),
        machine: u.machine().to_string_lossy().into_owned(),
    })
}

/// Hands freed heap pages back to the kernel. Start-up parses vmlinux BTF
/// (tens of MiB of short-lived allocations); without this the daemon's
/// resident set stays at that high-water mark although the memory is free.
pub fn release_free_heap() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim only walks the allocator's own free lists.
    unsafe {
        libc::malloc_trim(0);
    }
    #[cfg(target_os = "android")]
    {
        // bionic's malloc.h: M_PURGE (-101), API 28+. Not in the libc crate.
        extern "C" {
            fn mallopt(param: libc::c_int, value: libc::c_int) -> libc::c_int;
        }
        // SAFETY: a documented bionic call with a constant argument.
        unsafe {
            mallopt(-101, 0);
        }
    }
}

/// Parses the kernel's CPU list format ("0-3,5,7-8") as used by
/// /sys/devices/system/cpu/{possible,online}.
pub fn parse_cpu_list(text: &str) -> Option<Vec<u32>> {
    let mut cpus = Vec::new();
    for part in text.trim().split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (u32, u32) = (a.parse().ok()?, b.parse().ok()?);
                if a > b {
                    return None;
                }
                cpus.extend(a..=b);
            }
            None => cpus.push(part.parse().ok()?),
        }
    }
    Some(cpus)
}

fn read_cpu_list(path: &Path) -> Result<Vec<u32>, SystemError> {
    let text = std::fs::read_to_string(path).map_err(|source| SystemError::Read {
        path: path.to_owned(),
        source,
    })?;
    parse_cpu_list(&text).ok_or_else(|| SystemError::CpuList {
        path: path.to_owned(),
        text,
    })
}

/// CPUs that can ever be brought online. Per-CPU BPF map values are sized by
/// this set, not by the online set, which changes with hotplug.
pub fn possible_cpus(sysfs_root: &Path) -> Result<Vec<u32>, SystemError> {
    read_cpu_list(&sysfs_root.join("devices/system/cpu/possible"))
}

/// CPUs online right now.
pub fn online_cpus(sysfs_root: &Path) -> Result<Vec<u32>, SystemError> {
    read_cpu_list(&sysfs_root.join("devices/system/cpu/online"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists() {
        assert_eq!(
            parse_cpu_list("0-3,5,7-8\n"),
            Some(vec![0, 1, 2, 3, 5, 7, 8])
        );
        assert_eq!(parse_cpu_list("0\n"), Some(vec![0]));
        assert_eq!(parse_cpu_list("3-1"), None);
        assert_eq!(parse_cpu_list("x"), None);
    }

    #[test]
    fn sysconf_values_are_sane() {
        let hz = clock_ticks_per_second().unwrap();
        assert!((1..=10_000).contains(&hz), "{hz}");
        let page = page_size_bytes().unwrap();
        assert!(page.is_power_of_two() && page >= 4096, "{page}");
    }
}
