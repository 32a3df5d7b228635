//! The loads that share a pinned spinner's CPU in the accounting tests
//! (a timer storm, a loopback flood), each until stdin closes.

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
