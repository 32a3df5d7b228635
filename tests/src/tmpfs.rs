//! A small tmpfs: a file system that fills up when a test wants it to.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use crate::require_root;

/// A tmpfs of a given size mounted on a directory, unmounted on drop (even
/// when the test panics).
pub struct Tmpfs(PathBuf);

impl Tmpfs {
    /// Mounts a tmpfs of `size` (mount(8)'s `size=` syntax: "256k", "2m")
    /// on `dir`, creating it.
    pub fn mount(dir: &Path, size: &str) -> Self {
        require_root();
        std::fs::create_dir_all(dir).unwrap();
        let st = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir)
            .status()
            .unwrap();
        assert!(st.success(), "mounting a tmpfs on {}", dir.display());
        Self(dir.to_owned())
    }

    pub fn path(&self) -> &Path {
        &self.0
    }

    /// Fills what is left with one file, `name`, up to ENOSPC.
    pub fn fill(&self, name: &str) -> PathBuf {
        use std::io::Write;
        let path = self.0.join(name);
        let mut f = std::fs::File::create(&path).unwrap();
        let chunk = vec![0u8; 4096];
        loop {
            match f.write(&chunk) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => break,
                Err(e) => panic!("filling {}: {e}", path.display()),
            }
        }
        path
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}
