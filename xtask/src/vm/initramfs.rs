//! The guest's whole userspace, as a newc cpio the kernel unpacks into RAM
//! (Debian's cloud kernels have no 9p, so nothing is shared from the host):
//! a static busybox, the test binaries stripped of debug info (symbol
//! tables stay: the fault-stack test symbolises the workload), the shared
//! libraries and dynamic loader they name, the kernel's virtio modules, the
//! checks script, and an /init that mounts /proc, /sys, devtmpfs, tracefs,
//! debugfs and bpffs, loads the modules, runs the checks and powers off.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context, Result};
use object::{
    elf,
    read::elf::{ElfFile64, FileHeader as _, ProgramHeader as _},
    Endianness,
};

use super::{apt, binaries::Binaries, kernel::Kernel, Arch};
use crate::util::{run, workspace_root};

/// Where the loader and libraries of each arch live on this machine
/// (arm64's from libc6-arm64-cross, which gcc-aarch64-linux-gnu pulls in).
fn lib_dirs(arch: Arch) -> &'static [&'static str] {
    match arch {
        Arch::X86_64 => &[
            "/lib/x86_64-linux-gnu",
            "/usr/lib/x86_64-linux-gnu",
            "/lib64",
            "/usr/lib64",
            // libbase/liblog/libcutils of the AOSP loader (bpfloader.rs).
            crate::android_check::loader::DEBIAN_ANDROID_LIB,
        ],
        Arch::Arm64 => &["/usr/aarch64-linux-gnu/lib"],
    }
}

fn objcopy(arch: Arch) -> &'static str {
    match arch {
        Arch::X86_64 => "objcopy",
        Arch::Arm64 => "aarch64-linux-gnu-objcopy",
    }
}

const INIT: &str = r#"#!/bin/sh
# /init of the kernel-matrix guests (xtask/src/vm/initramfs.rs).
/bin/busybox --install -s /bin
export PATH=/bin LD_LIBRARY_PATH=/lib HOME=/tmp TMPDIR=/tmp
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mount -t tmpfs tmpfs /tmp
mount -t tracefs tracefs /sys/kernel/tracing
mount -t debugfs debugfs /sys/kernel/debug
mount -t bpf bpf /sys/fs/bpf
for m in $(cat /vm/modules.order); do
    insmod "/vm/modules/$m.ko" || echo "@@vm insmod $m failed"
done
# The tests' official decoder runs on the host, through the relay.
export VITALS_PYTHON=/vm/bin/vitals-vm-relay
cd /tmp
sh /vm/run-checks.sh
echo "@@vm kernel log"
dmesg | grep -iE 'bpf|bug|warn|error|oops|call trace|hung' | tail -n 40
sync
reboot -f
"#;

/// Writes the guest's initramfs for `kernel` to `path`. `extra`: more
/// files (guest path, host file, whether it is a program to strip and
/// give its libraries).
pub fn write(
    path: &Path,
    arch: Arch,
    bins: &Binaries,
    extra: &[(&str, &Path, bool)],
    kernel: &Kernel,
    script: &str,
) -> Result<()> {
    let mut c = Cpio::default();
    for d in [
        "bin",
        "dev",
        "proc",
        "sys",
        "tmp",
        "lib",
        "lib64",
        "vm",
        "vm/bin",
        "vm/modules",
    ] {
        c.dir(d);
    }
    // The kernel opens /dev/console for /init before devtmpfs is mounted.
    c.char_dev("dev/console", 5, 1);
    c.file("bin/busybox", 0o755, &read(&apt::busybox(arch)?)?);
    c.symlink("bin/sh", "busybox");
    c.file("init", 0o755, INIT.as_bytes());
    c.file("vm/run-checks.sh", 0o755, script.as_bytes());

    let stage = workspace_root().join("target/vm/stage").join(arch.name());
    std::fs::create_dir_all(&stage)?;
    let mut programs: Vec<(String, &Path)> = bins
        .tests
        .iter()
        .map(|(f, p)| (f.clone(), p.as_path()))
        .collect();
    programs.extend([
        ("vitalsd".to_owned(), bins.vitalsd.as_path()),
        ("vitals-workload".to_owned(), bins.workload.as_path()),
        ("fake-perfetto".to_owned(), bins.fake_perfetto.as_path()),
        ("vitals-vm-relay".to_owned(), bins.relay.as_path()),
    ]);
    let mut libs = BTreeMap::new();
    for (name, src) in &programs {
        let staged = strip(arch, src, &stage.join(name))?;
        let bytes = read(&staged)?;
        needed(arch, &bytes, &mut libs)?;
        c.file(&format!("vm/bin/{name}"), 0o755, &bytes);
    }
    for (guest, src, program) in extra {
        let guest = guest.trim_start_matches('/');
        let bytes = if *program {
            let name = Path::new(guest).file_name().unwrap();
            let bytes = read(&strip(arch, src, &stage.join(name))?)?;
            needed(arch, &bytes, &mut libs)?;
            bytes
        } else {
            read(src)?
        };
        c.file(guest, 0o755, &bytes);
    }
    for (guest_path, host_path) in &libs {
        c.file(guest_path.trim_start_matches('/'), 0o755, &read(host_path)?);
    }

    let mut order = String::new();
    for (name, ko) in &kernel.modules {
        c.file(&format!("vm/modules/{name}.ko"), 0o644, ko);
        order.push_str(name);
        order.push('\n');
    }
    c.file("vm/modules.order", 0o644, order.as_bytes());
    let bytes = c.finish();
    std::fs::write(path, bytes).with_context(|| format!("writing {}", path.display()))
}

