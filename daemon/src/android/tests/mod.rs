//! Checks of the Android integration files against the code, with no root
//! and no Android tree: [`init`] compares `init/vitalsd.rc` and the
//! systemd unit with what the daemon keeps and creates; [`sepolicy`]
//! checks that the policy labels and grants every path the daemon opens, and
//! the policy's own shape. (Being under a `tests/` directory keeps both out
//! of the source scan for path literals, like every other test-only file.)

use std::path::{Path, PathBuf};

mod init;
mod sepolicy;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_owned()
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(repo().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// The lines between `<!-- tiers -->` and `<!-- /tiers -->` of `text`.
fn tiers_table(text: &str, file: &str) -> String {
    let start = text
        .find("<!-- tiers -->")
        .unwrap_or_else(|| panic!("{file} has no <!-- tiers --> table"));
    let end = text[start..]
        .find("<!-- /tiers -->")
        .unwrap_or_else(|| panic!("{file}: the tiers table is not closed"));
    text[start..start + end].to_owned()
}

/// The README and the Android guide show one tier table (issue #21): the
/// same rows in both.
#[test]
fn readme_and_android_guide_have_the_same_tier_table() {
    let readme = tiers_table(&read("README.md"), "README.md");
    let guide = tiers_table(&read("docs/android.md"), "docs/android.md");
    assert!(readme.contains("| `cts` |"), "{readme}");
    assert_eq!(
        readme, guide,
        "README.md and docs/android.md tier tables differ"
    );
}
