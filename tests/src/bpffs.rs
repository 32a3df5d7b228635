//! A bpffs mounted in a temporary directory, and `vitalsd pin` into it
//! (bpfloader's role on a device): the pins path's test fixture.

use std::process::Command;

use crate::{require_root, vitalsd_bin};

/// A bpffs mounted in a temporary directory; unmounted (which releases
/// every pin in it) on drop.
pub struct Bpffs(pub tempfile::TempDir);

impl Bpffs {
    pub fn mount() -> Self {
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

/// `vitalsd pin` into a fresh bpffs.
pub fn pin() -> Bpffs {
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
    fs
}
