//! A Debian kernel package unpacked for a guest: the image QEMU boots and
//! the modules the guest must load itself, in dependency order.
//!
//! The guest needs virtio-pci (both machines put their virtio devices on
//! PCI), virtio-console (the decoder relay's port) and virtio-rng (so
//! getrandom never waits on an idle TCG guest's entropy). Debian's cloud
//! kernels build them in on 6.12 and as modules on 5.10 and 6.1.

use std::{
    collections::{HashMap, HashSet},
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context, Result};
use object::read::elf::ElfFile64;
use object::{Endianness, Object, ObjectSection};

use crate::util::run;

const WANTED: &[&str] = &["virtio_pci", "virtio_console", "virtio_rng"];

pub struct Kernel {
    /// `uname -r` of the image.
    pub release: String,
    /// The package, e.g. linux-image-5.10.0-46-cloud-amd64 5.10.262-1.
    pub package: String,
    pub image: PathBuf,
    /// (module name, its .ko bytes, uncompressed), in load order.
    pub modules: Vec<(String, Vec<u8>)>,
}

impl Kernel {
    /// Unpacks `deb` into `work` (emptied first) and reads what the guest needs.
    pub fn unpack(deb: &Path, work: &Path) -> Result<Self> {
        let root = work.join("pkg");
        let _ = std::fs::remove_dir_all(work);
        std::fs::create_dir_all(work)?;
        run(Command::new("dpkg-deb").arg("-x").arg(deb).arg(&root))?;
        let field = |f: &str| -> Result<String> {
            let o = Command::new("dpkg-deb")
                .arg("-f")
                .arg(deb)
                .arg(f)
                .output()?;
            Ok(String::from_utf8_lossy(&o.stdout).trim().to_owned())
        };
        let package = format!("{} {}", field("Package")?, field("Version")?);
        let image = find_vmlinuz(&root.join("boot"))?
            .with_context(|| format!("{} has no boot/vmlinuz-*", deb.display()))?;
        let release = image
            .file_name()
            .unwrap()
            .to_string_lossy()
            .trim_start_matches("vmlinuz-")
            .to_owned();
        // Merged-/usr packages (trixie) ship them under usr/lib/modules.
        let mod_root = ["lib/modules", "usr/lib/modules"]
            .iter()
            .map(|d| root.join(d).join(&release))
            .find(|p| p.is_dir())
            .with_context(|| format!("{} has no modules directory", deb.display()))?;
        let modules = modules_in_order(&mod_root)?;
        Ok(Self {
            release,
            package,
            image,
            modules,
        })
    }
}

/// Module names use `_` where file names may use `-` (virtio-rng.ko).
fn module_name(file: &str) -> String {
    let base = file.split(".ko").next().unwrap_or(file);
    base.replace('-', "_")
}

fn modules_in_order(mod_root: &Path) -> Result<Vec<(String, Vec<u8>)>> {
    let builtin: HashSet<String> = std::fs::read_to_string(mod_root.join("modules.builtin"))
        .context("reading modules.builtin")?
        .lines()
        .map(|l| module_name(l.rsplit('/').next().unwrap_or(l)))
        .collect();
    let mut files: HashMap<String, PathBuf> = HashMap::new();
    let mut stack = vec![mod_root.join("kernel")];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d)?.flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else {
                let n = p.file_name().unwrap().to_string_lossy().into_owned();
                if n.contains(".ko") {
                    files.insert(module_name(&n), p);
                }
            }
        }
    }
    let mut order = Vec::new();
    let mut seen = HashSet::new();
    for m in WANTED {
        visit(m, &builtin, &files, &mut seen, &mut order)?;
    }
    Ok(order)
}

/// Depth-first: a module's dependencies load before it.
fn visit(
    name: &str,
    builtin: &HashSet<String>,
    files: &HashMap<String, PathBuf>,
    seen: &mut HashSet<String>,
    order: &mut Vec<(String, Vec<u8>)>,
) -> Result<()> {
    if builtin.contains(name) || !seen.insert(name.to_owned()) {
        return Ok(());
    }
    let path = files
        .get(name)
        .with_context(|| format!("module {name} is neither built in nor in the package"))?;
    let bytes = decompress(path)?;
    for dep in depends(&bytes).with_context(|| format!("reading {}", path.display()))? {
        // depends= may spell a name as its file does (rng-core).
        visit(&dep.replace('-', "_"), builtin, files, seen, order)?;
    }
    order.push((name.to_owned(), bytes));
    Ok(())
}

/// The module as insmod needs it: busybox's insmod takes no compressed ones.
fn decompress(path: &Path) -> Result<Vec<u8>> {
    let n = path.to_string_lossy();
    let tool = if n.ends_with(".ko.xz") {
        "xz"
    } else if n.ends_with(".ko.zst") {
        "zstd"
    } else if n.ends_with(".ko") {
        return std::fs::read(path).with_context(|| format!("reading {n}"));
    } else {
        bail!("unknown module compression: {n}");
    };
    let out = Command::new(tool)
        .arg("-dc")
        .arg(path)
        .output()
        .with_context(|| format!("spawning {tool}"))?;
    if !out.status.success() {
        bail!("{tool} -dc {n} failed");
    }
    Ok(out.stdout)
}

/// `depends=` of the module's .modinfo section (what modinfo prints).
fn depends(ko: &[u8]) -> Result<Vec<String>> {
    let elf = ElfFile64::<Endianness>::parse(ko)?;
    let Some(sec) = elf.section_by_name(".modinfo") else {
        bail!("no .modinfo section");
    };
    let data = sec.data()?;
    Ok(data
        .split(|&b| b == 0)
        .filter_map(|kv| kv.strip_prefix(b"depends="))
        .flat_map(|v| {
            String::from_utf8_lossy(v)
                .split(',')
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect::<Vec<_>>()
        })
        .collect())
}

/// The `vmlinuz-*` image in a Debian kernel package's or root's `boot/`.
pub(crate) fn find_vmlinuz(boot: &Path) -> std::io::Result<Option<PathBuf>> {
    Ok(std::fs::read_dir(boot)?
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("vmlinuz-"))
        }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn module_names_normalise_dashes_and_compression() {
        assert_eq!(module_name("virtio-rng.ko.xz"), "virtio_rng");
        assert_eq!(module_name("virtio_pci.ko"), "virtio_pci");
    }
}
