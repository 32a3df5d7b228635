//! The loads that share a pinned spinner's CPU in the accounting tests
//! (a timer storm, a loopback flood) and the blind-window test (a BPF map
//! reader), each until stdin closes.

use std::time::Duration;

use super::{pin_to, say, wait_eof, wait_line};

/// Runs `body` on a thread pinned to `cpu` until stdin closes (read on
/// this thread after a first line), then stops it and joins.
fn pinned_until_eof(
    cpu: usize,
    threads: u64,
    body: impl Fn(u64, &std::sync::atomic::AtomicBool) + Send + Sync + 'static,
) {
    use std::sync::{atomic::AtomicBool, Arc};
    say("ready");
    wait_line();
    let stop = Arc::new(AtomicBool::new(false));
    let body = Arc::new(body);
    let handles: Vec<_> = (0..threads)
        .map(|i| {
            let (stop, body) = (stop.clone(), body.clone());
            std::thread::spawn(move || {
                pin_to(cpu);
                body(i, &stop)
            })
        })
        .collect();
    wait_eof();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for h in handles {
        h.join().unwrap();
    }
}

pub(crate) fn pinned_timers(cpu: usize, threads: u64, period: Duration) {
    pinned_until_eof(cpu, threads, move |i, stop| {
        // SAFETY: plain syscalls on an fd this thread owns.
        let fd = unsafe { libc::timerfd_create(libc::CLOCK_MONOTONIC, 0) };
        assert!(fd >= 0, "timerfd_create");
        let ns = |d: Duration| libc::timespec {
            tv_sec: d.as_secs() as libc::time_t,
            tv_nsec: d.subsec_nanos() as libc::c_long,
        };
        let spec = libc::itimerspec {
            it_interval: ns(period),
            // Staggered, so the threads' expiries do not coincide.
            it_value: ns(period + period * i as u32 / threads.max(1) as u32),
        };
        assert_eq!(
            unsafe { libc::timerfd_settime(fd, 0, &spec, std::ptr::null_mut()) },
            0
        );
        let mut expirations = 0u64;
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            let n = unsafe { libc::read(fd, (&mut expirations as *mut u64).cast(), 8) };
            assert_eq!(n, 8, "reading the timerfd");
        }
        unsafe { libc::close(fd) };
    });
}

pub(crate) fn pinned_udp_flood(cpu: usize) {
    let rx = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let to = rx.local_addr().unwrap();
    // The receiver wakes at least every 100 ms to see the stop flag.
    rx.set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let rx = std::sync::Mutex::new(Some(rx));
    pinned_until_eof(cpu, 2, move |i, stop| {
        let running = || !stop.load(std::sync::atomic::Ordering::Relaxed);
        if i == 0 {
            let tx = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
            let datagram = [0u8; 1024];
            while running() {
                // ENOBUFS/ECONNREFUSED under load are part of a flood.
                let _ = tx.send_to(&datagram, to);
            }
        } else {
            let rx = rx.lock().unwrap().take().unwrap();
            let mut buf = [0u8; 2048];
            while running() {
                let _ = rx.recv_from(&mut buf);
            }
        }
    });
}

/// A spinner and a reader of a large, sparse BPF hash map, both on `cpu`:
/// the reader loops BPF_MAP_LOOKUP_BATCH over `entries` slots holding 64
/// keys, so most of its time is the kernel's walk over empty buckets with
/// bpf_prog_active raised (`__htab_map_lookup_and_delete_batch`). On a
/// kernel that preempts there (preempt=full or lazy, Linux 5.11+) the
/// spinner runs while the CPU is blind to the classic tracepoint programs.
pub(crate) fn pinned_bpf_reader(cpu: usize, entries: u32) {
    let map = bpf_hash(entries);
    pinned_until_eof(cpu, 2, move |i, stop| {
        let running = || !stop.load(std::sync::atomic::Ordering::Relaxed);
        if i == 0 {
            let mut x = 0u64;
            while running() {
                x = std::hint::black_box(x.wrapping_add(1));
            }
            return;
        }
        let mut keys = vec![0u32; 256];
        let mut values = vec![0u64; 256];
        while running() {
            let (mut token, mut first) = (0u64, true);
            loop {
                let mut out = 0u64;
                let mut attr = [0u64; 8];
                // union bpf_attr's `batch`: in_batch, out_batch, keys,
                // values, count | map_fd, elem_flags, flags.
                attr[0] = if first {
                    0
                } else {
                    &token as *const u64 as u64
                };
                attr[1] = &mut out as *mut u64 as u64;
                attr[2] = keys.as_mut_ptr() as u64;
                attr[3] = values.as_mut_ptr() as u64;
                attr[4] = 256 | (u64::from(map as u32) << 32);
                let r = bpf(BPF_MAP_LOOKUP_BATCH, &mut attr);
                if r < 0 {
                    break; // ENOENT: the walk reached the end.
                }
                token = out;
                first = false;
            }
        }
    });
}

const BPF_MAP_CREATE: i64 = 0;
const BPF_MAP_UPDATE_ELEM: i64 = 2;
const BPF_MAP_LOOKUP_BATCH: i64 = 24;

fn bpf(cmd: i64, attr: &mut [u64; 8]) -> i64 {
    // SAFETY: attr is a zero-padded union bpf_attr of 64 bytes.
    unsafe { libc::syscall(libc::SYS_bpf, cmd, attr.as_mut_ptr(), 64u32) as i64 }
}

/// A BPF_MAP_TYPE_HASH of `entries` u32 -> u64 slots holding 64 keys.
fn bpf_hash(entries: u32) -> i32 {
    let mut attr = [0u64; 8];
    // map_type 1 (hash), key_size 4 | value_size 8, max_entries.
    attr[0] = 1 | (4 << 32);
    attr[1] = 8 | (u64::from(entries) << 32);
    let fd = bpf(BPF_MAP_CREATE, &mut attr);
    assert!(
        fd >= 0,
        "BPF_MAP_CREATE: {}",
        std::io::Error::last_os_error()
    );
    for k in 0..64u32 {
        let v = 0u64;
        let mut a = [0u64; 8];
        a[0] = fd as u64;
        a[1] = &k as *const u32 as u64;
        a[2] = &v as *const u64 as u64;
        assert_eq!(bpf(BPF_MAP_UPDATE_ELEM, &mut a), 0, "BPF_MAP_UPDATE_ELEM");
    }
    fd as i32
}
