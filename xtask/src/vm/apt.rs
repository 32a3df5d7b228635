//! Debian packages for the guests, fetched with `apt-get download` through
//! a private apt configuration (sources list, lists and cache under
//! target/vm/apt/<arch>/), so the machine's own apt setup is left alone and
//! no foreign architecture is enabled on it. Everything fetched is cached
//! under target/vm/: a second run finds it and never calls apt.
//!
//! - kernels: `linux-image-cloud-<arch>` of the suite that ships the series
//!   (bullseye 5.10, bookworm 6.1, trixie 6.12) names the concrete image
//!   package; the newest one the mirror serves is taken (the mirror here
//!   lists some packages it then answers 404 for, so older builds of the
//!   same series are tried in turn);
//! - arm64's Rust standard library (`libstd-rust-web-dev:arm64`), in
//!   exactly the version of the rustc-web that compiles, unpacked into a
//!   private sysroot;
//! - arm64's static busybox.

use std::{
    path::{Path, PathBuf},
    process::Command,
    sync::Mutex,
};

use anyhow::{bail, Context, Result};

use super::Arch;
use crate::util::{output, run, workspace_root};

fn vm_dir() -> PathBuf {
    workspace_root().join("target/vm")
}

/// Arches whose private lists this run has refreshed.
static UPDATED: Mutex<Vec<Arch>> = Mutex::new(Vec::new());

/// The machine's Debian mirror (from /etc/apt/sources.list*), reused for
/// the other suites.
fn mirrors() -> (String, String) {
    let mut texts = Vec::new();
    if let Ok(s) = std::fs::read_to_string("/etc/apt/sources.list") {
        texts.push(s);
    }
    if let Ok(dir) = std::fs::read_dir("/etc/apt/sources.list.d") {
        for e in dir.flatten() {
            let p = e.path();
            if p.extension().is_some_and(|x| x == "list" || x == "sources") {
                texts.push(std::fs::read_to_string(&p).unwrap_or_default());
            }
        }
    }
    let uris: Vec<String> = texts
        .iter()
        .flat_map(|t| t.lines())
        .map(str::trim)
        .filter(|l| !l.starts_with('#'))
        .flat_map(|l| {
            // One-line style (`deb [opts] URI suite comps`) or deb822 (`URIs: …`).
            let words: Vec<&str> = l.split_whitespace().collect();
            match words.first() {
                Some(&"deb") => words
                    .iter()
                    .skip(1)
                    .find(|w| w.contains("://"))
                    .map(|w| vec![w.to_string()])
                    .unwrap_or_default(),
                Some(&"URIs:") => words[1..].iter().map(|w| w.to_string()).collect(),
                _ => vec![],
            }
        })
        .map(|u| u.trim_end_matches('/').to_owned())
        .collect();
    let main = uris
        .iter()
        .find(|u| u.ends_with("/debian"))
        .cloned()
        .unwrap_or_else(|| "http://deb.debian.org/debian".into());
    let security = uris
        .iter()
        .find(|u| u.ends_with("/debian-security"))
        .cloned()
        .unwrap_or_else(|| format!("{main}-security"));
    (main, security)
}

/// `apt-get`/`apt-cache` with the private configuration of `arch`.
fn apt(tool: &str, arch: Arch) -> Result<Command> {
    let root = vm_dir().join("apt").join(arch.debian());
    let parts = root.join("etc/sources.list.d");
    let lists = root.join("lists");
    let cache = root.join("cache");
    for d in [
        &parts,
        &lists.join("partial"),
        &cache.join("archives/partial"),
    ] {
        std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
    }
    let list = root.join("etc/sources.list");
    let (main, security) = mirrors();
    let key = "/usr/share/keyrings/debian-archive-keyring.gpg";
    let mut text = String::new();
    for suite in ["bullseye", "bookworm", "trixie"] {
        text.push_str(&format!("deb [signed-by={key}] {main} {suite} main\n"));
        text.push_str(&format!(
            "deb [signed-by={key}] {security} {suite}-security main\n"
        ));
    }
    std::fs::write(&list, text).with_context(|| format!("writing {}", list.display()))?;
    let mut c = Command::new(tool);
    for (k, v) in [
        ("Dir::Etc::SourceList", list.display().to_string()),
        ("Dir::Etc::SourceParts", parts.display().to_string()),
        ("Dir::State::Lists", lists.display().to_string()),
        ("Dir::Cache", cache.display().to_string()),
        ("APT::Architecture", arch.debian().to_owned()),
        ("APT::Architectures", arch.debian().to_owned()),
        // Downloads land in target/, which the _apt user cannot write.
        ("APT::Sandbox::User", "root".to_owned()),
    ] {
        c.arg("-o").arg(format!("{k}={v}"));
    }
    Ok(c)
}

