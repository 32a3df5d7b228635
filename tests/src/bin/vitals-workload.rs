//! Controlled workloads for the kernel tests. Each mode prints `ready` when
//! it is set up, waits for a line on stdin before acting (so the test can
//! read "before" counters while it is blocked), prints `done` and then
//! blocks until stdin closes, so "after" counters can be read while the
//! process is still alive and idle.

#[path = "vitals-workload/offcpu.rs"]
mod offcpu;
#[path = "vitals-workload/pinned_loads.rs"]
mod pinned_loads;
#[path = "vitals-workload/uffd.rs"]
mod uffd;

use pinned_loads::{pinned_bpf_reader, pinned_timers, pinned_udp_flood};
use std::{
    io::{BufRead, Write},
    os::unix::process::CommandExt,
    time::Duration,
};

fn say(s: &str) {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{s}").unwrap();
    out.flush().unwrap();
}

fn wait_line() {
    let mut l = String::new();
    std::io::stdin().lock().read_line(&mut l).unwrap();
}

fn wait_eof() {
    let mut l = String::new();
    while std::io::stdin().lock().read_line(&mut l).unwrap_or(0) > 0 {
        l.clear();
    }
}

fn thread_cpu_time() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Spins until this thread has run for `d` of CPU time (not wall time), so
/// "it ran at least d" holds however loaded the machine is.
#[inline(never)]
fn spin_for(d: Duration) -> u64 {
    let end = thread_cpu_time() + d;
    let mut x = 0u64;
    while thread_cpu_time() < end {
        for i in 0..1000u64 {
            x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(i));
        }
    }
    x
}

/// Touches `pages` fresh anonymous pages, one write each. THP is disabled
/// on the range so each page is its own fault.
#[inline(never)]
fn vitals_touch_pages(pages: usize) {
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
    let len = pages * page;
    unsafe {
        let p = libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        assert_ne!(p, libc::MAP_FAILED);
        libc::madvise(p, len, libc::MADV_NOHUGEPAGE);
        let base = std::hint::black_box(p as *mut u8);
        let mut off = 0;
        for _ in 0..pages {
            // A plain store, so the faulting instruction is in this
            // function even in a debug build (write_volatile is a call
            // there, and with no frame pointers a frame-pointer unwinder
            // would skip this frame). The pointer escapes via black_box,
            // so the store stays.
            *base.wrapping_add(off) = 1;
            off += page;
        }
        // Left mapped: the test reads counters while we are still alive.
    }
}

/// Allocates and frees through libc's malloc until `stop` is set: the
/// function a heap profile of the `heap-churn` mode must attribute its
/// allocations to (not inlined, so it is a frame of its own). Calls libc
/// directly, not Rust's allocator, so the stack names this function and
/// every block goes through the malloc that heapprofd's preload library
/// intercepts. Keeps every 8th block alive, so the profile also shows
/// unreleased memory, and spins between rounds so it uses a steady share
/// of a CPU. Returns the bytes it allocated.
#[inline(never)]
fn vitals_heap_churn(stop: &std::sync::atomic::AtomicBool) -> u64 {
    let mut kept = Vec::new();
    let mut total = 0u64;
    let mut round = 0u64;
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        let mut blocks = [std::ptr::null_mut::<libc::c_void>(); 16];
        for (i, b) in blocks.iter_mut().enumerate() {
            let size = 64 + 32 * i;
            *b = std::hint::black_box(unsafe { libc::malloc(size) });
            assert!(!b.is_null());
            total += size as u64;
        }
        for (i, b) in blocks.into_iter().enumerate() {
            if i == 0 && round.is_multiple_of(8) {
                kept.push(b as usize);
            } else {
                unsafe { libc::free(b) };
            }
        }
        round += 1;
        // About 4.5 MB/s, some 1,000 samples a second at the default 4 KiB
        // interval: thousands in a few seconds, few enough that heapprofd's
        // unwinder keeps up on a loaded machine (at 36 MB/s its ring could
        // overrun). The spin makes it ~20 % of a CPU: vitalsd's CPU share
        // comes from 10 ms ticks, and a rule on it needs every 250 ms
        // sample to show some (the malloc calls alone are ~2 %, mostly 0).
        spin_for(Duration::from_micros(250));
        std::thread::sleep(Duration::from_millis(1));
    }
    for b in kept {
        unsafe { libc::free(b as *mut libc::c_void) };
    }
    total
}

