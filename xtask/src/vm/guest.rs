//! One guest: QEMU in TCG (this machine's KVM hangs guests) with 2 vCPUs,
//! the kernel image and its initramfs, the serial console on a pipe and
//! the decoder relay's virtio-serial port on a unix socket.
//!
//! QEMU runs in its own process group, owned by a guard whose Drop kills
//! the whole group, so no guest outlives the run: not on success, not on a
//! timeout (the guest's unfinished checks then fail), not on an error or a
//! panic in xtask; and if xtask itself is killed, PR_SET_PDEATHSIG takes
//! QEMU with it.

use std::{
    io::{Read, Write},
    os::unix::{net::UnixStream, process::CommandExt},
    path::Path,
    process::{Child, Command, Stdio},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use anyhow::{Context, Result};

use super::{kernel::Kernel, relay, Arch};

/// What a guest printed, and how it ended.
pub struct GuestRun {
    pub console: String,
    /// The checks script ran to its end.
    pub finished: bool,
    pub timed_out: bool,
}

/// Kills QEMU's process group when dropped.
struct Qemu {
    child: Child,
}

impl Drop for Qemu {
    fn drop(&mut self) {
        // The group id is QEMU's pid (process_group(0) at spawn).
        let pgid = self.child.id() as i32;
        unsafe { libc::kill(-pgid, libc::SIGKILL) };
        let _ = self.child.wait();
    }
}

/// Boot parameters of some cells (arch, kernel series, parameters).
/// x86_64 6.1 boots fully preemptible: Debian's kernels are built with
/// PREEMPT_DYNAMIC and default to voluntary preemption, under which a
/// bpf() syscall is never preempted; Android's GKI kernels are
/// preempt=full, where a task preempted inside bpf() leaves
/// bpf_prog_active raised and the classic programs blind on its CPU
/// (the blind_windows test sees that here, and nowhere else).
pub(super) const CELL_CMDLINE: &[(Arch, &str, &str)] = &[(Arch::X86_64, "6.1", "preempt=full")];

/// The extra boot parameters of `arch`'s `series` cell.
fn cell_cmdline(arch: Arch, series: &str) -> String {
    CELL_CMDLINE
        .iter()
        .filter(|(a, s, _)| *a == arch && *s == series)
        .map(|(_, _, p)| format!(" {p}"))
        .collect()
}

fn qemu_command(arch: Arch, series: &str, kernel: &Kernel, initrd: &Path, sock: &Path) -> Command {
    let (bin, machine, cmdline) = match arch {
        // thread=single: one host thread runs both vCPUs in turn. Under
        // multi-threaded TCG about 5 of 50 x86_64 boots hung or hit a soft
        // lockup, always at a tracepoint's attach or detach: the kernel
        // was rewriting the call site in __schedule (text_poke_bp) and the
        // other vCPU sat in exc_int3 at that site, taking the temporary
        // int3 again (its bytes were already restored in memory), while
        // the patching CPU waited for it in on_each_cpu(). Our reading: a
        // stale translation of code one vCPU patched while another ran
        // it. Taking turns, the other vCPU runs only between the patching
        // CPU's steps. arm64 patches kernel text under stop_machine, never
        // hung, and keeps multi-threaded TCG.
        Arch::X86_64 => (
            "qemu-system-x86_64",
            vec!["-accel", "tcg,thread=single", "-M", "pc", "-cpu", "max"],
            "console=ttyS0",
        ),
        // pauth-impdef: QEMU's cheap pointer-authentication hash instead of
        // the architected QARMA, which costs TCG much time on every call.
        Arch::Arm64 => (
            "qemu-system-aarch64",
            vec!["-accel", "tcg", "-M", "virt", "-cpu", "max,pauth-impdef=on"],
            "console=ttyAMA0",
        ),
    };
    let mut c = Command::new(bin);
    c.args(machine)
        .args(["-smp", "2", "-m", "2048"])
        .args(["-nodefaults", "-display", "none", "-no-reboot"])
        .args(["-serial", "stdio", "-monitor", "none"])
        .arg("-kernel")
        .arg(&kernel.image)
        .arg("-initrd")
        .arg(initrd)
        // panic=-1: a kernel panic reboots, which -no-reboot turns into
        // QEMU exiting. softlockup_panic=1: a CPU stuck in the kernel
        // (seen once: an x86_64 6.1 guest's test thread stuck on CPU 1 for
        // 458 s) ends the guest at once, its unfinished checks failing,
        // instead of holding the run until the timeout, after printing
        // every CPU's stack (softlockup_all_cpu_backtrace: what the other
        // vCPU was doing). loglevel=1 keeps printk off the console the
        // checks' results are parsed from (the init script prints the
        // kernel's warnings at the end);
        // VITALS_VM_LOGLEVEL raises it to diagnose such a guest.
        .args([
            "-append",
            &format!(
                "{cmdline}{} panic=-1 softlockup_panic=1 softlockup_all_cpu_backtrace=1 loglevel={}",
                cell_cmdline(arch, series),
                std::env::var("VITALS_VM_LOGLEVEL")
                    .ok()
                    .and_then(|v| v.parse::<u8>().ok())
                    .unwrap_or(1)
            ),
        ])
        .args(["-device", "virtio-rng-pci"])
        .args(["-device", "virtio-serial-pci,id=vser"])
        .arg("-chardev")
        .arg(format!(
            "socket,id=relay,path={},server=on,wait=off",
            sock.display()
        ))
        .args([
            "-device",
            "virtserialport,bus=vser.0,chardev=relay,name=vitals.relay",
        ]);
    c
}

/// Boots the guest and waits for it to power off (or for `timeout`).
pub fn boot(
    arch: Arch,
    series: &str,
    kernel: &Kernel,
    initrd: &Path,
    work: &Path,
    log: &Path,
    timeout: Duration,
) -> Result<GuestRun> {
    let sock = work.join("relay.sock");
    let _ = std::fs::remove_file(&sock);
    let mut cmd = qemu_command(arch, series, kernel, initrd, &sock);
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    // Its own process group keeps a terminal's Ctrl-C from reaching QEMU,
    // and a signal that kills xtask skips the Drop guard: the kernel then
    // kills QEMU with its parent instead.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    eprintln!("vm-test: {cmd:?}");
    let mut qemu = Qemu {
        child: cmd
            .spawn()
            .context("spawning QEMU (cargo xtask setup installs it)")?,
    };
    let tag = format!("[{} {}]", arch.name(), kernel.release);
    let console = Arc::new(Mutex::new(String::new()));
    let mut log_file =
        std::fs::File::create(log).with_context(|| format!("creating {}", log.display()))?;
    let _ = writeln!(log_file, "{cmd:?}");
    let log_file = Arc::new(Mutex::new(log_file));

    let readers: Vec<_> = [
        Box::new(qemu.child.stdout.take().unwrap()) as Box<dyn Read + Send>,
        Box::new(qemu.child.stderr.take().unwrap()),
    ]
    .into_iter()
    .map(|src| {
        let (console, log_file, tag) = (console.clone(), log_file.clone(), tag.clone());
        std::thread::spawn(move || echo(src, &console, &log_file, &tag))
    })
    .collect();

    // The relay's socket appears once QEMU has set up its chardevs.
    let deadline = Instant::now() + Duration::from_secs(30);
    let stream = loop {
        match UnixStream::connect(&sock) {
            Ok(s) => break Some(s),
            Err(_) if Instant::now() < deadline && qemu.child.try_wait()?.is_none() => {
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(e) => {
                eprintln!("vm-test: {tag} relay socket: {e}");
                break None;
            }
        }
    };
    let relay_thread = stream.map(|s| {
        let work = work.to_owned();
        std::thread::spawn(move || relay::serve(s, &work))
    });

    let started = Instant::now();
    let mut timed_out = false;
    loop {
        if let Some(status) = qemu.child.try_wait()? {
            eprintln!(
                "vm-test: {tag} QEMU exited ({status}) after {:.0} s",
                started.elapsed().as_secs_f64()
            );
            break;
        }
        if started.elapsed() > timeout {
            eprintln!(
                "vm-test: {tag} timed out after {} s; killing it",
                timeout.as_secs()
            );
            timed_out = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    // Kills the group (a no-op if QEMU already exited) and reaps QEMU, so
    // the pipes and the relay socket close and the threads end.
    drop(qemu);
    for r in readers {
        let _ = r.join();
    }
    if let Some(t) = relay_thread {
        let _ = t.join();
    }
    let console = console.lock().unwrap().clone();
    Ok(GuestRun {
        finished: console.contains("@@vm done"),
        console,
        timed_out,
    })
}

/// Copies QEMU's output to the log, to our stderr (prefixed, line by line)
/// and to the text the checks are parsed from.
pub fn echo(
    mut src: Box<dyn Read + Send>,
    console: &Mutex<String>,
    log: &Mutex<std::fs::File>,
    tag: &str,
) {
    let mut buf = [0u8; 8192];
    let mut line = Vec::new();
    while let Ok(n) = src.read(&mut buf) {
        if n == 0 {
            break;
        }
        let chunk = &buf[..n];
        let _ = log.lock().unwrap().write_all(chunk);
        console
            .lock()
            .unwrap()
            .push_str(&String::from_utf8_lossy(chunk));
        for &b in chunk {
            if b == b'\n' {
                let text = String::from_utf8_lossy(&line);
                eprintln!("{tag} {}", text.trim_end_matches('\r'));
                line.clear();
            } else {
                line.push(b);
            }
        }
    }
    if !line.is_empty() {
        eprintln!("{tag} {}", String::from_utf8_lossy(&line));
    }
}
