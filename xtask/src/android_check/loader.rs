//! Check 1a: AOSP's own bpfloader loads `vitals.o`, and vitalsd, attached
//! from what it pinned, counts a spinner and a page-toucher within 10 % of
//! the kernel's /proc accounting, and captures from those pins
//! (`capture.rs`).
//!
//! The loader is `android/host-loader/` (our `main()` and forced-include
//! shim) compiled together with the AOSP tree's `Loader.cpp` and
//! `BpfLoader.cpp`, linked against Debian's libbase/liblog/libcutils. It
//! pins under the hard-coded `/sys/fs/bpf/`, so it runs in a private mount
//! namespace (`unshare -m`) with a fresh bpffs, mounted on a directory of
//! ours, bind-mounted there; the pins stay visible at that directory.

use std::{
    io::{BufRead, BufReader, Write},
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use anyhow::{bail, ensure, Context, Result};

use super::unseen::{within_unseen, Pid1Clock};
use crate::android_bpf;

/// Where AOSP's loader sources sit inside an AOSP tree as laid out in
/// ../shared/aosp (README there); an OEM tree has them at system/bpf and
/// packages/modules/Connectivity, see `AospTree`.
pub struct AospTree {
    /// system/bpf
    pub system_bpf: PathBuf,
    /// packages/modules/Connectivity/staticlibs/native
    pub connectivity_native: PathBuf,
    /// system/bpfprogs (Android 11's time_in_state.c; the bench's peer)
    pub bpfprogs: PathBuf,
    /// system/sepolicy
    pub sepolicy: PathBuf,
}

impl AospTree {
    /// The layout of ../shared/aosp, or of a full AOSP checkout.
    pub fn find(root: &Path) -> Option<Self> {
        let flat = Self {
            system_bpf: root.join("system_bpf"),
            connectivity_native: root.join("connectivity/staticlibs/native"),
            bpfprogs: root.join("system_bpfprogs_android11"),
            sepolicy: root.join("system_sepolicy"),
        };
        let full = Self {
            system_bpf: root.join("system/bpf"),
            connectivity_native: root.join("packages/modules/Connectivity/staticlibs/native"),
            bpfprogs: root.join("system/bpfprogs"),
            sepolicy: root.join("system/sepolicy"),
        };
        [flat, full]
            .into_iter()
            .find(|t| t.system_bpf.join("libbpf_android/Loader.cpp").is_file())
    }

    pub fn loader_cpp(&self) -> PathBuf {
        self.system_bpf.join("libbpf_android/Loader.cpp")
    }

    /// Include paths Loader.cpp and the bpf programs' headers need.
    pub fn include_dirs(&self) -> Vec<PathBuf> {
        vec![
            self.system_bpf.clone(),
            self.system_bpf.join("libbpf_android"),
            self.system_bpf.join("libbpf_android/include"),
            self.system_bpf.join("progs/include"),
            self.connectivity_native.join("bpf_headers/include"),
            self.connectivity_native
                .join("bpf_syscall_wrappers/include"),
        ]
    }
}

/// Debian's android-lib*-dev install the headers here and the libraries
/// under /usr/lib/<triple>/android.
pub const DEBIAN_ANDROID_INCLUDE: &str = "/usr/include/android";
pub const DEBIAN_ANDROID_LIB: &str = "/usr/lib/x86_64-linux-gnu/android";
pub const CLANGXX: &str = "clang++-22";

/// Compiles android/host-loader with AOSP's Loader.cpp into `out`.
pub fn build_loader(root: &Path, aosp: &AospTree, out: &Path) -> Result<()> {
    let harness = root.join("android/host-loader");
    std::fs::create_dir_all(out.parent().unwrap())?;
    let mut cmd = Command::new(CLANGXX);
    // -ftrivial-auto-var-init=zero: Soong's default for every platform
    // binary (build/soong cc/config/global.go, "Default to zero
    // initialization"). Loader.cpp relies on it: its `union bpf_attr req
    // = {...}` leaves the bytes past the command's fields uninitialised,
    // and a kernel whose bpf_attr is shorter than these headers' (5.10:
    // BPF_PROG_LOAD) refuses non-zero bytes there with E2BIG.
    cmd.args([
        "-std=c++17",
        "-O1",
        "-ftrivial-auto-var-init=zero",
        "-include",
    ])
    .arg(harness.join("shim.h"));
    for d in aosp.include_dirs() {
        cmd.arg("-I").arg(d);
    }
    cmd.arg("-I")
        .arg(DEBIAN_ANDROID_INCLUDE)
        .arg(harness.join("host_bpfloader.cpp"))
        .arg(aosp.loader_cpp())
        .arg(format!("-L{DEBIAN_ANDROID_LIB}"))
        .arg(format!("-Wl,-rpath,{DEBIAN_ANDROID_LIB}"))
        .args(["-lbase", "-llog", "-lcutils", "-o"])
        .arg(out);
    let o = cmd
        .output()
        .with_context(|| format!("running {CLANGXX} (cargo xtask setup installs clang-22)"))?;
    ensure!(
        o.status.success(),
        "building the host bpfloader failed:\n{cmd:?}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    Ok(())
}

/// A fresh bpffs mounted on a directory of ours; unmounted and removed on drop.
pub struct Bpffs {
    pub dir: PathBuf,
}

impl Bpffs {
    pub fn mount(dir: PathBuf) -> Result<Self> {
        std::fs::create_dir_all(&dir)?;
        let st = Command::new("mount")
            .args(["-t", "bpf", "bpf"])
            .arg(&dir)
            .status()?;
        ensure!(
            st.success(),
            "mounting a bpffs on {} (needs root)",
            dir.display()
        );
        Ok(Self { dir })
    }
}

impl Drop for Bpffs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.dir).status();
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// Runs the host bpfloader on `objects` with `/sys/fs/bpf` = `fs`, in a
/// private mount namespace. Returns its combined output; Err carries it too.
pub fn run_loader(
    loader: &Path,
    fs: &Bpffs,
    build_type: &str,
    objects: &[&Path],
) -> Result<String> {
    // unshare's default propagation for -m is private: the bind mount
    // stays in the child's namespace, /sys/fs/bpf outside is untouched.
    let mut cmd = Command::new("unshare");
    cmd.args(["-m", "--propagation", "private", "--", "sh", "-ec"])
        .arg(r#"mount --bind "$1" /sys/fs/bpf; shift; exec "$@""#)
        .arg("sh")
        .arg(&fs.dir)
        .arg(loader)
        .arg(build_type)
        .args(objects);
    let o = cmd.output().context("running unshare")?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    if !o.status.success() {
        bail!("AOSP bpfloader failed ({}):\n{text}", o.status);
    }
    Ok(text)
}

/// Map names of the aya object, i.e. what `vitals.o` defines.
fn map_names(root: &Path) -> Result<Vec<String>> {
    use object::read::elf::ElfFile64;
    let data = std::fs::read(android_bpf::aya_object(root))?;
    let obj = ElfFile64::<object::LittleEndian>::parse(&*data)?;
    Ok(android_bpf::read_maps(&obj)?
        .1
        .into_iter()
        .map(|(_, m)| m.name)
        .collect())
}

/// Every pin Android would create for vitals.o, with the owner and mode
/// the object's defs ask for (vitalsd runs as uid system and opens them).
fn check_pins(root: &Path, dir: &Path) -> Result<String> {
    let mut lines = Vec::new();
    let mut want: Vec<(String, u32)> = android_bpf::PROGRAMS
        .iter()
        .map(|p| (android_bpf::prog_pin_name(p.section), 0o440))
        .collect();
    for m in map_names(root)? {
        want.push((
            format!("map_{}_{m}", android_bpf::OBJ_NAME),
            android_bpf::MAP_MODE,
        ));
    }
    for (name, mode) in want {
        let p = dir.join(&name);
        let md = std::fs::metadata(&p).with_context(|| format!("{name} was not pinned"))?;
        ensure!(
            md.mode() & 0o777 == mode
                && md.uid() == android_bpf::AID_ROOT
                && md.gid() == android_bpf::AID_SYSTEM,
            "{name}: mode {:o} uid {} gid {}, want {mode:o} root:system(1000)",
            md.mode() & 0o777,
            md.uid(),
            md.gid()
        );
        lines.push(format!("  /sys/fs/bpf/{name} {mode:o} 0:1000"));
    }
    Ok(lines.join("\n"))
}

/// The kernel memory vitals.o's always-on maps may hold on a phone (#22
/// item 4); the capture tier's, reserved from boot, come on top.
const ALWAYS_ON_TARGET_BYTES: u64 = 4 << 20;

/// The kernel memory of the maps bpfloader created for vitals.o, as the
/// kernel charges it: bpftool's `bytes_memlock` of each pin (fdinfo
/// `memlock`, the map's own `map_mem_usage` from Linux 6.4). Beyond a few
/// KiB of per-CPU rows and hash locks it does not depend on the CPU count,
/// so this machine's figure is a phone's.
fn pinned_map_memory(root: &Path, dir: &Path) -> Result<String> {
    let mut maps = Vec::new();
    for name in map_names(root)? {
        let pin = dir.join(format!("map_{}_{name}", android_bpf::OBJ_NAME));
        let json = crate::util::output(
            Command::new("bpftool")
                .args(["map", "show", "pinned"])
                .arg(&pin)
                .arg("--json"),
        )?;
        let v: serde_json::Value =
            serde_json::from_str(&json).with_context(|| format!("bpftool's json for {name}"))?;
        let bytes = v["bytes_memlock"]
            .as_u64()
            .with_context(|| format!("no bytes_memlock for {name}: {json}"))?;
        maps.push((bytes, name));
    }
    maps.sort_unstable_by(|a, b| b.cmp(a));
    let mib = |b: u64| b as f64 / f64::from(1 << 20);
    let total: u64 = maps.iter().map(|m| m.0).sum();
    let capture: u64 = maps
        .iter()
        .filter(|(_, n)| android_bpf::CAPTURE_MAP_ENTRIES.iter().any(|(c, _)| c == n))
        .map(|m| m.0)
        .sum();
    // fdinfo memlock is the maps' own map_mem_usage from Linux 6.4;
    // before it is a rough footprint, which says nothing of the target.
    let exact = procfs::KernelVersion::current()? >= procfs::KernelVersion::new(6, 4, 0);
    ensure!(
        !exact || total - capture <= ALWAYS_ON_TARGET_BYTES,
        "vitals.o's always-on maps hold {:.2} MiB, over the {:.0} MiB a phone allows (#22): {maps:?}",
        mib(total - capture),
        mib(ALWAYS_ON_TARGET_BYTES)
    );
    let largest: Vec<String> = maps
        .iter()
        .take(6)
        .map(|(b, n)| format!("{n} {:.2}", mib(*b)))
        .collect();
    Ok(format!(
        "  {:.2} MiB in {} maps: always-on {:.2} MiB, capture tier {:.2} MiB (reserved from boot); \
         largest (MiB): {}",
        mib(total),
        maps.len(),
        mib(total - capture),
        mib(capture),
        largest.join(", ")
    ))
}

/// One vitals-workload child: waits for "go" on stdin (see
/// tests/src/bin/vitals-workload.rs).
pub(super) struct Workload {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl Workload {
    pub(super) fn spawn(bin: &Path, args: &[&str]) -> Result<Self> {
        let mut child = Command::new(bin)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .with_context(|| format!("spawning {}", bin.display()))?;
        let out = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        Ok(Self { child, lines })
    }

    pub(super) fn expect(&self, what: &str, timeout: Duration) -> Result<()> {
        let l = self
            .lines
            .recv_timeout(timeout)
            .with_context(|| format!("workload {} never said {what}", self.child.id()))?;
        ensure!(l == what, "workload said {l:?}, expected {what:?}");
        Ok(())
    }

    pub(super) fn go(&mut self) -> Result<()> {
        writeln!(self.child.stdin.as_mut().unwrap())?;
        Ok(())
    }

    pub(super) fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Workload {
    fn drop(&mut self) {
        drop(self.child.stdin.take());
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// utime+stime in ns and minflt from /proc/<pid>/stat.
pub(super) fn proc_stat(pid: u32) -> Result<(f64, u64)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let rest = &s[s.rfind(')').context("stat without comm")? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // Fields after comm start at 3 (state): minflt 10, utime 14, stime 15.
    let field = |n: usize| -> Result<u64> { Ok(f[n - 3].parse()?) };
    let tck = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    let cpu_ns = (field(14)? + field(15)?) as f64 * 1e9 / tck;
    Ok((cpu_ns, field(10)?))
}

/// (ONCPU_MS, FAULTS) of `pid` in `vitalsd record`'s table. Columns are
/// read from the right: a process name may contain spaces.
fn table_row(table: &str, pid: u32) -> Option<(f64, u64)> {
    let l = table
        .lines()
        .find(|l| l.split_whitespace().next() == Some(&pid.to_string()))?;
    let c: Vec<&str> = l.split_whitespace().collect();
    let n = c.len();
    Some((c.get(n - 6)?.parse().ok()?, c.get(n - 1)?.parse().ok()?))
}

pub(super) fn within(what: &str, got: f64, want: f64, pct: f64) -> Result<String> {
    super::unseen::within_unseen(what, got, want, pct, 0.0)
}

/// vitalsd attached from `pins` records a spinner and a page-toucher.
fn record_from_pins(vitalsd: &Path, workload: &Path, pins: &Path) -> Result<String> {
    const SPIN_MS: u64 = 800;
    const PAGES: u64 = 20_000;
    let mut spin = Workload::spawn(workload, &["pinned-spin", "0", &SPIN_MS.to_string()])?;
    let mut touch = Workload::spawn(workload, &["touch", &PAGES.to_string()])?;
    let ready = Duration::from_secs(20);
    spin.expect("ready", ready)?;
    touch.expect("ready", ready)?;
    let (spin0, _) = proc_stat(spin.pid())?;
    let (_, flt0) = proc_stat(touch.pid())?;
    let pid1 = Pid1Clock::start()?;

    let out = tempfile_path("vitals-android-check", "pftrace");
    let mut rec = Command::new(vitalsd)
        .args(["record", "--duration", "10s", "--top", "0", "--pins"])
        .arg(pins)
        .arg("--out")
        .arg(&out)
        .env("RUST_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("spawning vitalsd record")?;
    let err = rec.stderr.take().unwrap();
    let (tx, rx) = mpsc::channel();
    let log_thread = std::thread::spawn(move || {
        let mut all = String::new();
        for l in BufReader::new(err).lines().map_while(Result::ok) {
            if l.contains("attached from pins") {
                let _ = tx.send(());
            }
            all.push_str(&l);
            all.push('\n');
        }
        all
    });
    let attached = rx.recv_timeout(Duration::from_secs(30)).is_ok();
    if attached {
        spin.go()?;
        touch.go()?;
        let t = Duration::from_secs(60);
        spin.expect("done", t)?;
        touch.expect("done", t)?;
    }
    let (spin1, _) = proc_stat(spin.pid())?;
    let (_, flt1) = proc_stat(touch.pid())?;
    let pid1_ns = pid1.ran_ns()?;
    let started = Instant::now();
    let o = rec.wait_with_output()?;
    let log = log_thread.join().unwrap_or_default();
    let _ = std::fs::remove_file(&out);
    let table = String::from_utf8_lossy(&o.stdout).into_owned();
    ensure!(
        attached && o.status.success(),
        "vitalsd record --pins {} ({}; {:?} after the workloads):\n{log}{table}",
        pins.display(),
        o.status,
        started.elapsed()
    );
    let (spin_ms, _) = table_row(&table, spin.pid())
        .with_context(|| format!("spinner {} not in the table:\n{table}", spin.pid()))?;
    let (_, faults) = table_row(&table, touch.pid())
        .with_context(|| format!("page-toucher {} not in the table:\n{table}", touch.pid()))?;
    let proc_spin_ns = spin1 - spin0;
    ensure!(
        proc_spin_ns >= SPIN_MS as f64 * 0.9e6,
        "the spinner ran only {proc_spin_ns} ns"
    );
    let proc_faults = (flt1 - flt0) as f64;
    ensure!(
        proc_faults >= PAGES as f64,
        "only {proc_faults} minor faults for {PAGES} pages"
    );
    // What the table charged pid 1 over the whole recording, which holds
    // the window: its time there that no tracepoint saw (`unseen.rs`).
    let pid1_seen_ns = table_row(&table, 1).map_or(0.0, |(ms, _)| ms * 1e6);
    let unseen_ns = (pid1_ns - pid1_seen_ns).max(0.0);
    let lines = [
        within_unseen(
            "spinner on-CPU ns",
            spin_ms * 1e6,
            proc_spin_ns,
            10.0,
            unseen_ns,
        )
        .map_err(|e| anyhow::anyhow!("{e}\n{table}"))?,
        within("page-toucher faults", faults as f64, proc_faults, 10.0)
            .map_err(|e| anyhow::anyhow!("{e}\n{table}"))?,
    ];
    Ok(lines.join("\n"))
}

fn tempfile_path(stem: &str, ext: &str) -> PathBuf {
    std::env::temp_dir().join(format!("{stem}-{}.{ext}", std::process::id()))
}

/// Check 1a. `bins` holds the built vitalsd and vitals-workload.
pub fn check(root: &Path, aosp: &AospTree, work: &Path, bins: &Path) -> Result<String> {
    let loader = work.join("host-bpfloader");
    build_loader(root, aosp, &loader)?;
    let obj = android_bpf::write(root)?;
    let fs = Bpffs::mount(work.join(format!("bpffs-{}", std::process::id())))?;
    let log = run_loader(&loader, &fs, "user", &[&obj])?;
    let mut report = vec![format!(
        "AOSP bpfloader (Loader.cpp from {}) loaded {}:",
        aosp.system_bpf.display(),
        obj.display()
    )];
    report.extend(
        log.lines()
            .filter(|l| l.contains(" prog /sys/fs/bpf/") || l.contains("host-bpfloader"))
            .map(|l| format!("  {}", l.trim())),
    );
    report.push("pins, owners and modes:".into());
    report.push(check_pins(root, &fs.dir).map_err(|e| anyhow::anyhow!("{e}\n{log}"))?);
    report.push("kernel memory of bpfloader's maps (bpftool bytes_memlock):".into());
    report.push(pinned_map_memory(root, &fs.dir)?);
    report
        .push("vitalsd record --pins (attached from the AOSP loader's pins) against /proc:".into());
    report.push(record_from_pins(
        &bins.join("vitalsd"),
        &bins.join("vitals-workload"),
        &fs.dir,
    )?);
    report.push(
        "captures from the AOSP loader's pins (a user build's only way in), read by trace_processor:"
            .into(),
    );
    report.push(super::capture::check(bins, &fs.dir, work)?);
    Ok(report.join("\n"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_rows_are_read_from_the_right() {
        let t = "    PID PROCESS                  ONCPU_MS  CORE_EQ%    VOL_SW  INVOL_SW     RUNQ_MS    FAULTS\n\
                 \x20 12329 my proc                   367.002      17.7       145     30087     232.923      1593\n";
        assert_eq!(table_row(t, 12329), Some((367.002, 1593)));
        assert_eq!(table_row(t, 1), None);
    }

    #[test]
    fn within_fails_past_the_bound() {
        assert!(within("x", 105.0, 100.0, 10.0).is_ok());
        assert!(within("x", 111.0, 100.0, 10.0).is_err());
        assert!(within("x", 89.0, 100.0, 10.0).is_err());
    }
}