/// `heap-churn`: mallocs and frees in vitals_heap_churn on a thread from
/// the start ("ready" once it runs) until stdin closes. For heapprofd
/// tests: start it with the preload library and an argv[0] of the name the
/// session asks for.
fn heap_churn(argv0: &str) {
    name_after_argv0(argv0);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let churn = {
        let stop = stop.clone();
        std::thread::spawn(move || vitals_heap_churn(&stop))
    };
    say("ready");
    wait_eof();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    churn.join().unwrap();
}

/// Sets the comm to argv[0]'s basename (cut to the kernel's 15 bytes):
/// heapprofd matches a process by argv[0], vitalsd's rules and heap
/// allowlists by comm, and on Android the two agree, so here as well.
fn name_after_argv0(argv0: &str) {
    let base = std::path::Path::new(argv0)
        .file_name()
        .map(|b| b.to_string_lossy().into_owned())
        .unwrap_or_default();
    let comm: String = base.chars().take(15).collect();
    let c = std::ffi::CString::new(comm).unwrap();
    // SAFETY: PR_SET_NAME reads a NUL-terminated string of at most 16 bytes.
    assert_eq!(unsafe { libc::prctl(libc::PR_SET_NAME, c.as_ptr()) }, 0);
}

/// This thread's (voluntary, involuntary) context switches so far.
fn thread_switches() -> (i64, i64) {
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut ru) }, 0);
    (ru.ru_nvcsw, ru.ru_nivcsw)
}

fn pin_to(cpu: usize) {
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        assert_eq!(
            libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set),
            0
        );
    }
}

fn arg(args: &[String], i: usize) -> u64 {
    args.get(i)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("argument {i} missing or not a number: {args:?}"))
}