fn update(arch: Arch) -> Result<()> {
    let mut done = UPDATED.lock().unwrap();
    if done.contains(&arch) {
        return Ok(());
    }
    eprintln!("vm-test: apt-get update ({} lists, private)", arch.debian());
    run(apt("apt-get", arch)?.args(["update", "-qq"]))?;
    done.push(arch);
    Ok(())
}

/// `apt-get download SPEC` into `dir`; false when the mirror failed it.
fn download(arch: Arch, spec: &str, dir: &Path) -> Result<bool> {
    std::fs::create_dir_all(dir)?;
    let st = apt("apt-get", arch)?
        .args(["download", "-qq", spec])
        .current_dir(dir)
        .status()
        .context("spawning apt-get download")?;
    Ok(st.success())
}

fn debs_dir() -> PathBuf {
    vm_dir().join("debs")
}

/// The image package of `series` for `arch`, downloaded once.
pub fn kernel_deb(arch: Arch, series: &str, suite: &str) -> Result<PathBuf> {
    let dir = debs_dir();
    let flavour = format!("-cloud-{}", arch.debian());
    let cached = || -> Option<PathBuf> {
        let mut found: Vec<PathBuf> = std::fs::read_dir(&dir)
            .ok()?
            .flatten()
            .map(|e| e.path())
            .filter(|p| {
                let n = p.file_name().unwrap().to_string_lossy();
                n.starts_with(&format!("linux-image-{series}."))
                    && n.contains(&format!("{flavour}_"))
                    && n.ends_with(".deb")
            })
            .collect();
        found.sort();
        found.pop()
    };
    if let Some(p) = cached() {
        return Ok(p);
    }
    update(arch)?;
    // Every version of the meta package, with the image package it names.
    let meta = format!("linux-image-cloud-{}", arch.debian());
    let show = output(apt("apt-cache", arch)?.args(["show", &meta]))?;
    let mut candidates: Vec<(String, String)> = Vec::new();
    for stanza in show.split("\n\n") {
        let field = |f: &str| {
            stanza
                .lines()
                .find_map(|l| l.strip_prefix(&format!("{f}: ")))
                .map(str::trim)
        };
        let (Some(version), Some(depends)) = (field("Version"), field("Depends")) else {
            continue;
        };
        if !version.starts_with(&format!("{series}.")) {
            continue;
        }
        let image = depends.split([' ', ',']).next().unwrap_or("").to_owned();
        if image.starts_with("linux-image-") {
            candidates.push((image, version.to_owned()));
        }
    }
    // Newest first.
    candidates.sort_by(|a, b| {
        if dpkg_newer(&a.1, &b.1) {
            std::cmp::Ordering::Less
        } else {
            std::cmp::Ordering::Greater
        }
    });
    candidates.dedup();
    if candidates.is_empty() {
        bail!("{suite}'s {meta} names no {series} kernel on the mirror");
    }
    for (image, version) in &candidates {
        eprintln!("vm-test: downloading {image} {version} ({suite})");
        if download(arch, &format!("{image}={version}"), &dir)? {
            if let Some(p) = cached() {
                return Ok(p);
            }
        }
        eprintln!("vm-test: the mirror did not serve {image} {version}; trying an older build");
    }
    bail!(
        "none of {suite}'s {series} kernels could be downloaded: {:?}",
        candidates
    )
}

