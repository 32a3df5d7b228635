//! The blind-window witness (`vitals_common::blind`): one CPU-wide
//! PERF_COUNT_SW_CONTEXT_SWITCHES counter per online CPU, in the programs'
//! SWITCH_COUNTERS perf event array, where the classic sched_switch
//! programs read it during a `--sched` capture.
//!
//! Opened at load when captures are configured (perf_event_open of a
//! CPU-wide event needs CAP_PERFMON, which the daemon drops afterwards)
//! and disabled: a disabled event is not on the CPU's software-event list,
//! so outside a capture nothing counts. (Opening one raises the
//! perf_swevent_enabled static key, so every switch still looks that list
//! up, empty, in perf_event_task_sched_out.) A capture enables them
//! (PERF_EVENT_IOC_ENABLE needs no capability) and disables them at its
//! end. The tp_btf programs
//! need none of this: raw tracepoints do not take bpf_prog_active.

use std::{
    io,
    os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd},
    path::Path,
};

use aya::Ebpf;
use thiserror::Error;
use vitals_common::blind;

#[derive(Debug, Error)]
pub enum SwitchCounterError {
    #[error("perf_event_open(PERF_COUNT_SW_CONTEXT_SWITCHES, cpu {cpu}): {source}")]
    Open { cpu: u32, source: io::Error },
    #[error("bpf(BPF_MAP_UPDATE_ELEM) {}[{cpu}]: {source}", blind::SWITCH_COUNTERS)]
    Insert { cpu: u32, source: io::Error },
    #[error("{} is not in the object", blind::SWITCH_COUNTERS)]
    Missing,
    #[error("online CPUs: {0}")]
    Cpus(String),
    #[error("ioctl({request}) on the context-switch counter of cpu {cpu}: {source}")]
    Ioctl {
        request: &'static str,
        cpu: u32,
        source: io::Error,
    },
}

/// include/uapi/linux/perf_event.h: PERF_TYPE_SOFTWARE,
/// PERF_COUNT_SW_CONTEXT_SWITCHES, the first attr size (VER0) and the
/// `disabled` bit of the flags word.
const PERF_TYPE_SOFTWARE: u32 = 1;
const PERF_COUNT_SW_CONTEXT_SWITCHES: u64 = 3;
const PERF_ATTR_SIZE_VER0: u32 = 64;
const ATTR_DISABLED: u64 = 1;
/// perf_event_open flag (1 << 3).
const PERF_FLAG_FD_CLOEXEC: libc::c_ulong = 8;
/// _IO('$', 0) and _IO('$', 1).
const PERF_EVENT_IOC_ENABLE: libc::c_ulong = 0x2400;
const PERF_EVENT_IOC_DISABLE: libc::c_ulong = 0x2401;

/// `struct perf_event_attr` up to `bp_addr` (PERF_ATTR_SIZE_VER0).
#[repr(C)]
#[derive(Default)]
struct PerfEventAttrV0 {
    kind: u32,
    size: u32,
    config: u64,
    sample_period: u64,
    sample_type: u64,
    read_format: u64,
    flags: u64,
    wakeup_events: u32,
    bp_type: u32,
    bp_addr: u64,
}

/// The counters, (cpu, fd); empty where none could be opened (pins, or no
/// CAP_PERFMON): captures then mark only the windows `switch_missed` finds.
#[derive(Default)]
pub(crate) struct SwitchCounters {
    counters: Vec<(u32, OwnedFd)>,
}

impl SwitchCounters {
    /// Opens one disabled counter per online CPU and puts it in
    /// SWITCH_COUNTERS at that CPU's index.
    pub(crate) fn open(ebpf: &Ebpf) -> Result<Self, SwitchCounterError> {
        let map_fd = match ebpf.map(blind::SWITCH_COUNTERS) {
            Some(aya::maps::Map::PerfEventArray(data)) => data.fd().as_fd().as_raw_fd(),
            _ => return Err(SwitchCounterError::Missing),
        };
        let cpus = crate::system::online_cpus(Path::new("/sys"))
            .map_err(|e| SwitchCounterError::Cpus(e.to_string()))?;
        let mut counters = Vec::with_capacity(cpus.len());
        for cpu in cpus {
            let fd = open_counter(cpu)?;
            map_update(map_fd, cpu, fd.as_raw_fd())
                .map_err(|source| SwitchCounterError::Insert { cpu, source })?;
            counters.push((cpu, fd));
        }
        Ok(Self { counters })
    }

    /// Starts (true) or stops counting on every CPU.
    pub(crate) fn set_enabled(&self, on: bool) -> Result<(), SwitchCounterError> {
        let (request, name) = if on {
            (PERF_EVENT_IOC_ENABLE, "PERF_EVENT_IOC_ENABLE")
        } else {
            (PERF_EVENT_IOC_DISABLE, "PERF_EVENT_IOC_DISABLE")
        };
        for (cpu, fd) in &self.counters {
            // SAFETY: an ioctl without argument on a perf fd we own.
            if unsafe { libc::ioctl(fd.as_raw_fd(), request as _, 0) } != 0 {
                return Err(SwitchCounterError::Ioctl {
                    request: name,
                    cpu: *cpu,
                    source: io::Error::last_os_error(),
                });
            }
        }
        Ok(())
    }
}

fn open_counter(cpu: u32) -> Result<OwnedFd, SwitchCounterError> {
    let attr = PerfEventAttrV0 {
        kind: PERF_TYPE_SOFTWARE,
        size: PERF_ATTR_SIZE_VER0,
        config: PERF_COUNT_SW_CONTEXT_SWITCHES,
        flags: ATTR_DISABLED,
        ..Default::default()
    };
    // SAFETY: attr outlives the call; pid -1 with a cpu is a CPU-wide event.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_perf_event_open,
            &attr as *const PerfEventAttrV0,
            -1 as libc::pid_t,
            cpu as libc::c_int,
            -1 as libc::c_int,
            PERF_FLAG_FD_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(SwitchCounterError::Open {
            cpu,
            source: io::Error::last_os_error(),
        });
    }
    // SAFETY: a new fd that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// BPF_MAP_UPDATE_ELEM of a perf event fd (aya's PerfEventArray only
/// opens perf buffers). The kernel takes its own reference to the event.
fn map_update(map_fd: i32, cpu: u32, event_fd: i32) -> io::Result<()> {
    #[repr(C)]
    struct UpdateAttr {
        map_fd: u32,
        _pad: u32,
        key: u64,
        value: u64,
        flags: u64,
    }
    let key = cpu;
    let value = event_fd as u32;
    let attr = UpdateAttr {
        map_fd: map_fd as u32,
        _pad: 0,
        key: &key as *const u32 as u64,
        value: &value as *const u32 as u64,
        flags: 0,
    };
    const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
    // SAFETY: attr and the key/value it points to outlive the call.
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_MAP_UPDATE_ELEM,
            &attr as *const UpdateAttr,
            std::mem::size_of::<UpdateAttr>() as u32,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
