//! The SELinux side: every path in `ANDROID_PATHS` and every path literal
//! in the daemon's source is labelled by `sepolicy/file_contexts` (or an
//! AOSP label) and granted by `sepolicy/vitalsd.te`, and every rule has a
//! comment naming its code path. Compiling it with the platform policy,
//! neverallows included, is `cargo xtask android-check`'s job.

use regex::Regex;

use super::{read, repo};
use crate::android::{
    ANDROID_PATHS, AOSP_LABELS, NOT_GRANTED, PROCESS_LABELLED, SOURCE_SCAN_EXEMPT,
};

// ------------------------------------------------------- policy parsing

/// One file_contexts entry: anchored regex, its fixed stem length (libselinux
/// prefers the most specific entry: the longest stem), and its type.
struct FcEntry {
    re: Regex,
    stem: usize,
    ty: String,
}

fn parse_file_contexts(text: &str) -> Vec<FcEntry> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            assert!(f.len() == 2 || f.len() == 3, "file_contexts line: {l}");
            let ctx = f[f.len() - 1];
            let ty = ctx
                .split(':')
                .nth(2)
                .unwrap_or_else(|| panic!("context {ctx}"));
            let stem = f[0]
                .find(|c: char| ".^$?*+|[({\\".contains(c))
                .unwrap_or(f[0].len());
            FcEntry {
                re: Regex::new(&format!("^(?:{})$", f[0])).unwrap(),
                stem,
                ty: ty.to_owned(),
            }
        })
        .collect()
}

/// A policy statement: `allow a b:c p;`-style rules and macro calls,
/// reduced to (keyword, arguments as type names).
#[derive(Debug)]
struct Stmt {
    keyword: String,
    args: Vec<String>,
}

fn split_names(s: &str) -> Vec<String> {
    s.split(|c: char| c.is_whitespace() || "{},;".contains(c))
        .map(|t| t.trim_start_matches(['-', '~']))
        .filter(|t| !t.is_empty())
        .map(str::to_owned)
        .collect()
}

fn parse_te(text: &str) -> Vec<Stmt> {
    let mut out = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let l = raw.trim();
        if l.is_empty() || l.starts_with('#') || l == "')" || l.ends_with("(`") {
            continue;
        }
        // `userdebug_or_eng(`rule')` on one line: look inside.
        let l = l
            .strip_prefix("userdebug_or_eng(`")
            .and_then(|r| r.strip_suffix("')"))
            .unwrap_or(l);
        if let Some((kw, rest)) = l.split_once('(') {
            let args = rest.trim_end_matches([')', ';']);
            out.push(Stmt {
                keyword: kw.trim().to_owned(),
                args: split_names(args),
            });
        } else {
            let (kw, rest) = l.split_once(char::is_whitespace).unwrap_or((l, ""));
            let args = match kw {
                "allow" | "dontaudit" | "neverallow" | "auditallow" => {
                    // source target:class perms; -> source, target
                    let (st, _) = rest.split_once(':').unwrap_or((rest, ""));
                    split_names(st)
                }
                "type" | "typeattribute" | "attribute" => split_names(rest),
                other => panic!("line {}: unknown statement `{other}`", i + 1),
            };
            out.push(Stmt {
                keyword: kw.to_owned(),
                args,
            });
        }
    }
    out
}

fn te_files() -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = std::fs::read_dir(repo().join("sepolicy"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "te"))
        .map(|p| {
            (
                p.file_name().unwrap().to_string_lossy().into_owned(),
                std::fs::read_to_string(&p).unwrap(),
            )
        })
        .collect();
    v.sort();
    assert!(v.iter().any(|(n, _)| n == "vitalsd.te"));
    v
}

struct Policy {
    fc: Vec<FcEntry>,
    stmts: Vec<Stmt>,
}

impl Policy {
    fn load() -> Self {
        Self {
            fc: parse_file_contexts(&read("sepolicy/file_contexts")),
            stmts: te_files().iter().flat_map(|(_, t)| parse_te(t)).collect(),
        }
    }

    /// The label of a concrete path: our file_contexts first (most specific
    /// entry), else the AOSP label of the longest matching prefix.
    fn label(&self, path: &str) -> Option<String> {
        if let Some(e) = self
            .fc
            .iter()
            .filter(|e| e.re.is_match(path))
            .max_by_key(|e| e.stem)
        {
            return Some(e.ty.clone());
        }
        AOSP_LABELS
            .iter()
            .filter_map(|(mount, sub, ty)| {
                let full = if *mount == "file_contexts" {
                    (*sub).to_owned()
                } else {
                    format!("{mount}{}", sub.trim_end_matches('/'))
                };
                under(path, &full).then_some((full.len(), *ty))
            })
            .max_by_key(|(len, _)| *len)
            .map(|(_, ty)| ty.to_owned())
    }