fn dpkg_newer(a: &str, b: &str) -> bool {
    Command::new("dpkg")
        .args(["--compare-versions", a, "gt", b])
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

/// A private sysroot with Debian's arm64 Rust std, the same version as the
/// rustc-web that builds (rustc refuses a std from another compiler, so a
/// mismatch would only show up as E0514 deep in the build).
pub fn arm64_rust_sysroot() -> Result<PathBuf> {
    let rustc_version =
        output(Command::new("dpkg-query").args(["-W", "-f=${Version}", "rustc-web"]))
            .context("rustc-web is not installed (cargo xtask setup installs it)")?;
    let sysroot = vm_dir().join("sysroot-aarch64");
    let marker = sysroot.join("libstd-rust-web-dev.version");
    if std::fs::read_to_string(&marker).is_ok_and(|v| v == rustc_version) {
        return Ok(sysroot);
    }
    let dir = debs_dir();
    let pkg = "libstd-rust-web-dev";
    let deb_name = format!("{pkg}_{}_arm64.deb", rustc_version.replace(':', "%3a"));
    let deb = dir.join(&deb_name);
    if !deb.exists() {
        update(Arch::Arm64)?;
        if !download(Arch::Arm64, &format!("{pkg}={rustc_version}"), &dir)? || !deb.exists() {
            bail!("could not download {pkg}:arm64 {rustc_version} (the version of rustc-web)");
        }
    }
    let deb_version = output(
        Command::new("dpkg-deb")
            .args(["-f"])
            .arg(&deb)
            .arg("Version"),
    )?;
    if deb_version.trim() != rustc_version {
        bail!(
            "{} is {} but rustc-web is {rustc_version}",
            deb.display(),
            deb_version.trim()
        );
    }
    let tmp = vm_dir().join("sysroot-aarch64.tmp");
    let _ = std::fs::remove_dir_all(&tmp);
    run(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&tmp))?;
    let _ = std::fs::remove_dir_all(&sysroot);
    std::fs::create_dir_all(sysroot.join("lib"))?;
    std::fs::rename(tmp.join("usr/lib/rustlib"), sysroot.join("lib/rustlib"))
        .context("moving rustlib into the sysroot")?;
    std::fs::remove_dir_all(&tmp)?;
    // Does /usr/bin/rustc accept it? A tiny std-using crate, metadata only.
    let probe = vm_dir().join("sysroot-probe.rs");
    std::fs::write(
        &probe,
        "pub fn f() -> String { std::env::args().collect() }\n",
    )?;
    run(Command::new("/usr/bin/rustc")
        .args([
            "--edition=2021",
            "--crate-type=lib",
            "--emit=metadata",
            "--target",
            Arch::Arm64.rust_target(),
        ])
        .arg(format!("--sysroot={}", sysroot.display()))
        .arg("-o")
        .arg(vm_dir().join("sysroot-probe.rmeta"))
        .arg(&probe))
    .context("Debian's rustc rejects the arm64 std it was given")?;
    std::fs::write(&marker, &rustc_version)?;
    Ok(sysroot)
}

/// A statically linked busybox for the guest's arch.
pub fn busybox(arch: Arch) -> Result<PathBuf> {
    match arch {
        // busybox-static, installed by `cargo xtask setup`.
        Arch::X86_64 => {
            let p = PathBuf::from("/bin/busybox");
            if !p.exists() {
                bail!("/bin/busybox missing: run `cargo xtask setup` (busybox-static)");
            }
            Ok(p)
        }
        Arch::Arm64 => {
            let out = vm_dir().join("busybox-arm64");
            if out.exists() {
                return Ok(out);
            }
            let dir = debs_dir();
            let find = || {
                std::fs::read_dir(&dir).ok().and_then(|d| {
                    d.flatten().map(|e| e.path()).find(|p| {
                        let n = p.file_name().unwrap().to_string_lossy();
                        n.starts_with("busybox-static_") && n.ends_with("_arm64.deb")
                    })
                })
            };
            let deb = match find() {
                Some(d) => d,
                None => {
                    update(Arch::Arm64)?;
                    download(Arch::Arm64, "busybox-static/bookworm", &dir)?;
                    find().context("could not download busybox-static:arm64")?
                }
            };
            let tmp = vm_dir().join("busybox-arm64.tmp");
            let _ = std::fs::remove_dir_all(&tmp);
            run(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&tmp))?;
            std::fs::rename(tmp.join("bin/busybox"), &out)?;
            std::fs::remove_dir_all(&tmp)?;
            Ok(out)
        }
    }
}
