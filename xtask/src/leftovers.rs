//! After the kernel suites: no process a test started may still run. Load
//! generators left behind (a forked `perf bench` partner, a workload whose
//! test panicked) poison every later measurement, so a leftover fails the
//! run, after being named and killed.
//!
//! xtask makes itself a child subreaper (prctl PR_SET_CHILD_SUBREAPER), so
//! every process orphaned anywhere below it is re-parented to it instead of
//! init: once the test commands it waited for have exited, any child it
//! still has is a leftover of the tests, and nothing else on the machine is.

use std::path::Path;

use anyhow::{bail, Result};

/// Makes orphans of everything this process starts its own children.
pub fn become_subreaper() -> Result<()> {
    // SAFETY: prctl with integer arguments only.
    let rc = unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
    if rc != 0 {
        bail!(
            "prctl(PR_SET_CHILD_SUBREAPER): {}",
            std::io::Error::last_os_error()
        );
    }
    Ok(())
}

/// (pid, comm) of the processes whose parent is `parent`.
fn children_of(proc_root: &Path, parent: i32) -> Vec<(i32, String)> {
    let Ok(dir) = std::fs::read_dir(proc_root) else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(|pid| {
            // Vanished between readdir and open: not a leftover.
            let stat =
                std::fs::read_to_string(proc_root.join(pid.to_string()).join("stat")).ok()?;
            let open = stat.find('(')?;
            let close = stat.rfind(')')?;
            let comm = stat.get(open + 1..close)?.to_owned();
            // Fields 3 (state) and 4 (ppid) follow the comm's ')'; a
            // zombie is already dead.
            let mut rest = stat.get(close + 2..)?.split_whitespace();
            let state = rest.next()?;
            let ppid: i32 = rest.next()?.parse().ok()?;
            (ppid == parent && state != "Z").then_some((pid, comm))
        })
        .collect()
}

/// Fails (after killing and reaping them) if this process has children
/// left: with no test command running, each is something a test leaked.
pub fn check() -> Result<()> {
    let me = std::process::id() as i32;
    // Children a test killed properly still need their parent to reap
    // them, and orphans have us as parent now: reap every exited child
    // (give ones still exiting a moment) before looking for live ones.
    let reap = || loop {
        // SAFETY: waitpid(2) with a null status pointer; no memory.
        let pid = unsafe { libc::waitpid(-1, std::ptr::null_mut(), libc::WNOHANG) };
        if pid <= 0 {
            break;
        }
    };
    reap();
    std::thread::sleep(std::time::Duration::from_millis(300));
    reap();
    let left = children_of(Path::new("/proc"), me);
    if left.is_empty() {
        return Ok(());
    }
    for (pid, _) in &left {
        // SAFETY: kill(2) and waitpid(2) on our own children; no memory.
        unsafe {
            libc::kill(*pid, libc::SIGKILL);
            libc::waitpid(*pid, std::ptr::null_mut(), 0);
        }
    }
    let names: Vec<String> = left.iter().map(|(p, c)| format!("{c} ({p})")).collect();
    bail!(
        "processes started by the tests were still running after them (now killed): {}; \
         a test must end what it starts (its own process group, killed from a Drop guard)",
        names.join(", ")
    )
}
