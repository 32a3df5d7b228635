//! The BPF_F_MMAPABLE arrays (Linux 5.5) the always-on read takes through
//! mmap instead of bpf(): CPU_STATE, DROPS, TASKS_BY_TID, FAULTS_BY_TGID
//! (the programs' `mapped` module says what each holds), and WAKERS and
//! WAKER_HALF, mapped writable (the programs' `offcpu` module). A bpf() lookup
//! raises `bpf_prog_active` on the reader's CPU (bpf_disable_instrumentation,
//! kernel/bpf/syscall.c) and, since Linux 5.11, can be preempted there:
//! until the reader runs again the classic tracepoint programs on that CPU
//! are skipped. A load from the mapping raises nothing.
//!
//! aya 0.14 creates these maps with the flag but has no mmap access, hence
//! `libc::mmap` on the map's fd (kernel/bpf/arraymap.c array_map_mmap: the
//! values start at offset 0, each `round_up(value_size, 8)` bytes).
//!
//! The programs write these values while we read them. Aligned u64 loads
//! and stores are single-copy atomic on the 64-bit targets, so a field is
//! never torn; a whole value is taken by copying it until two copies in a
//! row agree (`read_stable`).

use std::{
    marker::PhantomData,
    os::fd::{AsFd, AsRawFd},
    ptr::NonNull,
};

use aya::maps::{Map, MapData, RingBuf};
use thiserror::Error;

#[derive(Debug, Error)]
pub enum MappedError {
    #[error("map {name} is not an array")]
    NotArray { name: &'static str },
    #[error("map {name}: value size {found} bytes, expected {expected}")]
    ValueSize {
        name: &'static str,
        found: u32,
        expected: usize,
    },
    #[error("map {name} was created without BPF_F_MMAPABLE (flags {flags:#x})")]
    NotMmapable { name: &'static str, flags: u32 },
    #[error("map {name}: {source}")]
    Info {
        name: &'static str,
        #[source]
        source: aya::maps::MapError,
    },
    #[error("mmap of map {name} ({len} bytes): {source}")]
    Mmap {
        name: &'static str,
        len: usize,
        #[source]
        source: std::io::Error,
    },
}

/// Attempts at a consistent copy of one value before taking the last one.
const STABLE_TRIES: usize = 8;

/// A mapping of a BPF_F_MMAPABLE array of `T`, read-only unless made by
/// `open_writable`.
#[derive(Debug)]
pub struct MappedArray<T> {
    base: NonNull<u8>,
    len_bytes: usize,
    entries: u32,
    stride: usize,
    writable: bool,
    _t: PhantomData<T>,
}

// SAFETY: the mapping is shared memory owned by this value; it is only
// accessed through volatile loads and stores of whole values.
unsafe impl<T> Send for MappedArray<T> {}
unsafe impl<T> Sync for MappedArray<T> {}

impl<T: Copy + PartialEq> MappedArray<T> {
    /// Maps array `name` read-only.
    pub fn open(map: &Map, name: &'static str) -> Result<Self, MappedError> {
        let Map::Array(data) = map else {
            return Err(MappedError::NotArray { name });
        };
        Self::open_data(data, name, libc::PROT_READ)
    }

    /// Maps array `name` read-write, for `write` (the kernel refuses a
    /// writable mapping of a frozen map only).
    pub fn open_writable(map: &Map, name: &'static str) -> Result<Self, MappedError> {
        let Map::Array(data) = map else {
            return Err(MappedError::NotArray { name });
        };
        Self::open_data(data, name, libc::PROT_READ | libc::PROT_WRITE)
    }

    fn open_data(data: &MapData, name: &'static str, prot: i32) -> Result<Self, MappedError> {
        let info = data
            .info()
            .map_err(|source| MappedError::Info { name, source })?;
        if info.value_size() as usize != std::mem::size_of::<T>() {
            return Err(MappedError::ValueSize {
                name,
                found: info.value_size(),
                expected: std::mem::size_of::<T>(),
            });
        }
        let flags = info.map_flags();
        if flags & vitals_common::mapped::BPF_F_MMAPABLE == 0 {
            return Err(MappedError::NotMmapable { name, flags });
        }
        let stride = std::mem::size_of::<T>().next_multiple_of(8);
        let entries = info.max_entries();
        let len_bytes = (stride * entries as usize).max(1);
        // SAFETY: a fresh shared mapping of the map's fd; the kernel
        // checks the length against the array's size.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len_bytes,
                prot,
                libc::MAP_SHARED,
                data.fd().as_fd().as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(MappedError::Mmap {
                name,
                len: len_bytes,
                source: std::io::Error::last_os_error(),
            });
        }
        Ok(Self {
            base: NonNull::new(ptr.cast()).expect("mmap returned null"),
            len_bytes,
            entries,
            stride,
            writable: prot & libc::PROT_WRITE != 0,
            _t: PhantomData,
        })
    }

    pub fn entries(&self) -> u32 {
        self.entries
    }

    /// The u64 at byte `offset` of value `index` (< `entries`), e.g. a
    /// slot's stamp, read without copying the whole value.
    pub fn copy_u64(&self, index: u32, offset: usize) -> u64 {
        assert!(index < self.entries, "index {index} past {}", self.entries);
        assert!(offset + 8 <= std::mem::size_of::<T>() && offset.is_multiple_of(8));
        // SAFETY: inside the value (checked above), 8-byte aligned as in
        // `copy`.
        unsafe {
            std::ptr::read_volatile(
                self.base
                    .as_ptr()
                    .add(index as usize * self.stride + offset) as *const u64,
            )
        }
    }

    /// One copy of value `index` (< `entries`), for a value no program
    /// is writing (else `read_stable`).
    pub fn copy(&self, index: u32) -> T {
        assert!(index < self.entries, "index {index} past {}", self.entries);
        // SAFETY: inside the mapping; values are 8-byte aligned (page-
        // aligned base, stride a multiple of 8); T is plain old data.
        unsafe {
            std::ptr::read_volatile(self.base.as_ptr().add(index as usize * self.stride) as *const T)
        }
    }

    /// Stores `value` at `index` (< `entries`) of a mapping made by
    /// `open_writable`.
    pub fn write(&self, index: u32, value: T) {
        assert!(self.writable, "write to a read-only mapping");
        assert!(index < self.entries, "index {index} past {}", self.entries);
        // SAFETY: as in `copy`.
        unsafe {
            std::ptr::write_volatile(
                self.base.as_ptr().add(index as usize * self.stride) as *mut T,
                value,
            )
        }
    }

    /// Value `index`, copied until two copies in a row agree (a program
    /// was not writing it in between); the last copy after
    /// `STABLE_TRIES`, whose fields are each whole.
    pub fn read_stable(&self, index: u32) -> T {
        let mut last = self.copy(index);
        for _ in 0..STABLE_TRIES {
            let again = self.copy(index);
            if again == last {
                break;
            }
            last = again;
        }
        last
    }
}

impl<T> Drop for MappedArray<T> {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `open`, unmapped once.
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.len_bytes) };
    }
}

