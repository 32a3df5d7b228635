//! `cargo xtask bench offcpu` (issue #24 part 3): what vitalsd's off-CPU
//! capture costs a switch-heavy workload against nothing attached and
//! against bcc's `offwaketime` doing the same job, in one run with the
//! rounds interleaved; and what part 1's always-on off-CPU accounting
//! costs against the programs without it.
//!
//! bcc compiles its programs at run time against the running kernel's
//! headers, which hosts like this one (a custom kernel, no headers, no
//! IKHEADERS) do not have. So the bench runs in a guest: Debian bookworm's
//! cloud kernel with its own headers package (rootfs.rs), booted by QEMU,
//! and the rounds run there by this same xtask binary (guest.rs). This is
//! not part of CI.
//!
//! `--accel kvm` (the default) wants a KVM that runs a stock kernel;
//! `--accel tcg` emulates (slow: every figure is a TCG figure, see
//! `Accel::Tcg`).

mod cost;
mod guest;
mod rootfs;

pub use guest::run as run_in_guest;

use std::{
    io::{BufRead, BufReader, Write},
    os::unix::process::CommandExt,
    path::Path,
    process::{Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};

use crate::util::{workspace_root, Group};

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Accel {
    /// Near-native: the guest's instructions run on the CPU.
    Kvm,
    /// QEMU's emulator, one host thread for both vCPUs (as the kernel
    /// matrix runs x86_64; see vm/guest.rs for the text_poke hang that
    /// multi-threaded TCG showed at tracepoint attach). BPF programs, the
    /// kprobes' breakpoints and the workload are all translated code, so
    /// the losses are TCG's, not a real CPU's; the pairing within rounds
    /// still compares the tools on one footing.
    Tcg,
}

/// Why this machine's KVM cannot run the guest, if it cannot.
fn kvm_problem() -> Option<String> {
    let kvm = match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
    {
        Ok(f) => f,
        Err(e) => return Some(format!("opening /dev/kvm: {e}")),
    };
    // KVM_CREATE_VM = _IO(KVMIO, 0x01), KVMIO = 0xAE (linux/kvm.h).
    let vm = unsafe { libc::ioctl(std::os::fd::AsRawFd::as_raw_fd(&kvm), 0xAE01, 0) };
    if vm < 0 {
        return Some(format!(
            "KVM_CREATE_VM on /dev/kvm: {}",
            std::io::Error::last_os_error()
        ));
    }
    unsafe { libc::close(vm) };
    // PVM (kvm_pvm, a KVM for hosts that are themselves guests without
    // nested virtualisation) creates VMs, but runs an unmodified guest
    // kernel by emulating its privileged instructions. Measured here with
    // Debian's 6.1 cloud kernel: `-cpu host` failed on MSR 0x10a; with
    // arch-capabilities off the kernel took 5 minutes to reach the slab
    // allocator and stopped at a `lock cmpxchg16b` ("kvm-pvm: INTERNAL_ERROR
    // in batch emul" in the host's kernel log); without cx16 it printed
    // nothing after the EDD probe in 150 s.
    let hw = ["kvm_intel", "kvm_amd"]
        .iter()
        .any(|m| Path::new("/sys/module").join(m).exists());
    if Path::new("/sys/module/kvm_pvm").exists() && !hw {
        return Some(
            "this host's KVM is kvm_pvm (PVM), which boots a stock Debian kernel only \
             partly and stops at an instruction its emulator cannot run"
                .into(),
        );
    }
    None
}

/// The baseline build's name in the guest's bench directory.
const BASELINE_BIN: &str = "vitalsd-baseline";

fn init_script(rounds: usize, loops: u64, baseline: bool, settle_s: u64) -> String {
    let dir = rootfs::BENCH_DIR;
    let baseline = if baseline {
        format!(" --baseline /{dir}/{BASELINE_BIN}")
    } else {
        String::new()
    };
    format!(
        r#"#!/bin/sh
# PID 1 of the bench guest (xtask/src/bench_offcpu/mod.rs).
export PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root
mountpoint -q /proc || mount -t proc proc /proc
mountpoint -q /sys || mount -t sysfs sysfs /sys
mount -t tmpfs tmpfs /tmp
mount -t tracefs tracefs /sys/kernel/tracing
mount -t debugfs debugfs /sys/kernel/debug
mount -t bpf bpf /sys/fs/bpf
/{dir}/xtask bench-offcpu-guest --rounds {rounds} --loops {loops} --settle-s {settle_s} --vitalsd /{dir}/vitalsd{baseline}
echo "@@bench exit $?"
dmesg | grep -iE 'bug|warn|oops|call trace|hung' | tail -n 20
sync
# Power off; init must not exit meanwhile (the kernel would panic).
echo o > /proc/sysrq-trigger
sleep 60
"#
    )
}

/// `baseline`: another vitalsd build whose `record --offcpu` runs in the
/// same rounds, so a change is judged against its predecessor on one
/// footing (TCG's speed drifts threefold between days on this host).
pub fn run(
    rounds: usize,
    loops: u64,
    accel: Accel,
    timeout_min: u64,
    baseline: Option<&Path>,
    settle_s: u64,
) -> Result<()> {
    if let Some(b) = baseline {
        anyhow::ensure!(b.is_file(), "--baseline {}: no such file", b.display());
    }
    if accel == Accel::Kvm {
        if let Some(why) = kvm_problem() {
            bail!(
                "--accel kvm: {why}. `--accel tcg` runs the same bench emulated \
                 (hours-slow and TCG's figures; see Accel::Tcg)"
            );
        }
    }
    let root = rootfs::ensure()?;
    let work = rootfs::work_dir();
    let image = work.join("root.ext4");
    let xtask = std::env::current_exe().context("the xtask binary's path")?;
    let vitalsd = workspace_root().join("target/release/vitalsd");
    let mut files: Vec<(&str, &Path)> = vec![("xtask", &xtask), ("vitalsd", &vitalsd)];
    files.extend(baseline.map(|b| (BASELINE_BIN, b)));
    rootfs::pack(
        &root,
        &files,
        &init_script(rounds, loops, baseline.is_some(), settle_s),
        &image,
        2048,
    )?;
    let mut cmd = Command::new("qemu-system-x86_64");
    match accel {
        Accel::Kvm => cmd.args(["-accel", "kvm", "-cpu", "host"]),
        Accel::Tcg => cmd.args(["-accel", "tcg,thread=single", "-cpu", "max"]),
    };
    // 3 GiB: bcc's clang needs about 1 GiB while it compiles.
    cmd.args(["-smp", "2", "-m", "3072"])
        .args(["-nodefaults", "-display", "none", "-no-reboot"])
        .args(["-serial", "stdio", "-monitor", "none"])
        .arg("-kernel")
        .arg(&root.vmlinuz)
        .arg("-initrd")
        .arg(&root.initrd)
        .args([
            "-append",
            &format!(
                "root=/dev/vda rw console=ttyS0 init=/{}/init.sh panic=-1 loglevel=4",
                rootfs::BENCH_DIR
            ),
        ])
        .arg("-drive")
        .arg(format!("file={},if=virtio,format=raw", image.display()))
        .args(["-device", "virtio-rng-pci"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    // If xtask itself is killed (skipping Group's Drop), QEMU goes too.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    eprintln!(
        "bench offcpu: booting {} ({:?}): {cmd:?}",
        root.release, accel
    );
    let mut qemu = Group::spawn(&mut cmd).context("spawning qemu-system-x86_64")?;
    let log_path = work.join("console.log");
    let mut log = std::fs::File::create(&log_path)?;
    let (tx, rx) = mpsc::channel::<String>();
    let out = qemu.0.stdout.take().context("QEMU's stdout")?;
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(|l| l.ok()) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let deadline = Instant::now() + Duration::from_secs(timeout_min * 60);
    let mut exit_line = None;
    loop {
        match rx.recv_timeout(Duration::from_millis(500)) {
            Ok(line) => {
                let line = line.trim_end_matches('\r').to_owned();
                writeln!(log, "{line}")?;
                println!("{line}");
                if line.starts_with("@@bench exit") {
                    exit_line = Some(line);
                }
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
            Err(mpsc::RecvTimeoutError::Timeout) => {}
        }
        if Instant::now() > deadline {
            bail!(
                "the guest did not finish within {timeout_min} min (console: {})",
                log_path.display()
            );
        }
    }
    drop(qemu);
    match exit_line.as_deref() {
        Some("@@bench exit 0") => Ok(()),
        Some(other) => bail!(
            "the guest's bench failed ({other}); console: {}",
            log_path.display()
        ),
        None => bail!(
            "the guest stopped before the bench ended; console: {}",
            log_path.display()
        ),
    }
}