fn sleep_ms(ms: u64) {
    let ts = libc::timespec {
        tv_sec: (ms / 1000) as libc::time_t,
        tv_nsec: ((ms % 1000) * 1_000_000) as libc::c_long,
    };
    // Safety: plain syscall; EINTR cannot happen (no handlers installed).
    unsafe { libc::nanosleep(&ts, std::ptr::null_mut()) };
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        // spin <ms>: spin right away, then done.
        Some("spin") => {
            say("ready");
            spin_for(Duration::from_millis(arg(&args, 2)));
            say("done");
            wait_eof();
        }
        // pinned-spin <cpu> <ms>
        Some("pinned-spin") => {
            pin_to(arg(&args, 2) as usize);
            say("ready");
            wait_line();
            spin_for(Duration::from_millis(arg(&args, 3)));
            say("done");
            wait_eof();
        }
        // pinned-waker <cpu> <us>: after a line on stdin, sleeps <us> µs
        // again and again on <cpu> until stdin closes, so that its timer
        // interrupts and wakeups keep preempting whatever else runs there.
        Some("pinned-waker") => {
            pin_to(arg(&args, 2) as usize);
            let period = Duration::from_micros(arg(&args, 3));
            say("ready");
            wait_line();
            let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
            let stop_on_eof = stop.clone();
            std::thread::spawn(move || {
                wait_eof();
                stop_on_eof.store(true, std::sync::atomic::Ordering::Relaxed);
            });
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                std::thread::sleep(period);
            }
        }
        // pinned-timers <cpu> <threads> <us>: after a line on stdin,
        // <threads> threads on <cpu> each read a timerfd firing every <us>
        // µs (staggered), until stdin closes: a storm of hrtimer
        // interrupts and wakeups on that CPU.
        Some("pinned-timers") => pinned_timers(
            arg(&args, 2) as usize,
            arg(&args, 3),
            Duration::from_micros(arg(&args, 4)),
        ),
        // pinned-udp-flood <cpu>: after a line on stdin, a sender and a
        // receiver on <cpu> bounce UDP datagrams over loopback until stdin
        // closes: each send runs the receive path in NET_RX softirq on the
        // sending CPU (netif_rx -> this CPU's backlog, processed when the
        // send re-enables bottom halves).
        Some("pinned-udp-flood") => pinned_udp_flood(arg(&args, 2) as usize),
        // pinned-bpf-reader <cpu> <entries>: after a line on stdin, a
        // spinner and a BPF hash map reader on <cpu> until stdin closes.
        Some("pinned-bpf-reader") => {
            pinned_bpf_reader(arg(&args, 2) as usize, arg(&args, 3) as u32)
        }
        // spin-exit <ms>: spin, then exit without waiting.
        Some("spin-exit") => {
            spin_for(Duration::from_millis(arg(&args, 2)));
        }
        // touch <pages>
        Some("touch") => {
            say("ready");
            wait_line();
            vitals_touch_pages(arg(&args, 2) as usize);
            say("done");
            wait_eof();
        }
        // sleep <times> <ms>
        Some("sleep") => {
            say("ready");
            wait_line();
            for _ in 0..arg(&args, 2) {
                std::thread::sleep(Duration::from_millis(arg(&args, 3)));
            }
            say("done");
            wait_eof();
        }
        // pinned-sleep <cpu> <times> <ms> [nice]
        Some("pinned-sleep") => {
            pin_to(arg(&args, 2) as usize);
            if let Some(nice) = args.get(5) {
                let nice: i32 = nice.parse().expect("nice value");
                // Safety: plain syscall on this process.
                let rc = unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, nice) };
                assert_eq!(rc, 0, "setpriority({nice})");
            }
            say("ready");
            wait_line();
            for _ in 0..arg(&args, 3) {
                std::thread::sleep(Duration::from_millis(arg(&args, 4)));
            }
            say("done");
            wait_eof();
        }
        // threads <n> <ms>: n threads that each run briefly and stay alive.
        Some("threads") => threads(arg(&args, 2), arg(&args, 3)),
        // thread-churn <n> <ms>: after a line on stdin, runs n threads one
        // after another, each spinning <ms> then exiting; prints "done",
        // then, after another line, "rusage <us> <main_ns>": utime+stime of
        // the whole process (getrusage RUSAGE_SELF, the kernel's
        // thread-group total with its dead threads) in microseconds, and
        // the main thread's CLOCK_THREAD_CPUTIME_ID read just after it.
        Some("thread-churn") => thread_churn(arg(&args, 2), arg(&args, 3)),
        // pingpong <n>: two threads bounce a byte over two pipes n times,
        // each blocking in read() in between. Prints "tids <a> <b>"; after
        // "done", "csw <tid> <voluntary> <involuntary> <from_ns> <to_ns>"
        // per thread: the context switches the kernel counted for it
        // (getrusage RUSAGE_THREAD) from its first round to its last, and
        // CLOCK_BOOTTIME (the traces' clock) just after the first reading
        // and just after the last: a switch between a reading and its
        // clock read ends before `from_ns` and is counted in neither, or
        // ends before `to_ns` uncounted (one extra).
        Some("pingpong") => ping_pong(arg(&args, 2)),
        // block-release <times> <ms> [main|gated]: a thread blocks reading
        // a pipe that a second thread writes after sleeping <ms>, <times>
        // times; with `main` the waiter is the main thread (tid == pid);
        // with `gated` each release first waits for a line on stdin.
        Some("block-release") => block_release(
            arg(&args, 2),
            arg(&args, 3),
            args.get(4).map(String::as_str),
        ),
        // uffd-block <times> <ms>: a thread blocked in a page fault (S,
        // userfaultfd), each ended by a known filler thread (uffd.rs).
        Some("uffd-block") => uffd::uffd_block(arg(&args, 2), arg(&args, 3)),
        // children <n> <ms>: after a line on stdin, runs n short-lived
        // children one after the other (this binary, `spin-exit <ms>`),
        // printing "child <pid>" as each is reaped, then "done".
        Some("children") => children(arg(&args, 2), &arg(&args, 3).to_string()),
        // reuse-pid <ms_a> <ms_b>: after a line on stdin, runs child A
        // (argv[0] "vitals-reuse-a", `spin-exit <ms_a>`) and reaps it:
        // prints "a <pid>". After another line, runs child B
        // ("vitals-reuse-b", `spin-exit <ms_b>`) with A's pid, asked for
        // with clone3's set_tid (root), and reaps it: prints "b <pid>",
        // then "done".
        Some("reuse-pid") => reuse_pid(&arg(&args, 2).to_string(), &arg(&args, 3).to_string()),
        Some("heap-churn") => heap_churn(&args[0]),
        // exec-from-thread <n>: after a line on stdin, execs this binary n
        // times in a chain, each time from a new thread that is not the
        // process's leader (the kernel's de_thread() hands that thread the
        // leader's pid). The last image prints "done" and "tid <gettid>".
        Some("exec-from-thread") => {
            say("ready");
            wait_line();
            exec_from_thread(arg(&args, 2));
        }
        Some("exec-from-thread-next") => exec_from_thread(arg(&args, 2)),
        // offcpu <n> <long_ms> <short_ms>: blocks its main thread in S and
        // in D for known times, each block ended by a known waker process.
        // Prints "ready helper <pid>"; after a line on stdin, 2n reads of
        // a pipe (S) that the helper child writes after sleeping, n times
        // <long_ms> then n times <short_ms>; then n vforks (D: the parent
        // waits in wait_for_vfork_done, TASK_KILLABLE) of a child that
        // sleeps <long_ms> and exits, printing "vfork <pid>" for each;
        // then "blocking <go_ns> <2n pipe reads' ns> <n vforks' ns>": the
        // wall time its main thread spent in each call that blocks, in S
        // (the stdin read of the go line, timed from its "ready helper"
        // line on; the pipe reads, all after the go line) and in D (the
        // vfork clones), measured around the call (CLOCK_MONOTONIC), then
        // "done".
        // With a fifth argument <cpu>, it runs on that CPU, and so do the
        // helper and the vfork children, which inherit the affinity.
        Some("offcpu") => {
            if args.len() > 5 {
                pin_to(arg(&args, 5) as usize);
            }
            offcpu::offcpu(arg(&args, 2), arg(&args, 3), arg(&args, 4))
        }
        _ => {
            eprintln!("usage: vitals-workload spin|pinned-spin|pinned-waker|pinned-timers|pinned-udp-flood|spin-exit|touch|sleep|threads|thread-churn|pingpong|children|reuse-pid|heap-churn|exec-from-thread|offcpu|uffd-block ...");
            std::process::exit(2);
        }
    }
}

