//! Check 1b: AOSP's platform policy compiled together with `sepolicy/`, as
//! the platform build does it, with the neverallow rules checked.
//!
//! The order is `build/soong/policy.go` (policyConfOrder: security_classes,
//! ..., te_macros, ioctl_*, attributes and *.te, ..., port_contexts), files
//! grouped by kind and, within a kind, in the order of the directory lists
//! of `Android.bp`'s `sepolicy_neverallows` module: the flagging macros
//! (`se_policy_conf_flags_defaults`), public, private, then the
//! SYSTEM_EXT_PRIVATE_SEPOLICY_DIRS (ours), then vendor. m4 runs with the
//! `-D target_*` definitions policy.go passes; `checkpolicy -M -c 30`
//! then builds the binary policy, which includes checking every neverallow
//! (the `sepolicy_neverallows` step of the build).
//!
//! Three compilations per build variant:
//! - **base**: AOSP unmodified + `sepolicy/`. Must pass: this is what an OEM
//!   gets by adding our directory and nothing else.
//! - **eBPF tier**: `sepolicy/` with `target_vitalsd_bpf=true`
//!   (BOARD_SEPOLICY_M4DEFS), over the AOSP policy with the platform
//!   exemptions of [`EXEMPTIONS`] applied to a temporary copy. Must pass.
//! - **eBPF tier without the exemptions** (user only): must fail, and only
//!   on the exempted neverallows, each of them: the exemptions are exactly
//!   what the eBPF tier needs, no more.
//!
//! Then AOSP's `checkfc` (tools/checkfc.c, built against Debian's libsepol
//! and Android libselinux) validates `file_contexts` and
//! `property_contexts`, each appended to the platform's, against the
//! compiled base policy.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, ensure, Context, Result};

/// build/soong/policy.go policyConfOrder; "attributes|*.te" is one group.
const CONF_ORDER: [&str; 20] = [
    "security_classes",
    "initial_sids",
    "access_vectors",
    "global_macros",
    "neverallow_macros",
    "mls_macros",
    "mls_decl",
    "mls",
    "policy_capabilities",
    "te_macros",
    "ioctl_defines",
    "ioctl_macros",
    "attributes|*.te",
    "roles_decl",
    "roles",
    "users",
    "initial_sid_contexts",
    "fs_use",
    "genfs_contexts",
    "port_contexts",
];

/// build/soong/policy.go: PolicyVers, MlsSens, MlsCats.
const POLICY_VERS: &str = "30";

/// The m4 definitions policy.go passes, for a non-ASan, non-coverage,
/// full-Treble device launched with debugfs restrictions (Android 11+).
fn m4_defs(variant: &str, arch: &str) -> Vec<String> {
    [
        ("mls_num_sens", "1"),
        ("mls_num_cats", "1024"),
        ("target_arch", arch),
        ("target_with_asan", "false"),
        ("target_with_dexpreopt", "true"),
        ("target_with_native_coverage", "false"),
        ("target_build_variant", variant),
        ("target_full_treble", "true"),
        ("target_compatible_property", "true"),
        ("target_treble_sysprop_neverallow", "true"),
        ("target_enforce_sysprop_owner", "true"),
        ("target_exclude_build_test", "false"),
        ("target_requires_insecure_execmem_for_swiftshader", "false"),
        ("target_enforce_debugfs_restriction", "true"),
        ("target_recovery", "false"),
    ]
    .iter()
    .map(|(k, v)| format!("{k}={v}"))
    .collect()
}

/// The BOARD_SEPOLICY_M4DEFS entry that turns on vitalsd's eBPF rules
/// (sepolicy/te_macros `vitalsd_bpf_only`).
pub const BPF_M4DEF: &str = "target_vitalsd_bpf=true";

/// The attribute the platform exemptions name (declared in
/// private/attributes by the same platform change).
pub const BPF_CLIENT_ATTR: &str = "oem_bpf_client";

/// A neverallow of AOSP's policy that reserves what vitalsd's eBPF tier
/// needs to named platform domains; the platform change adds
/// `-oem_bpf_client` to its exception list.
pub struct Exemption {
    /// Under system/sepolicy.
    pub file: &'static str,
    /// Text that identifies the statement (whitespace-normalised, comments
    /// dropped): it must match exactly one neverallow of the file.
    pub target: &'static str,
    /// What checkpolicy names after "violated by allow vitalsd" when the
    /// eBPF tier meets this neverallow unexempted.
    pub violation: &'static str,
    /// Why vitalsd needs it.
    pub why: &'static str,
}

