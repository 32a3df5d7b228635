//! BPF_MAP_LOOKUP_BATCH (Linux 5.6) for the hashes the reader walks every
//! sample (plain hashes; per-CPU ones too, their slots side by side). aya
//! 0.14 has no batch operations: its iterator makes two
//! bpf() calls per entry (get_next_key, then lookup), and get_next_key on a
//! hash first finds the previous key again. One batch call returns whole
//! buckets of entries instead.

use std::os::fd::{AsRawFd, BorrowedFd};

use thiserror::Error;

#[derive(Debug, Error)]
#[error("bpf(BPF_MAP_LOOKUP_BATCH) on map fd {fd}: {source}")]
pub struct BatchError {
    pub fd: i32,
    #[source]
    pub source: std::io::Error,
}

const BPF_MAP_LOOKUP_BATCH: libc::c_long = 24;
/// The kernel's internal ENOTSUPP, which bpf() can return to user space.
const ENOTSUPP: i32 = 524;
/// Entries asked for per call; grown when one bucket holds more.
const FIRST_BATCH: usize = 256;

/// `union bpf_attr`'s `batch` member (include/uapi/linux/bpf.h).
#[repr(C)]
#[derive(Default)]
struct BatchAttr {
    in_batch: u64,
    out_batch: u64,
    keys: u64,
    values: u64,
    count: u32,
    map_fd: u32,
    elem_flags: u64,
    flags: u64,
}

/// Calls `visit(key, value)` for every entry of a BPF_MAP_TYPE_HASH with
/// u32 keys and `V` values (TASKS, PROCESS_FAULTS). Returns false, having
/// visited nothing, when the kernel has no batch lookup for the map (before
/// 5.6): the caller then iterates.
pub fn hash_u32<V: Copy + Default>(
    fd: BorrowedFd<'_>,
    mut visit: impl FnMut(u32, &V),
) -> Result<bool, BatchError> {
    // A plain hash's values come back packed at value_size
    // (__htab_map_lookup_and_delete_batch in kernel/bpf/hashtab.c).
    lookup_u32(fd, 1, std::mem::size_of::<V>(), |key, values: &[V]| {
        visit(key, &values[0])
    })
}

/// Calls `visit(key, per_cpu_values)` for every entry of a
/// BPF_MAP_TYPE_PERCPU_HASH with u32 keys and `V` values, `ncpus` the
/// possible CPUs (the kernel lays out one 8-byte-aligned slot per possible
/// CPU). Returns false as `hash_u32` does.
pub fn percpu_hash_u32<V: Copy + Default>(
    fd: BorrowedFd<'_>,
    ncpus: usize,
    visit: impl FnMut(u32, &[V]),
) -> Result<bool, BatchError> {
    let stride = std::mem::size_of::<V>().next_multiple_of(8);
    lookup_u32(fd, ncpus, stride, visit)
}

/// BPF_MAP_LOOKUP_BATCH over a hash with u32 keys whose value is `slots`
/// `V`s, `stride` bytes apart.
fn lookup_u32<V: Copy + Default>(
    fd: BorrowedFd<'_>,
    slots: usize,
    stride: usize,
    mut visit: impl FnMut(u32, &[V]),
) -> Result<bool, BatchError> {
    let mut cap = FIRST_BATCH;
    let mut keys = vec![0u32; cap];
    let mut values = vec![0u8; cap * slots * stride];
    let mut out = vec![V::default(); slots];
    // The batch token of a hash map is a bucket index (u32).
    let (mut in_batch, mut out_batch) = (0u32, 0u32);
    let mut first = true;
    loop {
        let mut attr = BatchAttr {
            in_batch: if first {
                0
            } else {
                &in_batch as *const u32 as u64
            },
            out_batch: &mut out_batch as *mut u32 as u64,
            keys: keys.as_mut_ptr() as u64,
            values: values.as_mut_ptr() as u64,
            count: cap as u32,
            map_fd: fd.as_raw_fd() as u32,
            ..BatchAttr::default()
        };
        // SAFETY: attr points at buffers of `count` keys and values that
        // outlive the call; the kernel writes at most that many.
        let ret = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                BPF_MAP_LOOKUP_BATCH,
                &mut attr as *mut BatchAttr,
                std::mem::size_of::<BatchAttr>(),
            )
        };
        let errno = (ret < 0).then(std::io::Error::last_os_error);
        match errno.as_ref().and_then(|e| e.raw_os_error()) {
            // ENOENT: this was the last batch (possibly empty).
            None | Some(libc::ENOENT) => {}
            // One bucket holds more entries than `count`; nothing was
            // returned, so ask again with room for more.
            Some(libc::ENOSPC) if cap < 1 << 20 => {
                cap *= 4;
                keys.resize(cap, 0);
                values.resize(cap * slots * stride, 0);
                continue;
            }
            Some(libc::EINVAL | ENOTSUPP) if first => return Ok(false),
            _ => {
                return Err(BatchError {
                    fd: fd.as_raw_fd(),
                    source: errno.unwrap(),
                })
            }
        }
        for (i, key) in keys.iter().enumerate().take(attr.count as usize) {
            let entry = &values[i * slots * stride..(i + 1) * slots * stride];
            for (n, slot) in out.iter_mut().enumerate() {
                // SAFETY: V is plain old data (the maps' repr(C) types) and
                // the slot lies inside `entry`; the buffer is not aligned
                // for V, hence read_unaligned.
                *slot =
                    unsafe { std::ptr::read_unaligned(entry[n * stride..].as_ptr() as *const V) };
            }
            visit(*key, &out);
        }
        if errno.is_some() {
            return Ok(true);
        }
        in_batch = out_batch;
        first = false;
    }
}