fn exec_from_thread(n: u64) {
    if n == 0 {
        say("done");
        // Safety: plain syscall.
        say(&format!("tid {}", unsafe { libc::gettid() }));
        wait_eof();
        return;
    }
    let exe = std::env::current_exe().expect("/proc/self/exe");
    let t = std::thread::spawn(move || {
        let err = std::process::Command::new(exe)
            .args(["exec-from-thread-next", &(n - 1).to_string()])
            .exec();
        panic!("exec from a thread: {err}");
    });
    // The exec ends this thread (de_thread kills the other threads).
    let _ = t.join();
    unreachable!("the exec from a thread returned");
}

fn thread_churn(n: u64, ms: u64) {
    say("ready");
    wait_line();
    for _ in 0..n {
        std::thread::spawn(move || spin_for(Duration::from_millis(ms)))
            .join()
            .unwrap();
    }
    say("done");
    // The reader takes its figure first: the kernel's total can only grow
    // after it (a joined thread still runs its exit path, and so does this
    // thread), so getrusage, asked for afterwards, is its upper bound.
    wait_line();
    // Safety: getrusage fills the struct we pass.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) }, 0);
    // What this thread has run by now bounds what it ran between the
    // reader's figure and getrusage (the reader knows where it stood).
    let main_ns = thread_cpu_time().as_nanos();
    let us = |t: libc::timeval| t.tv_sec as u64 * 1_000_000 + t.tv_usec as u64;
    say(&format!(
        "rusage {} {main_ns}",
        us(ru.ru_utime) + us(ru.ru_stime)
    ));
    wait_eof();
}

fn threads(n: u64, ms: u64) {
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let mut handles = Vec::new();
    for _ in 0..n {
        let tx = tx.clone();
        handles.push(std::thread::spawn(move || {
            spin_for(Duration::from_millis(1));
            std::thread::sleep(Duration::from_millis(ms));
            drop(tx);
        }));
    }
    drop(tx);
    let _ = rx.recv();
    say("done");
    wait_eof();
    for h in handles {
        h.join().unwrap();
    }
}

