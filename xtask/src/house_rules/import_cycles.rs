//! The import rule of the house (issue #20): **under each module, the graph
//! of its child modules is acyclic**, at every level of `daemon/src`'s
//! module tree (the crate root's modules included).
//!
//! Precisely: module A *depends on* module B when a file of A (or of a
//! module inside A, inline `mod tests { .. }` included) names a path into
//! B: a `use crate::…`, `use super::…` or `use self::…` tree, or a
//! `crate::…`/`super::…` path in code. A path that names an item a module
//! re-exports (`pub use child::X`) depends on the child that defines X,
//! not on the re-exporter: a re-export does not hide a dependency. For two
//! modules with parent P (their lowest common ancestor), A's dependency on
//! B is an edge between the children of P that hold them. A module using
//! its ancestors' items (`super::X`, `crate::x::X` from inside `x`) or its
//! descendants' is no edge: parent and child are one room and its rooms.
//! The rule fails, naming each cycle with the file, line and path of every
//! edge in it, when some P's children form a cycle, directly (load uses
//! pins, pins uses load) or through a longer one. The fix is to move what
//! both need down, into a module both use, not to hide the import.
//!
//! The module tree is walked from `lib.rs` through `mod x;` declarations
//! (with `#[path]`), so files are named as rustc names them. Comments,
//! strings and char literals are skipped; the parser is a rough lexer for
//! rustfmt-formatted code, like the size rules'. The binaries (`src/bin`)
//! are crates of their own and not part of the graph.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    path::{Path, PathBuf},
};

/// One token of Rust code with its 1-based line.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Tok {
    Ident(String),
    /// `::`
    Sep,
    Punct(char),
}

/// The tokens of `text`, comments and literals left out.
fn tokens(text: &str) -> Vec<(usize, Tok)> {
    let chars: Vec<char> = text.chars().collect();
    let mut out = Vec::new();
    let mut line = 1;
    let mut i = 0;
    let at = |i: usize| chars.get(i).copied().unwrap_or('\0');
    while i < chars.len() {
        let c = chars[i];
        match c {
            '\n' => {
                line += 1;
                i += 1;
            }
            '/' if at(i + 1) == '/' => {
                while i < chars.len() && chars[i] != '\n' {
                    i += 1;
                }
            }
            '/' if at(i + 1) == '*' => {
                let mut depth = 0;
                while i < chars.len() {
                    if chars[i] == '/' && at(i + 1) == '*' {
                        depth += 1;
                        i += 2;
                    } else if chars[i] == '*' && at(i + 1) == '/' {
                        depth -= 1;
                        i += 2;
                        if depth == 0 {
                            break;
                        }
                    } else {
                        if chars[i] == '\n' {
                            line += 1;
                        }
                        i += 1;
                    }
                }
            }
            '"' => {
                i += 1;
                while i < chars.len() && chars[i] != '"' {
                    if chars[i] == '\\' {
                        i += 1;
                    }
                    if at(i) == '\n' {
                        line += 1;
                    }
                    i += 1;
                }
                i += 1;
            }
            // A char literal ('{', '\''), not a lifetime ('a).
            '\'' => {
                if at(i + 1) == '\\' {
                    i += 2;
                    while i < chars.len() && chars[i] != '\'' {
                        i += 1;
                    }
                    i += 1;
                } else if at(i + 2) == '\'' {
                    i += 3;
                } else {
                    i += 1;
                }
            }
            ':' if at(i + 1) == ':' => {
                out.push((line, Tok::Sep));
                i += 2;
            }
            c if c.is_alphanumeric() || c == '_' => {
                let start = i;
                while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                    i += 1;
                }
                let word: String = chars[start..i].iter().collect();
                // Raw strings: r"..", r#".."#, br"..".
                if (word == "r" || word == "br") && matches!(at(i), '"' | '#') {
                    let mut hashes = 0;
                    while at(i) == '#' {
                        hashes += 1;
                        i += 1;
                    }
                    if at(i) == '"' {
                        i += 1;
                        loop {
                            if i >= chars.len() {
                                break;
                            }
                            if chars[i] == '\n' {
                                line += 1;
                            }
                            if chars[i] == '"' && (1..=hashes).all(|k| at(i + k) == '#') {
                                i += 1 + hashes;
                                break;
                            }
                            i += 1;
                        }
                        continue;
                    }
                }
                out.push((line, Tok::Ident(word)));
            }
            c if c.is_whitespace() => i += 1,
            c => {
                out.push((line, Tok::Punct(c)));
                i += 1;
            }
        }
    }
    out
}

