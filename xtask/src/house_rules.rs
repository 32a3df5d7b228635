//! The size rules of the house (issue #15), checked so they hold: no file
//! of the project's Rust sources over 700 lines, and no function in
//! `daemon/src` over 120 lines unless the line before it says why with a
//! `// long:` comment. Function lengths are measured from the `fn` line to
//! its closing brace by counting braces outside strings, chars and
//! comments: a rough lexer, good enough for rustfmt-formatted code.

use std::path::{Path, PathBuf};

#[cfg(test)]
mod import_cycles;

pub const MAX_FILE_LINES: usize = 700;
pub const MAX_FN_LINES: usize = 120;

/// Every `.rs` file under `dir`.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(rust_files(&p));
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
    out
}

/// `line` with string and char literals emptied and a trailing `//`
/// comment cut, so braces inside them are not counted.
fn code_of(line: &str) -> String {
    let mut out = String::new();
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '"' => {
                while let Some(d) = chars.next() {
                    match d {
                        '\\' => {
                            chars.next();
                        }
                        '"' => break,
                        _ => {}
                    }
                }
            }
            // A char literal ('{', '\''), not a lifetime ('a).
            '\'' => {
                let rest: String = chars.clone().take(3).collect();
                if rest.starts_with('\\') {
                    chars.next();
                    chars.next();
                    chars.next();
                } else if rest.chars().nth(1) == Some('\'') {
                    chars.next();
                    chars.next();
                }
            }
            '/' if chars.peek() == Some(&'/') => break,
            _ => out.push(c),
        }
    }
    out
}

/// (first line, length, name) of each function in `text` (1-based lines).
fn functions(text: &str) -> Vec<(usize, usize, String)> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    for (i, l) in lines.iter().enumerate() {
        let code = code_of(l);
        let words: Vec<&str> = code.split_whitespace().collect();
        let Some(at) = words.iter().position(|w| *w == "fn") else {
            continue;
        };
        // Only items: `fn` first or after qualifiers (pub, const, async...;
        // `extern "C"` is plain `extern` once code_of has emptied strings).
        let qualifiers = [
            "pub",
            "pub(crate)",
            "pub(super)",
            "const",
            "async",
            "unsafe",
            "extern",
        ];
        if !words[..at].iter().all(|w| qualifiers.contains(w)) {
            continue;
        }
        let Some(name) = words.get(at + 1) else {
            continue;
        };
        let name: String = name
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        let mut depth = 0i64;
        let mut opened = false;
        for (j, m) in lines.iter().enumerate().skip(i) {
            let code = code_of(m);
            for c in code.chars() {
                match c {
                    '{' => {
                        depth += 1;
                        opened = true;
                    }
                    '}' => depth -= 1,
                    _ => {}
                }
            }
            // A declaration without a body (trait method, extern).
            if !opened && code.trim_end().ends_with(';') {
                break;
            }
            if opened && depth <= 0 {
                out.push((i + 1, j - i + 1, name.clone()));
                break;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::util::workspace_root;

    #[test]
    fn no_source_file_is_over_700_lines() {
        let root = workspace_root();
        let mut long = Vec::new();
        for dir in [
            "daemon/src",
            "xtask/src",
            "tests",
            "ebpf-programs",
            "proto/src",
        ] {
            for f in rust_files(&root.join(dir)) {
                let n = std::fs::read_to_string(&f).unwrap().lines().count();
                if n > MAX_FILE_LINES {
                    long.push(format!("{} ({n} lines)", f.display()));
                }
            }
        }
        assert!(
            long.is_empty(),
            "over {MAX_FILE_LINES} lines: {long:?}; split by concern"
        );
    }

    #[test]
    fn no_daemon_function_is_over_120_lines_unless_it_says_why() {
        let mut long = Vec::new();
        for f in rust_files(&workspace_root().join("daemon/src")) {
            let text = std::fs::read_to_string(&f).unwrap();
            let lines: Vec<&str> = text.lines().collect();
            for (line, len, name) in functions(&text) {
                let said_why = line >= 2 && lines[line - 2].trim_start().starts_with("// long:");
                if len > MAX_FN_LINES && !said_why {
                    long.push(format!("{}:{line} {name} ({len} lines)", f.display()));
                }
            }
        }
        assert!(
            long.is_empty(),
            "functions over {MAX_FN_LINES} lines: {long:?}; split them, or say why in a \
             `// long:` comment on the line before"
        );
    }

    #[test]
    fn the_measure_counts_braces_of_code_only() {
        let text = "pub fn a() {\n    let s = \"}}}\";\n    let c = '{';\n    // }\n    if x {\n    }\n}\n\
                    fn b<'a>(x: &'a str) -> &'a str {\n    x\n}\n\
                    trait T {\n    fn c(&self);\n}\n\
                    pub unsafe extern \"C\" fn d() {\n}\n";
        let f = functions(text);
        assert_eq!(
            f,
            vec![
                (1, 7, "a".to_owned()),
                (8, 3, "b".to_owned()),
                (14, 2, "d".to_owned())
            ],
            "{f:?}"
        );
    }
}