/// One byte through `read(2)`/`write(2)`, the `syscall` instruction
/// inlined into the calling function, so the user IP the kernel saved at
/// the syscall's entry (the first frame of a user stack taken while the
/// thread blocks or wakes another) is in that function. Through libc's
/// wrapper the first frame would be the wrapper, and a frame-pointer walk
/// from it skips its caller (the wrapper sets up no frame).
#[inline(always)]
unsafe fn raw_io(nr: i64, fd: i32, buf: *mut u8) -> i64 {
    let ret: i64;
    #[cfg(target_arch = "x86_64")]
    unsafe {
        std::arch::asm!("syscall", inlateout("rax") nr => ret, in("rdi") fd as i64,
            in("rsi") buf, in("rdx") 1i64, lateout("rcx") _, lateout("r11") _,
            options(nostack));
    }
    #[cfg(target_arch = "aarch64")]
    unsafe {
        std::arch::asm!("svc 0", inlateout("x0") fd as i64 => ret, in("x1") buf,
            in("x2") 1i64, in("x8") nr, options(nostack));
    }
    ret
}

/// The waiting function of `block-release`: blocks in read() on `fd`.
#[inline(never)]
fn vitals_wait_for_release(fd: i32) {
    let mut b = 0u8;
    let ret = unsafe { raw_io(libc::SYS_read, fd, &mut b) };
    assert_eq!(ret, 1, "read of the release pipe");
}

/// The releasing function of `block-release`: sleeps `ms`, then writes
/// the byte that wakes the waiter (the waker's stack is taken here).
#[inline(never)]
fn vitals_release_after_sleep(fd: i32, ms: u64) {
    std::thread::sleep(Duration::from_millis(ms));
    let mut b = b'x';
    let ret = unsafe { raw_io(libc::SYS_write, fd, &mut b) };
    assert_eq!(ret, 1, "write of the release pipe");
}

/// A thread named `name` that runs `body` once `go` is passed, and its
/// tid (so a test knows which thread blocks and which wakes it).
fn spawn_at_go(
    go: &std::sync::Arc<std::sync::Barrier>,
    name: &str,
    body: Box<dyn FnOnce() + Send>,
) -> (std::thread::JoinHandle<()>, i64) {
    let (tx, rx) = std::sync::mpsc::channel::<i64>();
    let go = go.clone();
    let h = std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            tx.send(unsafe { libc::gettid() } as i64).unwrap();
            go.wait();
            body();
        })
        .unwrap();
    (h, rx.recv().unwrap())
}

/// `block-release`: prints `tids <waiter> <releaser>` and `ready`, and on
/// a line from stdin runs the rounds: the waiter (thread `vitals-waiter`)
/// blocks in `vitals_wait_for_release`, the releaser (`vitals-release`)
/// wakes it from `vitals_release_after_sleep` after `ms`. `main`: the
/// main thread waits (what `main_thread_long_blocks` watches); `gated`:
/// each release waits for a line from stdin first, so a test can start
/// something while the waiter is known to be blocked.
fn block_release(times: u64, ms: u64, mode: Option<&str>) {
    let on_main = mode == Some("main");
    let gated = mode == Some("gated");
    let mut p = [0i32; 2];
    unsafe { assert_eq!(libc::pipe(p.as_mut_ptr()), 0) };
    let (rd, wr) = (p[0], p[1]);
    if on_main {
        let go = std::sync::Arc::new(std::sync::Barrier::new(2));
        let g = go.clone();
        let (tx, rx) = std::sync::mpsc::channel::<i64>();
        let releaser = std::thread::Builder::new()
            .name("vitals-release".into())
            .spawn(move || {
                tx.send(unsafe { libc::gettid() } as i64).unwrap();
                g.wait();
                (0..times).for_each(|_| vitals_release_after_sleep(wr, ms));
            })
            .unwrap();
        let r = rx.recv().unwrap();
        say(&format!("tids {} {r}", unsafe { libc::gettid() }));
        say("ready");
        wait_line();
        go.wait();
        (0..times).for_each(|_| vitals_wait_for_release(rd));
        releaser.join().unwrap();
        say("done");
        wait_eof();
        return;
    }
    let go = std::sync::Arc::new(std::sync::Barrier::new(3));
    let spawn = |name: &str, body: Box<dyn FnOnce() + Send>| spawn_at_go(&go, name, body);
    let (waiter, w) = spawn(
        "vitals-waiter",
        Box::new(move || (0..times).for_each(|_| vitals_wait_for_release(rd))),
    );
    let (releaser, r) = spawn(
        "vitals-release",
        Box::new(move || {
            (0..times).for_each(|_| {
                if gated {
                    wait_line();
                }
                vitals_release_after_sleep(wr, ms)
            })
        }),
    );
    say(&format!("tids {w} {r}"));
    say("ready");
    wait_line();
    go.wait();
    waiter.join().unwrap();
    releaser.join().unwrap();
    say("done");
    wait_eof();
}

