//! `uffd-block`: a thread that blocks in S inside a page fault, not a
//! syscall: a missing page of a userfaultfd-registered mapping
//! (handle_userfault sleeps TASK_INTERRUPTIBLE for a user fault) that a
//! second thread fills after sleeping, with UFFDIO_COPY, which wakes the
//! faulting thread. ART's concurrent compaction blocks threads so.
//!
//! The uAPI of linux/userfaultfd.h, which the libc crate does not carry:
//! `_IOWR(0xAA, nr, size)` ioctls, the same on x86_64 and arm64.

use std::time::Duration;

use super::{say, spawn_at_go, wait_eof, wait_line};

const UFFD_API: u64 = 0xAA;
const UFFDIO_API: libc::c_ulong = 0xc018_aa3f;
const UFFDIO_REGISTER: libc::c_ulong = 0xc020_aa00;
const UFFDIO_COPY: libc::c_ulong = 0xc028_aa03;
const UFFDIO_REGISTER_MODE_MISSING: u64 = 1;
const UFFD_EVENT_PAGEFAULT: u8 = 0x12;

/// struct uffdio_api.
#[repr(C)]
struct UffdioApi {
    api: u64,
    features: u64,
    ioctls: u64,
}

/// struct uffdio_register (its uffdio_range inline).
#[repr(C)]
struct UffdioRegister {
    start: u64,
    len: u64,
    mode: u64,
    ioctls: u64,
}

/// struct uffdio_copy.
#[repr(C)]
struct UffdioCopy {
    dst: u64,
    src: u64,
    len: u64,
    mode: u64,
    copy: i64,
}

/// The faulting function: reads the first byte of a missing page. The
/// load is this function's own instruction: the workload is built
/// without frame pointers, so of a user stack only the leaf frame (the
/// faulting IP) is sure, and `read_volatile` is a call of its own in a
/// debug build.
#[inline(never)]
fn vitals_fault_on_page(page: *const u8) -> u8 {
    let byte: u32;
    // SAFETY: a one-byte load from a page of our registered mapping; it
    // blocks in the kernel until the filler copies a page in.
    #[cfg(target_arch = "x86_64")]
    unsafe {
        std::arch::asm!("movzx {b:e}, byte ptr [{p}]", p = in(reg) page, b = out(reg) byte,
            options(nostack, readonly));
    }
    #[cfg(target_arch = "aarch64")]
    unsafe {
        std::arch::asm!("ldrb {b:w}, [{p}]", p = in(reg) page, b = out(reg) byte,
            options(nostack, readonly));
    }
    byte as u8
}

/// The filler: sleeps `ms`, then copies `src` into the faulting page,
/// which wakes the faulting thread (the waker's stack is taken here).
#[inline(never)]
fn vitals_fill_after_sleep(uffd: i32, dst: u64, src: &[u8], ms: u64) {
    std::thread::sleep(Duration::from_millis(ms));
    let mut copy = UffdioCopy {
        dst,
        src: src.as_ptr() as u64,
        len: src.len() as u64,
        mode: 0,
        copy: 0,
    };
    // SAFETY: the ioctl reads and writes `copy`, and reads `src`.
    let rc = unsafe { raw_ioctl(uffd, UFFDIO_COPY, (&raw mut copy).cast()) };
    assert_eq!(rc, 0, "UFFDIO_COPY: errno {}", -rc);
}

/// ioctl(2) with the `syscall` instruction inlined into the caller, as
/// `raw_io` does for read and write: a frame-pointer walk from libc's
/// wrapper, which sets up no frame, would skip its caller, the function
/// the waker's stack must name.
#[inline(always)]
unsafe fn raw_ioctl(fd: i32, request: libc::c_ulong, arg: *mut u8) -> i64 {
    let ret: i64;
    #[cfg(target_arch = "x86_64")]
    unsafe {
        std::arch::asm!("syscall", inlateout("rax") libc::SYS_ioctl => ret,
            in("rdi") fd as i64, in("rsi") request, in("rdx") arg,
            lateout("rcx") _, lateout("r11") _, options(nostack));
    }
    #[cfg(target_arch = "aarch64")]
    unsafe {
        std::arch::asm!("svc 0", inlateout("x0") fd as i64 => ret, in("x1") request,
            in("x2") arg, in("x8") libc::SYS_ioctl, options(nostack));
    }
    ret
}

/// `uffd-block <times> <ms>`: prints `tids <faulter> <filler>` and
/// `ready`; on a line from stdin the faulter (`vitals-faulter`) touches
/// `times` missing pages one after another, each filled by the filler
/// (`vitals-filler`) after `ms`, and makes a syscall (getppid) after each
/// page, at another user address than the fault's. Then `done`.
pub(crate) fn uffd_block(times: u64, ms: u64) {
    // SAFETY: plain syscalls and ioctls on the descriptor made here, with
    // the uAPI's structs.
    let uffd = unsafe { libc::syscall(libc::SYS_userfaultfd, libc::O_CLOEXEC) } as i32;
    assert!(
        uffd >= 0,
        "userfaultfd: {}",
        std::io::Error::last_os_error()
    );
    let mut api = UffdioApi {
        api: UFFD_API,
        features: 0,
        ioctls: 0,
    };
    assert_eq!(unsafe { libc::ioctl(uffd, UFFDIO_API, &mut api) }, 0);
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
    let len = page * times as usize;
    // SAFETY: a fresh anonymous mapping, never unmapped (the process ends).
    let region = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert_ne!(region, libc::MAP_FAILED);
    let region = region as u64;
    let mut reg = UffdioRegister {
        start: region,
        len: len as u64,
        mode: UFFDIO_REGISTER_MODE_MISSING,
        ioctls: 0,
    };
    assert_eq!(
        unsafe { libc::ioctl(uffd, UFFDIO_REGISTER, &mut reg) },
        0,
        "UFFDIO_REGISTER: {}",
        std::io::Error::last_os_error()
    );
    let go = std::sync::Arc::new(std::sync::Barrier::new(3));
    let spawn = |name: &str, body: Box<dyn FnOnce() + Send>| spawn_at_go(&go, name, body);
    let (faulter, f) = spawn(
        "vitals-faulter",
        Box::new(move || {
            for i in 0..times {
                let b = vitals_fault_on_page((region + i * page as u64) as *const u8);
                assert_eq!(b, 0x5a);
                unsafe { libc::getppid() };
            }
        }),
    );
    let (filler, l) = spawn(
        "vitals-filler",
        Box::new(move || {
            let src = vec![0x5au8; page];
            for _ in 0..times {
                // struct uffd_msg: event (u8) first, then the fault's
                // flags and address (u64s at 8 and 16).
                let mut msg = [0u8; 32];
                let n = unsafe { libc::read(uffd, msg.as_mut_ptr().cast(), msg.len()) };
                assert_eq!(n, 32, "read of the userfaultfd");
                assert_eq!(msg[0], UFFD_EVENT_PAGEFAULT);
                let addr = u64::from_ne_bytes(msg[16..24].try_into().unwrap());
                vitals_fill_after_sleep(uffd, addr & !(page as u64 - 1), &src, ms);
            }
        }),
    );
    say(&format!("tids {f} {l}"));
    say("ready");
    wait_line();
    go.wait();
    faulter.join().unwrap();
    filler.join().unwrap();
    say("done");
    wait_eof();
}
