//! The guest's root file system: Debian bookworm installed by debootstrap
//! into target/bench-offcpu/rootfs (once; a marker names the package set
//! it holds), with the cloud kernel and its own headers (bcc compiles its
//! programs at run time against /lib/modules/$(uname -r)/build), bcc's
//! tools and perf. Each run copies the bench's binaries in and packs the
//! tree into an ext4 image (`mke2fs -d`) the guest boots from over
//! virtio-blk; Debian's initramfs (built by the kernel's postinst) loads
//! virtio_blk and ext4.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context, Result};

use crate::util::{output, run, workspace_root};

/// Installed with the base system. linux-headers-cloud-amd64 names the
/// headers of exactly the image linux-image-cloud-amd64 names (one suite),
/// and pulls in -common and linux-kbuild.
const PACKAGES: &[&str] = &[
    "linux-image-cloud-amd64",
    "linux-headers-cloud-amd64",
    "initramfs-tools",
    "bpfcc-tools",
    "linux-perf",
    // bpftool prog show: the per-program run time of cost.rs.
    "bpftool",
    "util-linux",
    "procps",
    "kmod",
];
const SUITE: &str = "bookworm";
/// Marks a finished install and names its package set.
const MARKER: &str = ".vitals-bench-packages";
/// Where the bench's own files go inside the guest.
pub const BENCH_DIR: &str = "opt/vitals-bench";

pub fn work_dir() -> PathBuf {
    workspace_root().join("target/bench-offcpu")
}

pub struct Rootfs {
    pub dir: PathBuf,
    /// `uname -r` of its kernel.
    pub release: String,
    pub vmlinuz: PathBuf,
    pub initrd: PathBuf,
}

/// The installed tree, installing it first when missing or stale.
pub fn ensure() -> Result<Rootfs> {
    let dir = work_dir().join("rootfs");
    let want = PACKAGES.join(",");
    if std::fs::read_to_string(dir.join(MARKER)).ok().as_deref() != Some(want.as_str()) {
        install(&dir, &want)?;
    }
    inspect(&dir)
}

fn install(dir: &Path, packages: &str) -> Result<()> {
    let mirror = crate::vm::debian_mirror()?;
    let tmp = work_dir().join("rootfs.tmp");
    let cache = work_dir().join("debs");
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&cache)?;
    eprintln!("bench offcpu: debootstrap {SUITE} with {packages} (about 2 minutes)");
    run(Command::new("debootstrap")
        .args(["--variant=minbase", "--include", packages])
        .arg(format!("--cache-dir={}", cache.display()))
        .arg(SUITE)
        .arg(&tmp)
        .arg(&mirror))
    .context("debootstrap (cargo xtask setup installs it)")?;
    inspect(&tmp)?;
    let _ = std::fs::remove_dir_all(dir);
    std::fs::rename(&tmp, dir).with_context(|| format!("moving {}", tmp.display()))?;
    std::fs::write(dir.join(MARKER), packages)?;
    Ok(())
}

/// The kernel, its initramfs and its headers, checked present.
fn inspect(dir: &Path) -> Result<Rootfs> {
    let boot = dir.join("boot");
    let vmlinuz = crate::vm::kernel::find_vmlinuz(&boot)
        .with_context(|| format!("reading {}", boot.display()))?
        .with_context(|| format!("no vmlinuz-* in {}", boot.display()))?;
    let release = vmlinuz.file_name().unwrap().to_string_lossy()["vmlinuz-".len()..].to_owned();
    let initrd = boot.join(format!("initrd.img-{release}"));
    if !initrd.is_file() {
        bail!(
            "{} missing (initramfs-tools did not build it)",
            initrd.display()
        );
    }
    // build is an absolute symlink, meant for inside the guest.
    let build = dir.join(format!("lib/modules/{release}/build"));
    let target = std::fs::read_link(&build)
        .with_context(|| format!("{}: no headers for {release}", build.display()))?;
    let headers = dir.join(target.strip_prefix("/").unwrap_or(&target));
    if !headers.join("Makefile").is_file() {
        bail!("{} has no Makefile: headers incomplete", headers.display());
    }
    for tool in [
        "usr/sbin/offwaketime-bpfcc",
        "usr/bin/perf",
        "usr/sbin/bpftool",
        "usr/bin/taskset",
    ] {
        if !dir.join(tool).exists() {
            bail!("{} missing from the guest's root", dir.join(tool).display());
        }
    }
    Ok(Rootfs {
        dir: dir.to_owned(),
        release,
        vmlinuz,
        initrd,
    })
}

/// Copies `files` (name, host path) into the guest's BENCH_DIR, writes its
/// init script and packs the tree into `image`, with `spare_mib` free for
/// the recordings.
pub fn pack(
    root: &Rootfs,
    files: &[(&str, &Path)],
    init: &str,
    image: &Path,
    spare_mib: u64,
) -> Result<()> {
    let bench = root.dir.join(BENCH_DIR);
    std::fs::create_dir_all(&bench)?;
    for (name, src) in files {
        std::fs::copy(src, bench.join(name))
            .with_context(|| format!("copying {} into the guest", src.display()))?;
    }
    let init_path = bench.join("init.sh");
    std::fs::write(&init_path, init)?;
    std::fs::set_permissions(
        &init_path,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )?;
    let used_kib: u64 = output(Command::new("du").args(["-sk"]).arg(&root.dir))?
        .split_whitespace()
        .next()
        .and_then(|v| v.parse().ok())
        .context("du -sk")?;
    let size_mib = used_kib / 1024 * 5 / 4 + spare_mib;
    let _ = std::fs::remove_file(image);
    run(Command::new("mke2fs")
        .args(["-q", "-t", "ext4", "-F", "-d"])
        .arg(&root.dir)
        .arg(image)
        .arg(format!("{size_mib}M")))
    .context("mke2fs -d (e2fsprogs)")
}
