//! Debian packages for the guests, fetched with `apt-get download` through
//! a private apt configuration (sources list, lists and cache under
//! target/vm/apt/<arch>/), so the machine's own apt setup is left alone and
//! no foreign architecture is enabled on it. Everything fetched is cached
//! under target/vm/: a second run finds it and never calls apt. The
//! mirror is the one the machine's apt sources name (`mirrors_in`); with
//! none there it fails rather than reach a public mirror on its own.
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

/// The Debian mirrors the machine's apt sources name, reused for the
/// other suites (bullseye, trixie) the guests' kernels come from.
#[derive(Debug, PartialEq, Eq)]
struct Mirrors {
    /// A URI ending in `/debian`.
    main: String,
    /// A URI ending in `/debian-security`, when the sources name one.
    security: Option<String>,
}

/// The URIs of the enabled `deb` entries of one sources file: one-line
/// style (`deb [opts] URI suite comps`) or deb822 (stanzas of `Types:`,
/// `URIs:`, `Enabled:` …, sources.list(5)).
fn source_uris(text: &str) -> Vec<String> {
    let mut uris = Vec::new();
    for stanza in text.split("\n\n") {
        let lines: Vec<&str> = stanza
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .collect();
        let field = |name: &str| {
            lines.iter().find_map(|l| {
                let (k, v) = l.split_once(':')?;
                k.trim().eq_ignore_ascii_case(name).then(|| v.trim())
            })
        };
        if let Some(list) = field("URIs") {
            let is_deb = field("Types").is_some_and(|t| t.split_whitespace().any(|t| t == "deb"));
            let enabled = field("Enabled").is_none_or(|e| !e.eq_ignore_ascii_case("no"));
            if is_deb && enabled {
                uris.extend(list.split_whitespace().map(str::to_owned));
            }
            continue;
        }
        for l in lines {
            let words: Vec<&str> = l.split_whitespace().collect();
            if words.first() == Some(&"deb") {
                // Options in brackets may hold spaces; the URI is the first word with a scheme.
                if let Some(u) = words[1..].iter().find(|w| w.contains("://")) {
                    uris.push((*u).to_owned());
                }
            }
        }
    }
    uris.into_iter()
        .map(|u| u.trim_end_matches('/').to_owned())
        .collect()
}

/// The mirrors named by `<etc_apt>/sources.list` and
/// `<etc_apt>/sources.list.d/*.{list,sources}` (apt reads no other file
/// names there). Only what is configured: a machine whose sources name no
/// Debian mirror is an error, never a guessed public one.
fn mirrors_in(etc_apt: &Path) -> Result<Mirrors> {
    let mut files = vec![etc_apt.join("sources.list")];
    let parts = etc_apt.join("sources.list.d");
    if let Ok(dir) = std::fs::read_dir(&parts) {
        let mut found: Vec<PathBuf> = dir
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "list" || x == "sources"))
            .collect();
        found.sort();
        files.extend(found);
    }
    let mut uris = Vec::new();
    for f in &files {
        match std::fs::read_to_string(f) {
            Ok(text) => uris.extend(source_uris(&text)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e).with_context(|| format!("reading {}", f.display())),
        }
    }
    let Some(main) = uris.iter().find(|u| u.ends_with("/debian")).cloned() else {
        bail!(
            "the machine's apt sources ({}, {}/*.list, *.sources) name no Debian mirror \
             (an enabled `deb` entry whose URI ends in /debian): the guests' kernels \
             are fetched only from a configured mirror; add one (any Debian mirror or \
             a local proxy of one) and run again",
            etc_apt.join("sources.list").display(),
            parts.display()
        );
    };
    let security = uris
        .iter()
        .find(|u| u.ends_with("/debian-security"))
        .cloned();
    Ok(Mirrors { main, security })
}

/// The Debian mirror the machine's apt sources name (for debootstrap).
pub fn main_mirror() -> Result<String> {
    Ok(mirrors_in(Path::new("/etc/apt"))?.main)
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
    let Mirrors { main, security } = mirrors_in(Path::new("/etc/apt"))?;
    let key = "/usr/share/keyrings/debian-archive-keyring.gpg";
    let mut text = String::new();
    for suite in ["bullseye", "bookworm", "trixie"] {
        text.push_str(&format!("deb [signed-by={key}] {main} {suite} main\n"));
        // Without a configured security mirror the point releases' kernels
        // (on the main mirror) are used; none is guessed.
        if let Some(security) = &security {
            text.push_str(&format!(
                "deb [signed-by={key}] {security} {suite}-security main\n"
            ));
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake /etc/apt holding `files` (path under it, text).
    fn etc_apt(name: &str, files: &[(&str, &str)]) -> PathBuf {
        let d = std::env::temp_dir().join(format!("xtask-apt-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(d.join("sources.list.d")).unwrap();
        for (p, text) in files {
            std::fs::write(d.join(p), text).unwrap();
        }
        d
    }

    #[test]
    fn deb822_sources_give_the_configured_mirrors() {
        let d = etc_apt(
            "deb822",
            &[(
                "sources.list.d/debian.sources",
                "Types: deb\n# http://snapshot.debian.org/archive/debian/20250520T000000Z\n\
                 URIs: http://mirror.example/debian/\nSuites: bookworm\nComponents: main\n\n\
                 Types: deb\nURIs: http://mirror.example/debian-security\n\
                 Suites: bookworm-security\nComponents: main\n",
            )],
        );
        let m = mirrors_in(&d).unwrap();
        std::fs::remove_dir_all(&d).unwrap();
        assert_eq!(
            m,
            Mirrors {
                main: "http://mirror.example/debian".into(),
                security: Some("http://mirror.example/debian-security".into()),
            }
        );
    }

    #[test]
    fn one_line_sources_and_disabled_entries() {
        let d = etc_apt(
            "oneline",
            &[
                (
                    "sources.list",
                    "# deb http://commented.example/debian bookworm main\n\
                     deb [ arch=amd64 signed-by=/k.gpg ] http://one.example/debian bookworm main\n",
                ),
                // Not read by apt: neither .list nor .sources.
                (
                    "sources.list.d/x.list.disabled",
                    "deb http://disabled.example/debian-security bookworm-security main\n",
                ),
                (
                    "sources.list.d/off.sources",
                    "Types: deb\nURIs: http://off.example/debian-security\nEnabled: no\n",
                ),
            ],
        );
        let m = mirrors_in(&d).unwrap();
        std::fs::remove_dir_all(&d).unwrap();
        assert_eq!(
            m,
            Mirrors {
                main: "http://one.example/debian".into(),
                security: None,
            }
        );
    }

    #[test]
    fn sources_without_a_debian_mirror_are_an_error_not_a_public_fallback() {
        let d = etc_apt(
            "none",
            &[(
                "sources.list.d/other.list",
                "deb https://packages.cloud.google.com/apt cloud-sdk-bookworm main\n\
                 deb-src http://src-only.example/debian bookworm main\n",
            )],
        );
        let err = format!("{:#}", mirrors_in(&d).unwrap_err());
        std::fs::remove_dir_all(&d).unwrap();
        assert!(err.contains("name no Debian mirror"), "{err}");
        assert!(
            err.contains(&d.join("sources.list").display().to_string()),
            "{err}"
        );
        assert!(!err.contains("deb.debian.org"), "{err}");
    }
}
