//! `offcpu`: a main thread blocked in S and in D for known times, each
//! block ended by a known waker process (tests/tests/offcpu.rs).

use super::{say, sleep_ms, wait_eof, wait_line};

/// The vfork child: sleeps the milliseconds `arg` points to, then returns,
/// which makes glibc's clone wrapper call _exit: the kernel's mm_release
/// then completes the parent's vfork wait (complete_vfork_done), from this
/// child's context.
extern "C" fn vfork_child(arg: *mut libc::c_void) -> libc::c_int {
    sleep_ms(unsafe { *(arg as *const u64) });
    0
}

pub(crate) fn offcpu(n: u64, long_ms: u64, short_ms: u64) {
    // Children reaped by the kernel: no zombie to wait for, and no wait4
    // that would block (and be woken by the child) a second time.
    unsafe { libc::signal(libc::SIGCHLD, libc::SIG_IGN) };
    let (mut go, mut data) = ([0i32; 2], [0i32; 2]);
    assert_eq!(unsafe { libc::pipe(go.as_mut_ptr()) }, 0);
    assert_eq!(unsafe { libc::pipe(data.as_mut_ptr()) }, 0);
    // Safety: single-threaded here; the child only makes syscalls.
    let helper = unsafe { libc::fork() };
    assert!(helper >= 0, "fork");
    if helper == 0 {
        unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) };
        let mut b = 0u8;
        unsafe { libc::read(go[0], &mut b as *mut u8 as *mut libc::c_void, 1) };
        for i in 0..2 * n {
            // Only once the reader sits in read() on the pipe: a reader
            // late by more than `short_ms` (a TCG guest's vCPUs take
            // turns) would find the byte there and never block, and the
            // test counts one wakeup a read.
            let parent = unsafe { libc::getppid() };
            vitals_tests::wait_blocked_in_read(parent, parent, Some(data[0]));
            sleep_ms(if i < n { long_ms } else { short_ms });
            unsafe { libc::write(data[1], &b as *const u8 as *const libc::c_void, 1) };
        }
        loop {
            unsafe { libc::pause() };
        }
    }
    say(&format!("ready helper {helper}"));
    let t = std::time::Instant::now();
    wait_line();
    let go_ns = t.elapsed().as_nanos();
    let mut b = 0u8;
    unsafe { libc::write(go[1], &b as *const u8 as *const libc::c_void, 1) };
    // Each call's time, so a test can tell which could hold a long block.
    let mut calls_ns = Vec::new();
    for _ in 0..2 * n {
        let t = std::time::Instant::now();
        let r = unsafe { libc::read(data[0], &mut b as *mut u8 as *mut libc::c_void, 1) };
        calls_ns.push(t.elapsed().as_nanos());
        assert_eq!(r, 1, "reading the helper's pipe");
    }
    // u128: the stack's top must be 16-byte aligned.
    let mut stack = vec![0u128; 4096];
    let mut pids = Vec::new();
    for _ in 0..n {
        let mut ms = long_ms;
        let t = std::time::Instant::now();
        // Safety: the child runs `vfork_child` on its own stack, sharing
        // our memory (CLONE_VM) while we wait (CLONE_VFORK).
        let pid = unsafe {
            libc::clone(
                vfork_child,
                stack.as_mut_ptr().add(stack.len()) as *mut libc::c_void,
                libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
                &mut ms as *mut u64 as *mut libc::c_void,
            )
        };
        calls_ns.push(t.elapsed().as_nanos());
        assert!(pid > 0, "clone(CLONE_VFORK)");
        pids.push(pid);
    }
    for pid in pids {
        say(&format!("vfork {pid}"));
    }
    let calls: Vec<String> = calls_ns.iter().map(u128::to_string).collect();
    say(&format!("blocking {go_ns} {}", calls.join(" ")));
    say("done");
    wait_eof();
}
