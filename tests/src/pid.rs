//! Processes given a chosen pid, for tests of pid reuse: clone3(2) with
//! `set_tid` (Linux 5.5; needs CAP_SYS_ADMIN over the pid namespace, which
//! root has in the initial one). The one copy of this for the test files
//! and `vitals-workload`.

use std::{ffi::CString, io, os::unix::ffi::OsStrExt, path::Path, time::Duration};

/// `struct clone_args` of clone3(2) up to `set_tid_size` (CLONE_ARGS_SIZE_VER1).
#[repr(C)]
#[derive(Default)]
struct CloneArgs {
    flags: u64,
    pidfd: u64,
    child_tid: u64,
    parent_tid: u64,
    exit_signal: u64,
    stack: u64,
    stack_size: u64,
    tls: u64,
    set_tid: u64,
    set_tid_size: u64,
}

/// A child started by [`spawn_with_pid`], in a process group of its own.
/// Dropped unreaped, the group is killed and the child reaped.
pub struct PidChild {
    pid: u32,
    reaped: bool,
}

impl PidChild {
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Waits for the child; returns its wait status.
    pub fn wait(mut self) -> i32 {
        let mut status = 0;
        let r = unsafe { libc::waitpid(self.pid as i32, &mut status, 0) };
        assert_eq!(r, self.pid as i32, "waitpid({})", self.pid);
        self.reaped = true;
        status
    }

    /// Waits for the child and asserts it exited with 0.
    pub fn wait_success(self) {
        let status = self.wait();
        assert!(
            libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
            "child exited with status {status:#x}"
        );
    }
}

impl Drop for PidChild {
    fn drop(&mut self) {
        if !self.reaped {
            unsafe {
                libc::kill(-(self.pid as i32), libc::SIGKILL);
                libc::waitpid(self.pid as i32, std::ptr::null_mut(), 0);
            }
        }
    }
}

/// Starts `exe` with `argv` (argv[0] included) as a child whose pid is
/// `pid`, once. The error is clone3's: EEXIST while the pid is in use (or
/// not yet released by its last holder), EPERM without CAP_SYS_ADMIN.
pub fn spawn_with_pid(pid: u32, exe: &Path, argv: &[&str]) -> io::Result<PidChild> {
    // Everything the child needs is allocated before the clone: between
    // clone and execv the child of a multithreaded process may only call
    // async-signal-safe functions.
    let path = CString::new(exe.as_os_str().as_bytes()).unwrap();
    let argv: Vec<CString> = argv.iter().map(|a| CString::new(*a).unwrap()).collect();
    let mut ptrs: Vec<*const libc::c_char> = argv.iter().map(|a| a.as_ptr()).collect();
    ptrs.push(std::ptr::null());
    let want = pid as libc::pid_t;
    let args = CloneArgs {
        exit_signal: libc::SIGCHLD as u64,
        set_tid: &want as *const libc::pid_t as u64,
        set_tid_size: 1,
        ..Default::default()
    };
    let r = unsafe {
        libc::syscall(
            libc::SYS_clone3,
            &args as *const CloneArgs,
            std::mem::size_of::<CloneArgs>(),
        )
    };
    match r {
        0 => unsafe {
            // Its own group, so the guard kills whatever it starts too.
            libc::setpgid(0, 0);
            libc::execv(path.as_ptr(), ptrs.as_ptr());
            libc::_exit(127)
        },
        r if r > 0 => Ok(PidChild {
            pid: r as u32,
            reaped: false,
        }),
        _ => Err(io::Error::last_os_error()),
    }
}

/// [`spawn_with_pid`], retried for up to a second while the pid's old
/// holder is still being released (EEXIST).
pub fn spawn_with_pid_retrying(pid: u32, exe: &Path, argv: &[&str]) -> PidChild {
    for _ in 0..1000 {
        match spawn_with_pid(pid, exe, argv) {
            Ok(c) => return c,
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {
                std::thread::sleep(Duration::from_millis(1))
            }
            Err(e) => panic!("clone3 with set_tid {pid}: {e}"),
        }
    }
    panic!("pid {pid} stayed taken");
}