    /// Does the policy let vitalsd at `ty`?
    fn grants(&self, ty: &str) -> bool {
        self.stmts.iter().any(|s| match s.keyword.as_str() {
            "allow" | "r_dir_file" | "domain_auto_trans" => {
                s.args.first().map(String::as_str) == Some("vitalsd")
                    && s.args.iter().skip(1).any(|a| a == ty)
            }
            // init_daemon_domain(vitalsd) is what lets init exec vitalsd_exec.
            "init_daemon_domain" => format!("{}_exec", s.args[0]) == ty,
            // unix_socket_connect(client, vitalsd, vitalsd) -> vitalsd_socket.
            "unix_socket_connect" => format!("{}_socket", s.args[1]) == ty,
            _ => false,
        })
    }
}

/// `path` is `dir` or below it (component-wise).
fn under(path: &str, dir: &str) -> bool {
    path == dir || dir == "/" || path.starts_with(&format!("{}/", dir.trim_end_matches('/')))
}

/// Concrete paths standing for an ANDROID_PATHS pattern.
fn samples(pattern: &str) -> Vec<String> {
    let p = pattern.replace("<pid>", "1234");
    match p.strip_suffix('/') {
        Some(dir) => vec![dir.to_owned(), format!("{dir}/1234/x")],
        None => vec![p],
    }
}

/// Why `pattern` is covered, or None.
fn coverage(policy: &Policy, pattern: &str) -> Result<String, String> {
    if let Some((_, why)) = NOT_GRANTED.iter().find(|(p, _)| *p == pattern) {
        return Ok(format!("not granted on purpose: {why}"));
    }
    if let Some((_, ty)) = PROCESS_LABELLED.iter().find(|(p, _)| *p == pattern) {
        return match *ty {
            // Every domain reads its own /proc/self (AOSP domain.te).
            "self" => Ok("own /proc entries".into()),
            t if policy.grants(t) => Ok(format!("process-labelled, r_dir_file(vitalsd, {t})")),
            t => Err(format!(
                "labelled by the process domain but {t} is not granted"
            )),
        };
    }
    let mut why = Vec::new();
    for s in samples(pattern) {
        let Some(ty) = policy.label(&s) else {
            return Err(format!(
                "{s}: no file_contexts entry and no AOSP label (android::AOSP_LABELS)"
            ));
        };
        if !policy.grants(&ty) {
            return Err(format!("{s}: labelled {ty} but no vitalsd rule uses {ty}"));
        }
        why.push(ty);
    }
    Ok(why.join(", "))
}

#[test]
fn every_android_path_is_labelled_and_granted() {
    let policy = Policy::load();
    let failures: Vec<String> = ANDROID_PATHS
        .iter()
        .filter_map(|(p, used_by)| {
            coverage(&policy, p)
                .err()
                .map(|e| format!("{p} ({used_by}): {e}"))
        })
        .collect();
    assert!(failures.is_empty(), "uncovered:\n{}", failures.join("\n"));
    // The coverage check is not vacuous: things the policy does not cover fail.
    for uncovered in [
        "/sys/fs/bpf/prog_vitalsd_x",
        "/data/misc/other",
        "/dev/kmsg",
        "/proc/vmstat",
    ] {
        assert!(
            coverage(&policy, uncovered).is_err(),
            "{uncovered} must count as uncovered"
        );
    }
    // A labelled path whose type the .te never grants fails too.
    let mut without_stat = Policy::load();
    without_stat
        .stmts
        .retain(|s| !s.args.iter().any(|a| a == "proc_stat"));
    assert!(coverage(&without_stat, "/proc/stat").is_err());
}

#[test]
fn file_contexts_specific_entry_wins() {
    let policy = Policy::load();
    assert_eq!(
        policy
            .label("/data/misc/vitalsd/heapprofd/x.pftrace")
            .as_deref(),
        Some("vitalsd_heapprofd_data_file")
    );
    assert_eq!(
        policy.label("/data/misc/vitalsd/1.pftrace").as_deref(),
        Some("vitalsd_data_file")
    );
    assert_eq!(policy.label("/data/misc/vitalsdx"), None);
}

// ------------------------------------------------------- source scan

/// (file, literal) of every string literal in the daemon's non-test source
/// that starts with an absolute path under a scanned root.
fn path_literals() -> Vec<(String, String)> {
    let re =
        Regex::new(r#""(/(?:proc|sys|dev|data|system|vendor|run)(?:/[^"\s,]*)?)["\s,]"#).unwrap();
    let mut out = Vec::new();
    let mut stack = vec![repo().join("daemon/src")];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
                continue;
            }
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            let skip = !name.ends_with(".rs")
                // The lists themselves, and test-only files: a module's
                // `tests/` directory, and the names docs/architecture.md's
                // test convention gives them.
                || p.parent().is_some_and(|d| d.ends_with("tests"))
                || name == "android.rs"
                || name == "tests.rs"
                || name == "testutil.rs";
            if skip {
                continue;
            }
            let text = std::fs::read_to_string(&p).unwrap();
            let code = strip_test_modules(&text);
            for c in re.captures_iter(&code) {
                let rel = p.strip_prefix(repo()).unwrap().display().to_string();
                out.push((rel, c[1].to_owned()));
            }
        }
    }
    out.sort();
    out
}