/// A ring buffer of its own over `map`'s fd (a dup: the object keeps its
/// `MapData`), or None when `map` is no ring buffer (the object rewritten
/// for a kernel without them).
pub fn own_ring(map: &Map, name: &'static str) -> Result<Option<RingBuf<MapData>>, MappedError> {
    let Map::RingBuf(data) = map else {
        return Ok(None);
    };
    let fd = data
        .fd()
        .as_fd()
        .try_clone_to_owned()
        .map_err(|source| MappedError::Mmap {
            name,
            len: 0,
            source,
        })?;
    let info = |source| MappedError::Info { name, source };
    let dup = MapData::from_fd(fd).map_err(info)?;
    RingBuf::try_from(Map::RingBuf(dup)).map(Some).map_err(info)
}

/// The mappings of one `Accounting`, made at its first read.
#[derive(Default)]
pub struct Mappings {
    pub cpu_state: Option<MappedArray<vitals_common::CpuState>>,
    pub drops: Option<MappedArray<u64>>,
    pub tasks: Option<MappedArray<vitals_common::TaskRecord>>,
    pub process_faults: Option<MappedArray<vitals_common::FaultCounters>>,
    /// WAKERS and WAKER_HALF, mapped writable while off-CPU accounting
    /// is on, and the pairs' totals user space keeps from them
    /// (`counters::wakers`).
    pub wakers: Option<MappedArray<vitals_common::WakerSlot>>,
    pub waker_half: Option<MappedArray<u32>>,
    pub waker_totals:
        std::collections::HashMap<vitals_common::WakerKey, vitals_common::WakerCounters>,
    /// Ended wakees, with the folds they are still dropped from.
    pub wakers_forgotten: Vec<(u32, u8)>,
    /// Wakeups of pairs `waker_totals` had no room for.
    pub wakers_dropped: u64,
    /// EXITED_RING, where the kernel has ring buffers (else an array the
    /// programs never write, and None here).
    pub exited_ring: Option<aya::maps::RingBuf<MapData>>,
    /// Entries the fallback hashes (TASKS, PROCESS_FAULTS) held at the
    /// last read: while small they are walked key by key
    /// (BPF_MAP_GET_NEXT_KEY does not raise bpf_prog_active), else batched.
    pub tasks_hash_len: usize,
    pub faults_hash_len: usize,
}
