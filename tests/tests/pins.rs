//! Attach-from-pins: what vitalsd does on Android user builds, where only
//! bpfloader may load programs. Here `vitalsd pin` plays bpfloader, pinning
//! into a bpffs mounted in a temporary directory.

use std::process::Command;

use vitals_tests::*;

struct Bpffs(tempfile::TempDir);

impl Bpffs {
    fn mount() -> Self {
        require_root();
        let d = tempfile::tempdir().unwrap();
        let st = Command::new("mount")
            .args(["-t", "bpf", "bpf"])
            .arg(d.path())
            .status()
            .unwrap();
        assert!(st.success(), "mounting a bpffs");
        Self(d)
    }
}

impl Drop for Bpffs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.0.path()).status();
    }
}

/// Records while the workload runs its whole job: the recorder is stopped
/// with SIGINT (a clean stop that writes the final sample) only after the
/// workload said "done", so a loaded machine stretching the spin in wall
/// time cannot end the window early.
fn record(pins: &std::path::Path, w: &mut Workload) -> (String, String) {
    let dir = tempfile::tempdir().unwrap();
    let child = Command::new(vitalsd_bin())
        .args(["record", "--duration", "300s", "--top", "0", "--pins"])
        .arg(pins)
        .arg("--out")
        .arg(dir.path().join("t.pftrace"))
        .env("RUST_LOG", "info")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let guard = KillOnDrop(child.id());
    std::thread::sleep(std::time::Duration::from_millis(700));
    w.go();
    w.expect("done");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    let out = child.wait_with_output().unwrap();
    std::mem::forget(guard);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    decode_trace(&dir.path().join("t.pftrace"));
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Kills the recorder if the test panics before stopping it.
struct KillOnDrop(u32);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.0 as i32),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
}

fn oncpu_ms(table: &str, pid: u32) -> f64 {
    table
        .lines()
        .find(|l| l.split_whitespace().next() == Some(&pid.to_string()))
        .and_then(|l| l.split_whitespace().nth(2))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("pid {pid} not in:\n{table}"))
}

#[test]
fn daemon_attaches_pinned_programs_and_reads_pinned_maps() {
    let fs = Bpffs::mount();
    let out = Command::new(vitalsd_bin())
        .args(["pin", "--dir"])
        .arg(fs.0.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for name in [
        "prog_vitals_sched_switch_fixed",
        "prog_vitals_sched_process_free",
        "map_vitals_TASKS",
        "map_vitals_EXITED",
    ] {
        assert!(fs.0.path().join(name).exists(), "{name} not pinned");
    }
    // `pin` exits without attaching: nothing counts until a reader attaches.
    let mut w = Workload::spawn(&["pinned-spin", "1", "500"]);
    w.expect("ready");
    let (table, log) = record(fs.0.path(), &mut w);
    assert!(log.contains("attached from pins"), "{log}");
    let ms = oncpu_ms(&table, w.pid());
    assert!(
        ms >= 450.0,
        "spinner on-CPU {ms} ms through the pinned programs"
    );
    w.finish();
}

#[test]
fn without_pins_the_daemon_loads_its_own_object() {
    let empty = tempfile::tempdir().unwrap();
    let mut w = Workload::spawn(&["pinned-spin", "1", "300"]);
    w.expect("ready");
    let (table, log) = record(empty.path(), &mut w);
    assert!(log.contains("loading with aya"), "{log}");
    assert!(!log.contains("attached from pins"));
    assert!(oncpu_ms(&table, w.pid()) >= 250.0);
    w.finish();
}