fn ping_pong(n: u64) {
    let (mut p1, mut p2) = ([0i32; 2], [0i32; 2]);
    unsafe {
        assert_eq!(libc::pipe(p1.as_mut_ptr()), 0);
        assert_eq!(libc::pipe(p2.as_mut_ptr()), 0);
    }
    let go = std::sync::Arc::new(std::sync::Barrier::new(3));
    let (tx, rx) = std::sync::mpsc::channel::<i64>();
    let spawn = |rd: i32, wr: i32, first: bool| {
        let go = go.clone();
        let tx = tx.clone();
        std::thread::spawn(move || {
            // Both on one CPU: every round is exactly two switches
            // (each thread blocks in read() or is preempted by the
            // wakeup), whatever the tracing costs the waker.
            pin_to(0);
            let tid = unsafe { libc::gettid() } as i64;
            tx.send(tid).unwrap();
            go.wait();
            let (vol0, invol0) = thread_switches();
            let from_ns = vitals_tests::boottime_ns();
            let mut b = [0u8; 1];
            for _ in 0..n {
                unsafe {
                    if first {
                        assert_eq!(libc::write(wr, b"x".as_ptr().cast(), 1), 1);
                        assert_eq!(libc::read(rd, b.as_mut_ptr().cast(), 1), 1);
                    } else {
                        assert_eq!(libc::read(rd, b.as_mut_ptr().cast(), 1), 1);
                        assert_eq!(libc::write(wr, b"x".as_ptr().cast(), 1), 1);
                    }
                }
            }
            let (vol, invol) = thread_switches();
            let to_ns = vitals_tests::boottime_ns();
            format!(
                "csw {tid} {} {} {from_ns} {to_ns}",
                vol - vol0,
                invol - invol0
            )
        })
    };
    let ping = spawn(p2[0], p1[1], true);
    let pong = spawn(p1[0], p2[1], false);
    let (a, b) = (rx.recv().unwrap(), rx.recv().unwrap());
    say(&format!("tids {a} {b}"));
    wait_line();
    go.wait();
    let ping = ping.join().unwrap();
    let pong = pong.join().unwrap();
    say("done");
    say(&ping);
    say(&pong);
    wait_eof();
}

fn children(n: u64, ms: &str) {
    let me = std::env::current_exe().unwrap();
    say("ready");
    wait_line();
    for _ in 0..n {
        let mut c = std::process::Command::new(&me)
            .args(["spin-exit", ms])
            .spawn()
            .unwrap();
        let pid = c.id();
        assert!(c.wait().unwrap().success());
        say(&format!("child {pid}"));
    }
    say("done");
    wait_eof();
}

fn reuse_pid(ms_a: &str, ms_b: &str) {
    let me = std::env::current_exe().unwrap();
    say("ready");
    wait_line();
    let mut a = std::process::Command::new(&me)
        .arg0("vitals-reuse-a")
        .args(["spin-exit", ms_a])
        .spawn()
        .unwrap();
    let pid = a.id();
    assert!(a.wait().unwrap().success());
    say(&format!("a {pid}"));
    wait_line();
    let b = vitals_tests::pid::spawn_with_pid_retrying(
        pid,
        &me,
        &["vitals-reuse-b", "spin-exit", ms_b],
    );
    let b_pid = b.pid();
    b.wait_success();
    say(&format!("b {b_pid}"));
    say("done");
    wait_eof();
}