/// The source without its `#[cfg(test)] mod … { … }` blocks (braces
/// counted; an unclosed block keeps the rest of the file, which only makes
/// the scan stricter). An out-of-line `#[cfg(test)] mod tests;` is skipped
/// alone: the code after it is still scanned.
fn strip_test_modules(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(at) = rest.find("#[cfg(test)]") {
        out.push_str(&rest[..at]);
        let after = &rest[at..];
        let Some(open) = after.find('{') else {
            return out + after;
        };
        if let Some(semi) = after.find(';').filter(|&semi| semi < open) {
            rest = &after[semi + 1..];
            continue;
        }
        let mut depth = 0usize;
        let mut end = None;
        for (i, c) in after[open..].char_indices() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        end = Some(open + i + 1);
                        break;
                    }
                }
                _ => {}
            }
        }
        match end {
            Some(e) => rest = &after[e..],
            None => return out + after,
        }
    }
    out + rest
}

#[test]
fn test_modules_are_stripped_but_code_after_them_is_kept() {
    let src = "const A: &str = \"/proc/a\";\n#[cfg(test)]\nmod tests {\n fn f() { let _ = \"/proc/t\"; }\n}\nconst B: &str = \"/proc/b\";\n";
    let code = strip_test_modules(src);
    assert!(code.contains("/proc/a") && code.contains("/proc/b"));
    assert!(!code.contains("/proc/t"));
    let src = "#[cfg(test)]\nmod tests;\nfn g() { let _ = \"/proc/c\"; }\n";
    assert!(strip_test_modules(src).contains("/proc/c"));
}

fn literal_covered(literal: &str) -> bool {
    let norm = Regex::new(r"\{[^}]*\}|<[^>]*>").unwrap();
    let lit = norm.replace_all(literal, "1234").into_owned();
    SOURCE_SCAN_EXEMPT.iter().any(|(p, _)| *p == literal)
        || ANDROID_PATHS.iter().any(|(p, _)| {
            let p = p.replace("<pid>", "1234");
            match p.strip_suffix('/') {
                Some(dir) => under(&lit, dir),
                None => lit == p,
            }
        })
}

#[test]
fn every_path_in_the_source_is_listed() {
    let lits = path_literals();
    // The scan sees the paths it must see (it is not silently empty).
    for must in [
        "/dev/socket/vitalsd",
        "/sys/kernel/tracing",
        "/system/bin/perfetto",
    ] {
        assert!(
            lits.iter().any(|(_, l)| l == must),
            "scan missed {must}: {lits:?}"
        );
    }
    let missing: Vec<String> = lits
        .iter()
        .filter(|(_, l)| !literal_covered(l))
        .map(|(f, l)| format!("{f}: {l}"))
        .collect();
    assert!(
        missing.is_empty(),
        "paths in code that neither android::ANDROID_PATHS nor SOURCE_SCAN_EXEMPT lists \
         (add them there and to sepolicy/):\n{}",
        missing.join("\n")
    );
    assert!(!literal_covered("/sys/kernel/new_thing"));
    assert!(!literal_covered("/procx"));
    // Every exemption is still needed: a stale one would hide nothing but
    // would mislead a reviewer.
    for (p, _) in SOURCE_SCAN_EXEMPT {
        assert!(lits.iter().any(|(_, l)| l == p), "stale exemption {p}");
    }
}

// ------------------------------------------------------- policy shape

// Whether every name is declared, the policy compiles and no neverallow
// is violated is checked by AOSP's own checkpolicy against the platform
// policy: `cargo xtask android-check` (1b), which replaced the name and
// self-loading checks that stood here.

#[test]
fn te_syntax_and_a_comment_on_every_rule() {
    for (name, text) in te_files() {
        let (mut parens, mut quotes) = (0i32, 0i32);
        for (i, l) in text.lines().enumerate() {
            let code = l.split('#').next().unwrap();
            for c in code.chars() {
                match c {
                    '(' => parens += 1,
                    ')' => parens -= 1,
                    '`' => quotes += 1,
                    '\'' => quotes -= 1,
                    _ => {}
                }
                assert!(parens >= 0 && quotes >= 0, "{name}:{}: unbalanced", i + 1);
            }
        }
        assert_eq!((parens, quotes), (0, 0), "{name}: unbalanced ( ) or ` '");

        let lines: Vec<&str> = text.lines().map(str::trim).collect();
        for (i, l) in lines.iter().enumerate() {
            let is_rule = !l.is_empty() && !l.starts_with('#') && *l != "')" && !l.ends_with("(`");
            if !is_rule {
                continue;
            }
            assert!(
                i > 0 && lines[i - 1].starts_with('#') && lines[i - 1].len() > 2,
                "{name}:{}: `{l}` needs a one-line comment above it naming the code path",
                i + 1
            );
            if l.starts_with("allow") || l.starts_with("dontaudit") {
                assert!(l.ends_with(';'), "{name}:{}: `{l}` lacks ';'", i + 1);
            }
        }
    }
}