/// A module of the crate: its path from the crate root and its file.
#[derive(Debug)]
struct Module {
    path: Vec<String>,
    file: PathBuf,
}

/// Every out-of-line module of the crate whose root is `lib`, from its
/// `mod x;` declarations (`#[path = ".."]` honoured).
fn module_tree(lib: &Path) -> Vec<Module> {
    let mut out = Vec::new();
    let mut todo = vec![Module {
        path: Vec::new(),
        file: lib.to_path_buf(),
    }];
    while let Some(m) = todo.pop() {
        let text = std::fs::read_to_string(&m.file).unwrap_or_default();
        let dir = m.file.parent().unwrap().to_path_buf();
        let stem = m.file.file_stem().unwrap().to_string_lossy().into_owned();
        let child_dir = if stem == "mod" || stem == "lib" {
            dir.clone()
        } else {
            dir.join(&stem)
        };
        let mut path_attr: Option<String> = None;
        for l in text.lines() {
            let t = l.trim();
            if let Some(p) = t.strip_prefix("#[path = \"") {
                path_attr = p.split('"').next().map(str::to_owned);
                continue;
            }
            let decl = t
                .trim_start_matches("pub(crate) ")
                .trim_start_matches("pub(super) ")
                .trim_start_matches("pub ");
            let name = decl
                .strip_prefix("mod ")
                .and_then(|n| n.strip_suffix(';'))
                .filter(|n| n.chars().all(|c| c.is_alphanumeric() || c == '_'));
            if let Some(name) = name {
                let file = match path_attr.take() {
                    Some(p) => dir.join(p),
                    None if child_dir.join(format!("{name}.rs")).exists() => {
                        child_dir.join(format!("{name}.rs"))
                    }
                    None => child_dir.join(name).join("mod.rs"),
                };
                let mut path = m.path.clone();
                path.push(name.to_owned());
                todo.push(Module { path, file });
            } else if !t.starts_with("#[") {
                path_attr = None;
            }
        }
        out.push(m);
    }
    out
}

/// A path named in a module's code: where, what, and from which module
/// (the file's, plus any inline `mod x {` it sits in).
#[derive(Debug, Clone)]
struct Named {
    line: usize,
    from: Vec<String>,
    /// Absolute segments (after `crate`), unresolved.
    target: Vec<String>,
    /// `pub use`: the last segment is re-exported from `from` under `alias`.
    reexport: Option<String>,
}

/// Flattens the use tree at `toks[*i..]` (up to `;` or the closing `}` of
/// a group) into full paths, each with its alias (`as`) if any.
fn use_tree(
    toks: &[(usize, Tok)],
    i: &mut usize,
    prefix: &[String],
    out: &mut Vec<(Vec<String>, Option<String>)>,
) {
    let mut cur = prefix.to_vec();
    let mut alias = None;
    while *i < toks.len() {
        match &toks[*i].1 {
            Tok::Ident(w) if w == "as" => {
                if let Some((_, Tok::Ident(a))) = toks.get(*i + 1) {
                    alias = Some(a.clone());
                }
                *i += 2;
                continue;
            }
            Tok::Ident(w) => cur.push(w.clone()),
            Tok::Sep => {}
            Tok::Punct('{') => {
                *i += 1;
                use_tree(toks, i, &cur, out);
                // `use_tree` stopped on the group's `}`.
                cur = prefix.to_vec();
            }
            Tok::Punct(',') => {
                if cur.len() > prefix.len() {
                    out.push((std::mem::replace(&mut cur, prefix.to_vec()), alias.take()));
                }
            }
            Tok::Punct('}') | Tok::Punct(';') => {
                if cur.len() > prefix.len() {
                    out.push((cur, alias));
                }
                return;
            }
            Tok::Punct(_) => {}
        }
        *i += 1;
    }
}