/// What AOSP 14 reserves and vitalsd's eBPF tier uses; the same list as
/// docs/android.md "Platform change for the eBPF tier".
pub const EXEMPTIONS: [Exemption; 5] = [
    Exemption {
        file: "private/bpfloader.te",
        target: "} fs_bpf:file { getattr read };",
        violation: "fs_bpf:file { read }",
        why: "BPF_OBJ_GET of /sys/fs/bpf/{prog,map}_vitals_* opens the pins for read",
    },
    Exemption {
        file: "private/bpfloader.te",
        target: "} { bpffs_type -fs_bpf_vendor }:file write;",
        violation: "fs_bpf:file { write }",
        why: "the map pins are opened read-write (EXITED entries are deleted, CAPTURE is set)",
    },
    Exemption {
        file: "private/bpfloader.te",
        target: "} *:bpf prog_run;",
        violation: "bpfloader:bpf { prog_run }",
        why: "PERF_EVENT_IOC_SET_BPF with bpfloader's programs (as gpuservice, system_server)",
    },
    Exemption {
        file: "private/bpfloader.te",
        target: "} *:bpf { map_read map_write };",
        violation: "bpfloader:bpf { map_read map_write }",
        why: "reading TASKS, PROCESS_FAULTS, EXITED, CPU_STATE, DROPS; deleting EXITED entries",
    },
    Exemption {
        file: "private/coredomain.te",
        target: "} debugfs_tracing:file no_rw_file_perms;",
        violation: "debugfs_tracing:file {",
        why: "tracepoint ids and formats under /sys/kernel/tracing/events (perf_event_open)",
    },
];

/// The AOSP policy directories of a tree.
fn aosp_dirs(sepolicy: &Path) -> [PathBuf; 4] {
    [
        sepolicy.join("flagging"),
        sepolicy.join("public"),
        sepolicy.join("private"),
        sepolicy.join("vendor"),
    ]
}

fn conf_group(name: &str) -> Option<usize> {
    CONF_ORDER.iter().position(|g| {
        if *g == "attributes|*.te" {
            name == "attributes" || name.ends_with(".te")
        } else {
            *g == name
        }
    })
}

/// The m4 inputs in the build's order: by group, then directory, then
/// (for *.te) file name, as Soong's glob returns them.
pub fn conf_inputs(dirs: &[PathBuf]) -> Result<Vec<PathBuf>> {
    let mut v: Vec<(usize, usize, u8, String, PathBuf)> = Vec::new();
    for (d, dir) in dirs.iter().enumerate() {
        for e in std::fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))? {
            let p = e?.path();
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            if !p.is_file() {
                continue;
            }
            if let Some(g) = conf_group(&name) {
                // se_build_files lists "attributes" before "*.te".
                let te = u8::from(name.ends_with(".te"));
                v.push((g, d, te, name, p));
            }
        }
    }
    v.sort();
    Ok(v.into_iter().map(|t| t.4).collect())
}

