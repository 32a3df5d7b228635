//! tracefs: where it is, mounting it when absent, and reading tracepoint
//! formats (parsed by the pure `object::format`).
//!
//! Like Perfetto's ftrace probes, try `/sys/kernel/tracing` before the legacy
//! `/sys/kernel/debug/tracing`. Field offsets are read from each event's
//! `format` file because they change between kernels.

use std::path::{Path, PathBuf};

pub use super::object::format::{EventFormat, FieldFormat, TracefsError};

const CANDIDATES: [&str; 2] = ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"];

/// A tracefs mount point.
#[derive(Debug, Clone)]
pub struct Tracefs {
    root: PathBuf,
}

impl Tracefs {
    /// Uses an explicit root (tests use a fake tree).
    pub fn at(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    /// Finds a mounted tracefs, mounting one on `/sys/kernel/tracing` if none is.
    pub fn find_or_mount() -> Result<Self, TracefsError> {
        for c in CANDIDATES {
            if Path::new(c).join("events").is_dir() {
                return Ok(Self::at(c));
            }
        }
        let path = PathBuf::from(CANDIDATES[0]);
        log::info!("tracefs not mounted; mounting it on {}", path.display());
        nix::mount::mount(
            Some("nodev"),
            &path,
            Some("tracefs"),
            nix::mount::MsFlags::empty(),
            None::<&str>,
        )
        .map_err(|source| TracefsError::Mount {
            path: path.clone(),
            source,
        })?;
        Ok(Self::at(path))
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Does the tracepoint `category/name` exist on this kernel?
    /// (`exceptions/page_fault_user` is x86-only.)
    pub fn has_event(&self, category: &str, name: &str) -> bool {
        self.root.join("events").join(category).join(name).is_dir()
    }

    /// The tracepoint's `format` file, parsed.
    pub fn format(&self, category: &str, name: &str) -> Result<EventFormat, TracefsError> {
        let path = self
            .root
            .join("events")
            .join(category)
            .join(name)
            .join("format");
        let text = std::fs::read_to_string(&path).map_err(|source| TracefsError::Read {
            path: path.clone(),
            source,
        })?;
        Ok(EventFormat::parse(path, &text))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bpf::object::format::tests::FREE_6_18;

    #[test]
    fn fake_tree_lookup() {
        let dir = tempfile::tempdir().unwrap();
        let ev = dir.path().join("events/sched/sched_process_free");
        std::fs::create_dir_all(&ev).unwrap();
        std::fs::write(ev.join("format"), FREE_6_18).unwrap();
        let t = Tracefs::at(dir.path());
        assert!(t.has_event("sched", "sched_process_free"));
        assert!(!t.has_event("exceptions", "page_fault_user"));
        let off = t
            .format("sched", "sched_process_free")
            .unwrap()
            .offset_of("pid", 4);
        assert_eq!(off.unwrap(), 12);
        assert!(matches!(
            t.format("sched", "nope"),
            Err(TracefsError::Read { .. })
        ));
    }
}