fn read(p: &Path) -> Result<Vec<u8>> {
    std::fs::read(p).with_context(|| format!("reading {}", p.display()))
}

/// A copy without debug info (tens of MB less per binary to hold in the
/// guest's RAM), redone only when the source changed: a stamp beside the
/// copy names the source's path, size and mtime.
fn strip(arch: Arch, src: &Path, dst: &Path) -> Result<PathBuf> {
    let meta = src
        .metadata()
        .with_context(|| format!("reading {}", src.display()))?;
    let stamp = format!(
        "{}\n{}\n{:?}\n",
        src.display(),
        meta.len(),
        meta.modified()?
    );
    let stamp_path = dst.with_extension("src");
    if !dst.exists() || std::fs::read_to_string(&stamp_path).ok().as_deref() != Some(&stamp) {
        run(Command::new(objcopy(arch))
            .arg("--strip-debug")
            .arg(src)
            .arg(dst))?;
        std::fs::write(&stamp_path, stamp)?;
    }
    Ok(dst.to_owned())
}

/// Adds the loader and every library `elf` needs (recursively) to `libs`:
/// guest path → host file. Libraries go to /lib (the init script sets
/// LD_LIBRARY_PATH), the loader to the path the binaries name.
fn needed(arch: Arch, bytes: &[u8], libs: &mut BTreeMap<String, PathBuf>) -> Result<()> {
    let file = ElfFile64::<Endianness>::parse(bytes).context("parsing an ELF binary")?;
    let endian = file.endian();
    let header = file.elf_header();
    for ph in header.program_headers(endian, bytes)? {
        if let Some(interp) = ph.interpreter(endian, bytes)? {
            let interp = String::from_utf8_lossy(interp).into_owned();
            if let std::collections::btree_map::Entry::Vacant(e) = libs.entry(interp) {
                let name = Path::new(e.key())
                    .file_name()
                    .unwrap()
                    .to_string_lossy()
                    .into_owned();
                e.insert(find_lib(arch, &name)?);
            }
        }
    }
    let sections = header.sections(endian, bytes)?;
    let table = sections.dynamic_table(endian, bytes)?;
    let mut names = Vec::new();
    for d in &table {
        if d.tag == elf::DT_NEEDED {
            names.push(String::from_utf8_lossy(table.string(d)?).into_owned());
        }
    }
    for name in names {
        let guest = format!("/lib/{name}");
        if libs.contains_key(&guest) {
            continue;
        }
        let host = find_lib(arch, &name)?;
        libs.insert(guest, host.clone());
        needed(arch, &read(&host)?, libs)?;
    }
    Ok(())
}

fn find_lib(arch: Arch, name: &str) -> Result<PathBuf> {
    for d in lib_dirs(arch) {
        let p = Path::new(d).join(name);
        if p.exists() {
            // The file itself, not the symlink.
            return p
                .canonicalize()
                .with_context(|| format!("resolving {}", p.display()));
        }
    }
    bail!("{name} ({}) not found in {:?}", arch.name(), lib_dirs(arch))
}

/// A newc ("070701") cpio archive, the format the kernel's initramfs
/// unpacker reads (Documentation/driver-api/early-userspace/buffer-format.rst).
#[derive(Default)]
struct Cpio {
    out: Vec<u8>,
    ino: u32,
}

const S_IFDIR: u32 = 0o040000;
const S_IFREG: u32 = 0o100000;
const S_IFLNK: u32 = 0o120000;
const S_IFCHR: u32 = 0o020000;

impl Cpio {
    fn entry(&mut self, name: &str, mode: u32, data: &[u8], rdev: (u32, u32)) {
        self.ino += 1;
        let fields = [
            self.ino,
            mode,
            0, // uid
            0, // gid
            if mode & S_IFDIR != 0 { 2 } else { 1 },
            0, // mtime
            data.len() as u32,
            0, // devmajor
            0, // devminor
            rdev.0,
            rdev.1,
            name.len() as u32 + 1,
            0, // check
        ];
        self.out.extend_from_slice(b"070701");
        for f in fields {
            self.out.extend_from_slice(format!("{f:08X}").as_bytes());
        }
        self.out.extend_from_slice(name.as_bytes());
        self.out.push(0);
        self.pad();
        self.out.extend_from_slice(data);
        self.pad();
    }

    fn pad(&mut self) {
        while !self.out.len().is_multiple_of(4) {
            self.out.push(0);
        }
    }

    fn dir(&mut self, name: &str) {
        self.entry(name, S_IFDIR | 0o755, &[], (0, 0));
    }

    fn file(&mut self, name: &str, perm: u32, data: &[u8]) {
        self.entry(name, S_IFREG | perm, data, (0, 0));
    }

    fn symlink(&mut self, name: &str, target: &str) {
        self.entry(name, S_IFLNK | 0o777, target.as_bytes(), (0, 0));
    }

    fn char_dev(&mut self, name: &str, major: u32, minor: u32) {
        self.entry(name, S_IFCHR | 0o600, &[], (major, minor));
    }

    fn finish(mut self) -> Vec<u8> {
        self.entry("TRAILER!!!", 0, &[], (0, 0));
        self.out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpio_entries_are_newc_and_aligned() {
        let mut c = Cpio::default();
        c.file("a", 0o644, b"xyz");
        let out = c.finish();
        assert!(out.starts_with(b"070701"));
        // 110-byte header + "a\0" padded to 112, then 3 data bytes padded to 4.
        assert_eq!(&out[110..112], b"a\0");
        assert_eq!(&out[112..115], b"xyz");
        assert_eq!(&out[116..122], b"070701");
        assert_eq!(out.len() % 4, 0);
    }
}