/// Makes `path` (as written in module `from`) absolute: `crate::`,
/// `super::`, `self::` and a first segment naming a child of `from`.
/// None for paths outside the crate (std, aya...).
fn absolute(
    from: &[String],
    path: &[String],
    children: &BTreeSet<Vec<String>>,
) -> Option<Vec<String>> {
    let mut base: Vec<String> = from.to_vec();
    let mut rest = path;
    match rest.first().map(String::as_str) {
        Some("crate") => {
            base.clear();
            rest = &rest[1..];
        }
        Some("self") => rest = &rest[1..],
        Some("super") => {
            while rest.first().map(String::as_str) == Some("super") {
                base.pop()?;
                rest = &rest[1..];
            }
        }
        Some(first) => {
            let mut child = from.to_vec();
            child.push(first.to_owned());
            if !children.contains(&child) {
                return None;
            }
        }
        None => return None,
    }
    // `use super::{self}` names the module itself.
    let rest: Vec<String> = rest.iter().filter(|s| *s != "self").cloned().collect();
    base.extend(rest);
    Some(base)
}

/// The paths into the crate named in `text`, the file of module `module`.
fn named_paths(text: &str, module: &[String], modules: &BTreeSet<Vec<String>>) -> Vec<Named> {
    let toks = tokens(text);
    let mut out = Vec::new();
    // Inline modules open here: (name, brace depth inside it).
    let mut inline: Vec<(String, i32)> = Vec::new();
    let mut depth = 0;
    let mut i = 0;
    let here = |inline: &[(String, i32)]| {
        let mut m = module.to_vec();
        m.extend(inline.iter().map(|(n, _)| n.clone()));
        m
    };
    while i < toks.len() {
        let (line, tok) = &toks[i];
        match tok {
            Tok::Punct('{') => depth += 1,
            Tok::Punct('}') => {
                depth -= 1;
                if inline.last().is_some_and(|(_, d)| depth < *d) {
                    inline.pop();
                }
            }
            Tok::Ident(w) if w == "mod" => {
                if let (Some((_, Tok::Ident(name))), Some((_, Tok::Punct('{')))) =
                    (toks.get(i + 1), toks.get(i + 2))
                {
                    depth += 1;
                    inline.push((name.clone(), depth));
                    i += 3;
                    continue;
                }
            }
            Tok::Ident(w) if w == "use" => {
                let public = i > 0
                    && (matches!(&toks[i - 1].1, Tok::Ident(p) if p == "pub")
                        || matches!(&toks[i - 1].1, Tok::Punct(')')));
                let mut j = i + 1;
                let mut paths = Vec::new();
                use_tree(&toks, &mut j, &[], &mut paths);
                let from = here(&inline);
                for (p, alias) in paths {
                    let Some(target) = absolute(&from, &p, modules) else {
                        continue;
                    };
                    let reexport = public
                        .then(|| alias.unwrap_or_else(|| p.last().cloned().unwrap_or_default()));
                    out.push(Named {
                        line: *line,
                        from: from.clone(),
                        target,
                        reexport,
                    });
                }
                i = j + 1;
                continue;
            }
            Tok::Ident(w)
                if (w == "crate" || w == "super")
                    && toks.get(i + 1).map(|t| &t.1) == Some(&Tok::Sep) =>
            {
                // A path in code: `crate::a::b(..)`, `super::x::Y`.
                let mut p = vec![w.clone()];
                let mut j = i + 1;
                while toks.get(j).map(|t| &t.1) == Some(&Tok::Sep) {
                    match toks.get(j + 1) {
                        Some((_, Tok::Ident(s))) => p.push(s.clone()),
                        _ => break,
                    }
                    j += 2;
                }
                let from = here(&inline);
                if let Some(target) = absolute(&from, &p, modules) {
                    out.push(Named {
                        line: *line,
                        from,
                        target,
                        reexport: None,
                    });
                }
                i = j;
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    out
}

/// The module a path `target` lands in: its deepest module prefix, after
/// following re-exports (`reexports[module][name]` = the re-exported path).
fn resolve(
    target: &[String],
    modules: &BTreeSet<Vec<String>>,
    reexports: &HashMap<Vec<String>, HashMap<String, Vec<String>>>,
) -> Vec<String> {
    let mut target = target.to_vec();
    for _ in 0..8 {
        let mut m: Vec<String> = Vec::new();
        let mut k = 0;
        while k < target.len() {
            let mut next = m.clone();
            next.push(target[k].clone());
            if modules.contains(&next) {
                m = next;
                k += 1;
            } else {
                break;
            }
        }
        match target.get(k).and_then(|s| reexports.get(&m)?.get(s)) {
            Some(to) if to.as_slice() != target.as_slice() => {
                let mut t = to.clone();
                t.extend_from_slice(&target[k + 1..]);
                target = t;
            }
            _ => return m,
        }
    }
    target
}

/// One dependency between sibling modules: under `parent`, child `from`
/// uses child `to`, as `why` says (file:line `path`).
type Edges = BTreeMap<Vec<String>, BTreeMap<(String, String), String>>;

/// The sibling edges of the crate rooted at `lib`.
fn sibling_edges(lib: &Path, root: &Path) -> Edges {
    let tree = module_tree(lib);
    let mut modules: BTreeSet<Vec<String>> = tree.iter().map(|m| m.path.clone()).collect();
    let mut named = Vec::new();
    for m in &tree {
        let text = std::fs::read_to_string(&m.file).unwrap_or_default();
        let file = m
            .file
            .strip_prefix(root)
            .unwrap_or(&m.file)
            .display()
            .to_string();
        for n in named_paths(&text, &m.path, &modules) {
            // Inline modules are modules too (`tests`), for resolving.
            modules.insert(n.from.clone());
            named.push((file.clone(), n));
        }
    }
    let mut reexports: HashMap<Vec<String>, HashMap<String, Vec<String>>> = HashMap::new();
    for (_, n) in &named {
        if let Some(alias) = &n.reexport {
            reexports
                .entry(n.from.clone())
                .or_default()
                .insert(alias.clone(), n.target.clone());
        }
    }
    let mut edges = Edges::new();
    for (file, n) in &named {
        let to = resolve(&n.target, &modules, &reexports);
        let common = n.from.iter().zip(&to).take_while(|(a, b)| a == b).count();
        // An ancestor's or a descendant's items: no sibling edge.
        if common == n.from.len() || common == to.len() {
            continue;
        }
        let why = format!("{file}:{} `{}`", n.line, n.target.join("::"));
        edges
            .entry(n.from[..common].to_vec())
            .or_default()
            .entry((n.from[common].clone(), to[common].clone()))
            .or_insert(why);
    }
    edges
}

/// Every cycle among the children of each parent, one per strongly
/// connected group, as "parent: a -> b (why) -> a (why)".
fn cycles(edges: &Edges) -> Vec<String> {
    let mut out = Vec::new();
    for (parent, es) in edges {
        let mut next: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for (a, b) in es.keys() {
            next.entry(a).or_default().push(b);
        }
        let mut reported: BTreeSet<&str> = BTreeSet::new();
        for &start in next.keys() {
            if reported.contains(start) {
                continue;
            }
            // Shortest way back to `start` (breadth first).
            let mut came: BTreeMap<&str, &str> = BTreeMap::new();
            let mut queue = std::collections::VecDeque::from([start]);
            let mut found = false;
            while let Some(n) = queue.pop_front() {
                for &m in next.get(n).into_iter().flatten() {
                    if m == start {
                        came.insert(start, n);
                        found = true;
                        break;
                    }
                    if !came.contains_key(m) {
                        came.insert(m, n);
                        queue.push_back(m);
                    }
                }
                if found {
                    break;
                }
            }
            if !found {
                continue;
            }
            let mut ring = vec![start];
            let mut n = came[start];
            while n != start {
                ring.push(n);
                n = came[n];
            }
            ring.reverse();
            ring.rotate_right(1);
            let name = if parent.is_empty() {
                "crate".to_owned()
            } else {
                parent.join("::")
            };
            let mut text = format!("{name}: {start}");
            for k in 0..ring.len() {
                let (a, b) = (ring[k], ring[(k + 1) % ring.len()]);
                text.push_str(&format!(" -> {b} ({})", es[&(a.to_owned(), b.to_owned())]));
                reported.insert(a);
            }
            out.push(text);
        }
    }
    out
}

/// The import cycles of the crate whose root is `lib` (paths in the
/// messages relative to `root`).
pub fn import_cycles(lib: &Path, root: &Path) -> Vec<String> {
    cycles(&sibling_edges(lib, root))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::util::workspace_root;

    #[test]
    fn no_two_daemon_modules_import_each_other() {
        let root = workspace_root();
        let found = import_cycles(&root.join("daemon/src/lib.rs"), &root);
        assert!(
            found.is_empty(),
            "import cycles between sibling modules of daemon/src (move what both use down \
             into a module both import):\n{}",
            found.join("\n")
        );
    }

    /// A crate in a temporary directory, from (file, text) pairs.
    fn crate_of(files: &[(&str, &str)]) -> (PathBuf, Vec<String>) {
        let dir = std::env::temp_dir().join(format!(
            "house-rules-imports-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        for (f, text) in files {
            let p = dir.join(f);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, text).unwrap();
        }
        let found = import_cycles(&dir.join("lib.rs"), &dir);
        std::fs::remove_dir_all(&dir).unwrap();
        (dir, found)
    }

    #[test]
    fn siblings_using_each_other_are_a_cycle_named_with_their_lines() {
        let (_, found) = crate_of(&[
            ("lib.rs", "pub mod bpf;\n"),
            ("bpf/mod.rs", "mod load;\nmod pins;\npub struct Handle;\n"),
            ("bpf/load.rs", "use super::{pins::pin_maps, Handle};\n"),
            (
                "bpf/pins.rs",
                "use super::Handle;\nfn f() { super::load::attach(); }\n",
            ),
        ]);
        assert_eq!(
            found,
            ["bpf: load -> pins (bpf/load.rs:1 `bpf::pins::pin_maps`) -> load (bpf/pins.rs:2 `bpf::load::attach`)"],
            "{found:?}"
        );
    }

    #[test]
    fn a_longer_cycle_through_a_reexport_is_found() {
        let (_, found) = crate_of(&[
            ("lib.rs", "mod a;\nmod b;\nmod c;\n"),
            ("a.rs", "use crate::b::X;\n"),
            ("b.rs", "mod inner;\npub use inner::X;\n"),
            ("b/inner.rs", "pub struct X;\n// crate::a is a comment\nconst S: &str = \"crate::a::Y\";\nfn f() { crate::c::g(); }\n"),
            ("c.rs", "mod tests {\n    use crate::a::Z;\n}\n"),
        ]);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(
            found[0].starts_with(
                "crate: a -> b (a.rs:1 `b::X`) -> c (b/inner.rs:4 `c::g`) -> a (c.rs:2 `a::Z`)"
            ),
            "{found:?}"
        );
    }

    #[test]
    fn children_using_their_parent_and_one_way_siblings_are_fine() {
        let (_, found) = crate_of(&[
            (
                "lib.rs",
                "pub mod x;\n#[path = \"x_tests.rs\"]\nmod x_tests;\n",
            ),
            (
                "x/mod.rs",
                "mod a;\nmod b;\npub use a::A;\nuse b::B;\npub struct P;\n",
            ),
            (
                "x/a.rs",
                "use super::{b::B, P};\nuse crate::x::P as Q;\npub struct A;\n",
            ),
            ("x/b.rs", "use super::super::x::P;\npub struct B;\n"),
            ("x_tests.rs", "use crate::x::A;\n"),
        ]);
        assert!(found.is_empty(), "{found:?}");
    }
}