/// m4 then checkpolicy; Err carries the tools' output.
pub fn compile(dirs: &[PathBuf], variant: &str, extra_defs: &[&str], out: &Path) -> Result<String> {
    let conf = out.with_extension("conf");
    let mut m4 = Command::new("m4");
    m4.arg("--fatal-warnings");
    for d in m4_defs(variant, "x86_64")
        .iter()
        .map(String::as_str)
        .chain(extra_defs.iter().copied())
    {
        m4.arg("-D").arg(d);
    }
    m4.arg("-s").args(conf_inputs(dirs)?);
    let o = m4
        .output()
        .context("running m4 (cargo xtask setup installs it)")?;
    ensure!(
        o.status.success(),
        "m4 failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    std::fs::write(&conf, &o.stdout)?;
    let o = Command::new("checkpolicy")
        .args(["-M", "-c", POLICY_VERS, "-o"])
        .arg(out)
        .arg(&conf)
        .output()
        .context("running checkpolicy (cargo xtask setup installs it)")?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    if !o.status.success() {
        bail!("checkpolicy -M -c {POLICY_VERS} ({variant}) failed:\n{text}");
    }
    Ok(text)
}

/// Byte ranges of the neverallow statements of a policy source: from the
/// keyword to its `;`, skipping `#` comments.
fn neverallows(text: &str) -> Vec<(usize, usize)> {
    let b = text.as_bytes();
    let mut out = Vec::new();
    let (mut i, mut start) = (0, None);
    while i < b.len() {
        match b[i] {
            b'#' => {
                while i < b.len() && b[i] != b'\n' {
                    i += 1;
                }
                continue;
            }
            b';' => {
                if let Some(s) = start.take() {
                    out.push((s, i + 1));
                }
            }
            b'n' if start.is_none()
                && text[i..].starts_with("neverallow")
                && (i == 0 || !(b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_')) =>
            {
                start = Some(i);
            }
            _ => {}
        }
        i += 1;
    }
    out
}

/// Whitespace-normalised statement text without comments.
fn normalise(stmt: &str) -> String {
    stmt.lines()
        .map(|l| l.split('#').next().unwrap())
        .collect::<Vec<_>>()
        .join(" ")
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

/// The line checkpolicy reports for the statement at bytes `at..end`: the
/// line of its closing `;` (where the parser reduces it), or, inside a
/// multi-line m4 argument such as `full_treble_only(` ... `')`, the line
/// where that argument opens (`m4 -s` marks every line of an expansion
/// with the invocation's line).
fn reported_line(text: &str, at: usize, end: usize) -> usize {
    let b = text.as_bytes();
    let (mut depth, mut open, mut i) = (0usize, 0usize, 0usize);
    while i < at {
        match b[i] {
            // Outside quotes m4 copies comments through unread.
            b'#' if depth == 0 => {
                while i < at && b[i] != b'\n' {
                    i += 1;
                }
                continue;
            }
            b'`' => {
                if depth == 0 {
                    open = i;
                }
                depth += 1;
            }
            b'\'' if depth > 0 => depth -= 1,
            _ => {}
        }
        i += 1;
    }
    let pos = if depth > 0 { open } else { end - 1 };
    text[..pos].matches('\n').count() + 1
}

/// Adds `-<attr>` to the exception list of the one neverallow of `text`
/// matching `target`; returns the edited text and the line checkpolicy
/// reports for the statement ([`reported_line`]).
pub fn exempt(text: &str, target: &str, attr: &str) -> Result<(String, usize)> {
    let hits: Vec<(usize, usize)> = neverallows(text)
        .into_iter()
        .filter(|&(s, e)| normalise(&text[s..e]).contains(target))
        .collect();
    ensure!(
        hits.len() == 1,
        "{} neverallows match `{target}` (want exactly 1): the platform policy changed; \
         review the exemptions",
        hits.len()
    );
    let (s, e) = hits[0];
    let brace = s + text[s..e]
        .find('{')
        .with_context(|| format!("`{target}` has no exception list"))?;
    let line = reported_line(text, s, e);
    Ok((
        format!("{} -{attr}{}", &text[..=brace], &text[brace + 1..]),
        line,
    ))
}

/// A neverallow statement: (file under system/sepolicy, reported line).
type Stmt = (String, usize);

/// A copy of the AOSP policy dirs with the platform change: the
/// attribute declared and, if `exempt_all`, [`EXEMPTIONS`] applied. Returns
/// the copy's dirs and each exempted statement as (file, line).
fn platform_copy(
    sepolicy: &Path,
    work: &Path,
    exempt_all: bool,
) -> Result<(Vec<PathBuf>, Vec<Stmt>)> {
    let copy = work.join(if exempt_all {
        "sepolicy-exempted"
    } else {
        "sepolicy-attribute-only"
    });
    if copy.exists() {
        std::fs::remove_dir_all(&copy)?;
    }
    let mut dirs = Vec::new();
    for d in aosp_dirs(sepolicy) {
        let dest = copy.join(d.file_name().unwrap());
        std::fs::create_dir_all(&dest)?;
        for e in std::fs::read_dir(&d)? {
            let p = e?.path();
            if p.is_file() {
                std::fs::copy(&p, dest.join(p.file_name().unwrap()))?;
            }
        }
        dirs.push(dest);
    }
    let mut lines = Vec::new();
    for x in &EXEMPTIONS {
        let f = copy.join(x.file);
        let text = std::fs::read_to_string(&f)?;
        let (edited, line) =
            exempt(&text, x.target, BPF_CLIENT_ATTR).with_context(|| x.file.to_string())?;
        if exempt_all {
            std::fs::write(&f, edited)?;
        }
        lines.push((x.file.to_owned(), line));
    }
    let attrs = copy.join("private/attributes");
    let mut a = std::fs::read_to_string(&attrs)?;
    a.push_str(&format!(
        "\n# Platform daemons added by the device maker that attach bpfloader's\n\
         # pinned tracepoint programs and read their maps (vitalsd).\n\
         attribute {BPF_CLIENT_ATTR};\n"
    ));
    std::fs::write(&attrs, a)?;
    Ok((dirs, lines))
}

/// (file under system/sepolicy, line, the violating rule) of each
/// neverallow checkpolicy reported violated.
fn violated(output: &str, sepolicy: &Path) -> Vec<(String, usize, String)> {
    let prefix = format!("{}/", sepolicy.display());
    output
        .lines()
        .filter_map(|l| {
            let rest = l.split("neverallow on line ").nth(1)?;
            let (line, rest) = rest.split_once(" of ")?;
            let file = rest.split_whitespace().next()?;
            let by = rest.split("violated by allow ").nth(1).unwrap_or("");
            Some((
                file.strip_prefix(&prefix).unwrap_or(file).to_owned(),
                line.parse().ok()?,
                by.to_owned(),
            ))
        })
        .collect()
}

/// tools/checkfc.c, built once.
fn build_checkfc(sepolicy: &Path, out: &Path) -> Result<()> {
    let o = Command::new("gcc")
        .args(["-O1", "-I", super::loader::DEBIAN_ANDROID_INCLUDE, "-o"])
        .arg(out)
        .arg(sepolicy.join("tools/checkfc.c"))
        .arg("-l:libsepol.a")
        .arg(format!("-L{}", super::loader::DEBIAN_ANDROID_LIB))
        .arg(format!("-Wl,-rpath,{}", super::loader::DEBIAN_ANDROID_LIB))
        .arg("-lselinux")
        .output()
        .context("running gcc")?;
    ensure!(
        o.status.success(),
        "building checkfc failed:\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    Ok(())
}

/// checkfc `flag` on the platform's `name` file with ours appended.
fn checkfc(
    bin: &Path,
    flag: &str,
    policy: &Path,
    sepolicy: &Path,
    ours: &Path,
    name: &str,
    work: &Path,
) -> Result<String> {
    let mut text = std::fs::read_to_string(sepolicy.join("private").join(name))?;
    text.push('\n');
    text.push_str(&std::fs::read_to_string(ours.join(name))?);
    let combined = work.join(name);
    std::fs::write(&combined, text)?;
    let o = Command::new(bin)
        .arg(flag)
        .arg(policy)
        .arg(&combined)
        .output()?;
    let out = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    ensure!(
        o.status.success(),
        "checkfc {flag} {name} (platform's + ours) failed ({}):\n{out}",
        o.status
    );
    Ok(format!(
        "  checkfc {flag}: platform {name} + sepolicy/{name} valid against the user policy"
    ))
}

/// Check 1b.
pub fn check(root: &Path, sepolicy: &Path, work: &Path) -> Result<String> {
    let ours = root.join("sepolicy");
    let aosp = aosp_dirs(sepolicy);
    let with_ours = |dirs: &[PathBuf]| -> Vec<PathBuf> {
        let mut v = dirs[..3].to_vec();
        v.push(ours.clone());
        v.push(dirs[3].clone());
        v
    };
    std::fs::create_dir_all(work)?;
    let mut report = Vec::new();
    let base = with_ours(&aosp);
    for variant in ["user", "userdebug"] {
        let t = std::time::Instant::now();
        compile(
            &base,
            variant,
            &[],
            &work.join(format!("base-{variant}.policy")),
        )?;
        report.push(format!(
            "  base, {variant}: AOSP policy + sepolicy/ compiled, neverallows checked ({:.0} s)",
            t.elapsed().as_secs_f64()
        ));
    }

    let checkfc_bin = work.join("checkfc");
    build_checkfc(sepolicy, &checkfc_bin)?;
    let user_policy = work.join("base-user.policy");
    report.push(checkfc(
        &checkfc_bin,
        "-e",
        &user_policy,
        sepolicy,
        &ours,
        "file_contexts",
        work,
    )?);
    report.push(checkfc(
        &checkfc_bin,
        "-p",
        &user_policy,
        sepolicy,
        &ours,
        "property_contexts",
        work,
    )?);

    let (exempted, stmts) = platform_copy(sepolicy, work, true)?;
    let bpf_dirs = with_ours(&exempted);
    for variant in ["user", "userdebug"] {
        compile(
            &bpf_dirs,
            variant,
            &[BPF_M4DEF],
            &work.join(format!("bpf-{variant}.policy")),
        )?;
        report.push(format!(
            "  eBPF tier ({BPF_M4DEF}), {variant}: compiled with the {} platform exemptions, \
             neverallows checked",
            stmts.len()
        ));
    }
    // The attribute alone: the eBPF rules against AOSP's neverallows as they are.
    let (attr_only, _) = platform_copy(sepolicy, work, false)?;
    let unexempted = with_ours(&attr_only);
    match compile(
        &unexempted,
        "user",
        &[BPF_M4DEF],
        &work.join("bpf-unexempted.policy"),
    ) {
        Ok(_) => bail!(
            "the eBPF tier compiled against the unmodified platform policy: the exemptions \
             (docs/android.md) are no longer needed; drop them"
        ),
        Err(e) => {
            let out = format!("{e:#}");
            let hit = violated(&out, attr_only[0].parent().unwrap());
            ensure!(!hit.is_empty(), "expected neverallow failures, got:\n{out}");
            // Which exemption covers a violation: same file, same reported
            // line, and the violating rule is the one it was written for.
            let covers = |k: usize, h: &(String, usize, String)| {
                (stmts[k].0.as_str(), stmts[k].1) == (h.0.as_str(), h.1)
                    && h.2.contains(EXEMPTIONS[k].violation)
            };
            for h in &hit {
                ensure!(
                    (0..stmts.len()).any(|k| covers(k, h)),
                    "the eBPF tier violates a neverallow the exemptions do not cover \
                     ({}:{}, {}):\n{out}",
                    h.0,
                    h.1,
                    h.2
                );
            }
            for (k, s) in stmts.iter().enumerate() {
                ensure!(
                    hit.iter().any(|h| covers(k, h)),
                    "exemption {}:{} is not needed (nothing violates it):\n{out}",
                    s.0,
                    s.1
                );
            }
            report.push(format!(
                "  eBPF tier without the exemptions: fails on exactly the {} exempted neverallows:",
                stmts.len()
            ));
            for ((f, l), x) in stmts.iter().zip(&EXEMPTIONS) {
                report.push(format!("    {f}:{l} ({}): {}", x.violation, x.why));
            }
        }
    }
    Ok(report.join("\n"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn te_files_follow_attributes_and_groups_follow_policy_go() {
        let d = tempfile_dir();
        let (a, b) = (d.join("a"), d.join("b"));
        for (dir, files) in [
            (
                &a,
                &["z.te", "attributes", "te_macros", "security_classes"][..],
            ),
            (&b, &["a.te", "te_macros", "file_contexts"][..]),
        ] {
            std::fs::create_dir_all(dir).unwrap();
            for f in files {
                std::fs::write(dir.join(f), "").unwrap();
            }
        }
        let got: Vec<String> = conf_inputs(&[a.clone(), b.clone()])
            .unwrap()
            .iter()
            .map(|p| p.strip_prefix(&d).unwrap().display().to_string())
            .collect();
        assert_eq!(
            got,
            [
                "a/security_classes",
                "a/te_macros",
                "b/te_macros",
                "a/attributes",
                "a/z.te",
                "b/a.te"
            ]
        );
        std::fs::remove_dir_all(d).unwrap();
    }

    fn tempfile_dir() -> PathBuf {
        let d = std::env::temp_dir().join(format!(
            "xtask-policy-test-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn exempt_edits_exactly_the_matching_neverallow() {
        let text = "# a; comment\nneverallow { domain -a } x:file read;\n\
                    neverallow {\n  domain\n  -b # why; here\n} *:bpf prog_run;\n";
        let (out, line) = exempt(text, "} *:bpf prog_run;", "attr").unwrap();
        assert_eq!(line, 6);
        // Inside a multi-line m4 argument, checkpolicy names the line it opens on.
        let m4 = "# it's\nfull_treble_only(`\n  neverallow { domain -x } y:file read;\n')\n";
        assert_eq!(exempt(m4, "} y:file read;", "attr").unwrap().1, 2);
        assert!(out.contains("neverallow { -attr\n  domain\n  -b"));
        assert!(out.contains("neverallow { domain -a } x:file read;"));
        assert!(exempt(text, "} y:file read;", "attr").is_err());
        let twice = format!("{text}{text}");
        assert!(exempt(&twice, "} *:bpf prog_run;", "attr").is_err());
    }

    #[test]
    fn violations_are_read_from_checkpolicy_output() {
        let out =
            "libsepol.report_failure: neverallow on line 68 of /x/sepolicy/private/bpfloader.te \
                   (or line 46617 of /tmp/a.conf) violated by allow v bpfloader:bpf { map_read };";
        assert_eq!(
            violated(out, Path::new("/x/sepolicy")),
            [(
                "private/bpfloader.te".to_owned(),
                68,
                "v bpfloader:bpf { map_read };".to_owned()
            )]
        );
    }
}
