//! Checks of the Android integration files against the code, with no root
//! and no Android tree: [`init_tests`] compares `init/vitalsd.rc` and the
//! systemd unit with what the daemon keeps and creates; [`sepolicy_tests`]
//! checks that the policy labels and grants every path the daemon opens, and
//! the policy's own shape. (The `_tests.rs` names keep both out of the
//! source scan for path literals, like every other test-only file.)

use std::path::{Path, PathBuf};

mod init_tests;
mod sepolicy_tests;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_owned()
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(repo().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}
