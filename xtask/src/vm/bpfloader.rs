//! Check 1a of #12 inside the matrix (row `android::bpfloader-pins`):
//! AOSP's own bpfloader (android/host-loader, built by
//! `android_check::loader::build_loader` from the AOSP tree) loads
//! `target/dist/bpf/vitals.o` into a fresh bpffs on the cell's own kernel,
//! then `pins.rs`'s `aosp_loader_pins_…` test attaches vitalsd from those
//! pins and checks a spinner and a page-toucher against that kernel's /proc.
//!
//! x86_64 only (the host cell and the x86_64 guests): the loader is built
//! for the host; arm64 guests would need it cross-built against arm64
//! builds of Debian's libbase/liblog/libcutils, which this machine has not.
//!
//! Without an AOSP tree the row is NOT RUN, loudly, and a failure under
//! `--require-all`, as in `cargo xtask android-check`.

use std::path::{Path, PathBuf};

use crate::{
    android_bpf,
    android_check::{loader, target_dir},
    suites::Tool,
};

/// The row's name: `android::bpfloader-pins`.
pub const ROW: &str = "bpfloader-pins";
/// The test of tests/tests/pins.rs the row runs after the loader.
pub const TEST: &str = "aosp_loader_pins_count_a_spinner_and_a_page_toucher_as_proc_does";
/// Where initramfs.rs packs the loader and the object in a guest.
pub const GUEST_LOADER: &str = "/vm/bin/host-bpfloader";
pub const GUEST_OBJECT: &str = "/vm/vitals.o";

/// What the row can run with.
#[derive(Debug, Clone)]
pub enum Bpfloader {
    /// The host-built loader and the object it loads.
    Ready { loader: PathBuf, object: PathBuf },
    /// No AOSP tree: why, for the NOT RUN row.
    NotRun(String),
    /// There is a tree, but the loader or vitals.o could not be built:
    /// the row fails with this.
    Broken(String),
}

/// Builds the loader and writes vitals.o (after the x86_64 build, whose
/// daemon build.rs made the aya object vitals.o is converted from).
pub fn prepare(root: &Path) -> Bpfloader {
    let dir = match Tool::AospTree.find() {
        Ok(d) => d,
        Err(why) => return Bpfloader::NotRun(not_run(&why)),
    };
    let Some(tree) = loader::AospTree::find(&dir) else {
        return Bpfloader::NotRun(not_run(&format!(
            "{} has no system_bpf/libbpf_android/Loader.cpp (nor system/bpf/...)",
            dir.display()
        )));
    };
    // About 5 s of clang: rebuilt each run, like android-check does, so a
    // changed tree or shim can never leave a stale loader in the guests.
    let out = target_dir().join("vm-bpfloader/host-bpfloader");
    if let Err(e) = loader::build_loader(root, &tree, &out) {
        return Bpfloader::Broken(format!("{e:#}"));
    }
    match android_bpf::write(root) {
        Ok(object) => Bpfloader::Ready {
            loader: out,
            object,
        },
        Err(e) => Bpfloader::Broken(format!("writing vitals.o: {e:#}")),
    }
}

fn not_run(why: &str) -> String {
    format!(
        "not run: no AOSP tree (set {}): {why}",
        Tool::AospTree.env_var()
    )
}

/// The script's block: in a private mount namespace (on the host cell the
/// real /sys/fs/bpf must stay untouched; in a guest it costs nothing), a
/// fresh bpffs on /sys/fs/bpf, where the loader pins (hard-coded), the
/// loader on the object (its log in $T/bpfloader.log), then the test on
/// those pins. The block's rc is the test binary's.
///
/// The loader runs with RLIMIT_MEMLOCK at 1 GiB, as Android's init starts
/// it (bpfloader.rc: `rlimit memlock 1073741824 1073741824`, the line
/// Connectivity's BpfLoaderRcUtils expects): kernels before 5.11 charge
/// BPF maps to that limit, and a guest's 64 KiB default refuses vitals.o's
/// 4 MiB ring buffer with EPERM. Only the loader: vitalsd attaches under
/// its own limits, as on a device. Where the limit cannot be raised (a
/// host without CAP_SYS_RESOURCE) the loader runs anyway, with a note:
/// from 5.11 on the limit does not apply to BPF, and before, the loader's
/// own failure says so.
pub fn script(loader: &str, object: &str, pins_test: &str, timeout_s: u64) -> String {
    format!(
        r#"echo "@@vm begin android"
unshare -m --propagation private sh -c '
mount -t bpf bpf /sys/fs/bpf || {{ echo "@@vm result {ROW} FAIL could not mount a fresh bpffs on /sys/fs/bpf"; exit 1; }}
(ulimit -l 1048576 2>/dev/null || echo "note: RLIMIT_MEMLOCK stays at $(ulimit -l) KiB (cannot raise it)"; exec "$1" user "$2") >"$4" 2>&1
rc=$?
grep -E "^note: |host-bpfloader|prog /sys/fs/bpf/" "$4"
if [ $rc -ne 0 ]; then
    tail -n 30 "$4"
    echo "@@vm result {ROW} FAIL AOSP bpfloader exited $rc: $(grep -m1 "loadProg ret" "$4" || tail -n 1 "$4")"
    exit 1
fi
VITALS_AOSP_PINS=/sys/fs/bpf timeout -s KILL {timeout_s} "$3" --ignored --exact --test-threads=1 --show-output {TEST} 2>&1
' sh '{loader}' '{object}' '{pins_test}' "$T/bpfloader.log"
echo "@@vm end android $?"
"#
    )
}
