//! trace_processor_shell, the importer and SQL engine the Perfetto UI runs:
//! where the tests find it and how they query a trace with it.
//!
//! The protobuf schema alone proves that a trace parses; trace_processor
//! shows what a user sees. Its `-q FILE` mode loads the trace, runs every
//! statement of FILE and prints each result set as CSV, separated by blank
//! lines. That CSV does not escape quotes inside strings and prints doubles
//! with six decimals, so the rows are not read from it: each query is asked
//! twice, once for its column names (`LIMIT 0`, a header only) and once as
//! one JSON array built by SQLite's own `json_object`, which escapes strings
//! and keeps integers and doubles exact.

use std::{
    io::Write,
    path::{Path, PathBuf},
    process::Command,
    sync::OnceLock,
};

use serde_json::{Map, Value};

use crate::workspace_root;

/// One result row: column name -> value (JSON null for SQL NULL).
pub type Row = Map<String, Value>;

/// A trace_processor_shell binary, run directly or through
/// tests/python/trace_processor_shell.py (see [`TraceProcessor::through_python`]).
#[derive(Debug, Clone)]
pub struct TraceProcessor {
    /// The shell, or the script that runs it.
    pub bin: PathBuf,
    through_python: bool,
}

const ENV: &str = "TRACE_PROCESSOR_SHELL";

/// The column every JSON statement returns, so its result set is told
/// apart from anything else the shell prints.
const JSON_COLUMN: &str = "vitals_rows_json";

/// The shell these tests use, found once per test binary.
///
/// In order: the `TRACE_PROCESSOR_SHELL` environment variable (which must
/// then name an executable: a wrong value is an error, not a reason to look
/// further); `../shared/tools/trace_processor_shell` next to the repository
/// (for a git worktree, next to its main checkout too); the `perfetto`
/// Python package's own pinned download (tests/python/trace_processor_path.py,
/// needs the network once). None of them: the calling test fails, naming
/// all three. It never skips.
pub fn trace_processor() -> TraceProcessor {
    static FOUND: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    match FOUND.get_or_init(find) {
        Ok(bin) => TraceProcessor {
            bin: bin.clone(),
            through_python: false,
        },
        Err(e) => panic!("{e}"),
    }
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// `<root>/../shared/tools/trace_processor_shell` for each of
/// [`checkout_roots`].
fn shared_candidates() -> Vec<PathBuf> {
    checkout_roots()
        .into_iter()
        .map(|r| r.join("../shared/tools/trace_processor_shell"))
        .collect()
}

/// The repository root and, when the root is a linked git worktree (`.git`
/// is a file naming the main repository's `.git/worktrees/<name>`), the
/// main checkout's root: where `../shared` may sit beside.
pub fn checkout_roots() -> Vec<PathBuf> {
    let root = workspace_root();
    let mut roots = vec![root.clone()];
    if let Ok(git) = std::fs::read_to_string(root.join(".git")) {
        if let Some(gitdir) = git.trim().strip_prefix("gitdir:") {
            let gitdir = root.join(gitdir.trim());
            // <main>/.git/worktrees/<name>/commondir holds "../.." (relative
            // to that directory), i.e. <main>/.git.
            if let Ok(common) = std::fs::read_to_string(gitdir.join("commondir")) {
                let common = gitdir.join(common.trim());
                if let Some(main) = common
                    .canonicalize()
                    .ok()
                    .and_then(|c| c.parent().map(Path::to_owned))
                {
                    roots.push(main);
                }
            }
        }
    }
    roots
}

fn find() -> Result<PathBuf, String> {
    let python = std::env::var_os("VITALS_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join(".venv/bin/python"));
    locate(
        std::env::var_os(ENV).map(PathBuf::from),
        &shared_candidates(),
        &python,
        &workspace_root().join("tests/python/trace_processor_path.py"),
    )
}

/// [`find`]'s search, with its inputs passed in: the `$TRACE_PROCESSOR_SHELL`
/// value, the ../shared/tools candidates, the venv's Python and the script
/// that asks the perfetto package.
fn locate(
    env: Option<PathBuf>,
    shared: &[PathBuf],
    python: &Path,
    script: &Path,
) -> Result<PathBuf, String> {
    if let Some(p) = env {
        return if is_executable(&p) {
            Ok(p)
        } else {
            Err(format!(
                "{ENV}={} is not an executable file; unset it to look in ../shared/tools and the perfetto package",
                p.display()
            ))
        };
    }
    if let Some(p) = shared.iter().find(|p| is_executable(p)) {
        return Ok(p.clone());
    }
    let why_not_python = if !python.exists() {
        format!(
            "{} missing (`cargo xtask setup` creates the venv with the perfetto package)",
            python.display()
        )
    } else {
        match Command::new(python).arg(script).output() {
            Ok(out) if out.status.success() => {
                let p = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
                if is_executable(&p) {
                    return Ok(p);
                }
                format!(
                    "the perfetto package returned {}, not an executable",
                    p.display()
                )
            }
            Ok(out) => format!(
                "the perfetto package could not provide it: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ),
            Err(e) => format!("running {}: {e}", python.display()),
        }
    };
    let shared: Vec<String> = shared.iter().map(|p| p.display().to_string()).collect();
    Err(format!(
        "no trace_processor_shell: (1) ${ENV} is not set; (2) not at {}; (3) {why_not_python}. \
         Set {ENV}, put Perfetto's trace_processor_shell in ../shared/tools, or run on a machine \
         with network access so the perfetto package can download its pinned build",
        shared.join(" nor ")
    ))
}

/// One query's text without a trailing `;`, so it can be wrapped.
fn bare(sql: &str) -> &str {
    sql.trim().trim_end_matches(';').trim_end()
}

/// The result sets of a `-q` run: blocks of lines separated by one blank line.
fn result_sets(stdout: &str) -> Vec<Vec<&str>> {
    let mut sets = vec![Vec::new()];
    for line in stdout.lines() {
        if line.is_empty() {
            if !sets.last().unwrap().is_empty() {
                sets.push(Vec::new());
            }
        } else {
            sets.last_mut().unwrap().push(line);
        }
    }
    sets.retain(|s| !s.is_empty());
    sets
}

/// SQL string literal.
fn literal(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

/// SQL quoted identifier.
fn ident(s: &str) -> String {
    format!("\"{}\"", s.replace('"', "\"\""))
}

impl TraceProcessor {
    /// The shell run by tests/python/trace_processor_shell.py under
    /// [`crate::python`], which finds it as [`trace_processor`] does. Where
    /// VITALS_PYTHON is the decoder relay (a guest of the kernel matrix has
    /// neither the shell nor Python) the script runs on the host, on the
    /// trace the relay sends over; `run`'s last argument must be the trace.
    pub fn through_python() -> Self {
        Self {
            bin: workspace_root().join("tests/python/trace_processor_shell.py"),
            through_python: true,
        }
    }

    fn command(&self) -> Command {
        if self.through_python {
            let mut c = Command::new(crate::python());
            c.arg(&self.bin);
            c
        } else {
            Command::new(&self.bin)
        }
    }

    /// `trace_processor_shell --version`, first line.
    pub fn version(&self) -> String {
        let out = self
            .command()
            .arg("--version")
            .output()
            .unwrap_or_else(|e| panic!("running {}: {e}", self.bin.display()));
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .next()
            .unwrap_or("")
            .to_owned()
    }

    /// Runs the shell with `args` (e.g. `--summary`), returning stdout;
    /// fails the test on a non-zero exit.
    pub fn run(&self, args: &[&str]) -> String {
        let out = self
            .command()
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("running {}: {e}", self.bin.display()));
        assert!(
            out.status.success(),
            "{} {args:?} failed ({}): {}",
            self.bin.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `-q FILE TRACE` with `statements` in FILE; stdout.
    fn run_statements(&self, trace: &Path, statements: &[String]) -> String {
        let trace = trace.to_str().unwrap();
        if self.through_python {
            // The script writes them to its -q file where it runs (the host,
            // for a guest).
            let sql: String = statements.iter().map(|s| format!("{s};\n")).collect();
            return self.run(&["--statements", &sql, trace]);
        }
        let mut f = tempfile::NamedTempFile::new().unwrap();
        for s in statements {
            writeln!(f, "{s};").unwrap();
        }
        f.flush().unwrap();
        let path = f.path().to_str().unwrap().to_owned();
        self.run(&["-q", &path, trace])
    }

    /// The rows of one query.
    pub fn query(&self, trace: &Path, sql: &str) -> Vec<Row> {
        self.query_many(trace, &[sql]).pop().unwrap()
    }

    /// The rows of each query, loading the trace twice in all.
    pub fn query_many(&self, trace: &Path, sqls: &[&str]) -> Vec<Vec<Row>> {
        // Pass 1: column names, from an empty result's header line. They
        // are our own SQL's names, so the unescaped CSV is safe here.
        let headers: Vec<String> = sqls
            .iter()
            .map(|q| format!("SELECT * FROM ({}) LIMIT 0", bare(q)))
            .collect();
        let out = self.run_statements(trace, &headers);
        let sets = result_sets(&out);
        assert_eq!(
            sets.len(),
            sqls.len(),
            "expected one header per query from {}, got:\n{out}",
            self.bin.display()
        );
        let columns: Vec<Vec<String>> = sets
            .iter()
            .zip(sqls)
            .map(|(set, q)| {
                assert_eq!(set.len(), 1, "header of {q}: {set:?}");
                let line = set[0];
                let inner = line
                    .strip_prefix('"')
                    .and_then(|l| l.strip_suffix('"'))
                    .unwrap_or_else(|| panic!("header of {q} not quoted: {line}"));
                let cols: Vec<String> = inner.split("\",\"").map(str::to_owned).collect();
                let mut seen = std::collections::HashSet::new();
                for c in &cols {
                    assert!(seen.insert(c), "column {c:?} twice in {q}: name them apart");
                }
                cols
            })
            .collect();

        // Pass 2: each query as a single JSON array of objects.
        let json: Vec<String> = sqls
            .iter()
            .zip(&columns)
            .map(|(q, cols)| {
                let pairs: Vec<String> = cols
                    .iter()
                    .map(|c| format!("{}, {}", literal(c), ident(c)))
                    .collect();
                format!(
                    "SELECT json_group_array(json_object({})) AS {JSON_COLUMN} FROM ({})",
                    pairs.join(", "),
                    bare(q)
                )
            })
            .collect();
        let out = self.run_statements(trace, &json);
        let sets = result_sets(&out);
        assert_eq!(
            sets.len(),
            sqls.len(),
            "expected one result per query, got:\n{out}"
        );
        sets.iter()
            .zip(sqls)
            .map(|(set, q)| {
                assert_eq!(set.len(), 2, "result of {q}: {set:?}");
                assert_eq!(set[0], format!("\"{JSON_COLUMN}\""), "{q}");
                // The CSV printer wraps the value in quotes without escaping
                // it; the JSON inside has no raw newline (JSON escapes them).
                let v = set[1]
                    .strip_prefix('"')
                    .and_then(|l| l.strip_suffix('"'))
                    .unwrap_or_else(|| panic!("result of {q} not quoted: {}", set[1]));
                let rows: Vec<Value> = serde_json::from_str(v)
                    .unwrap_or_else(|e| panic!("result of {q} is not JSON ({e}): {v}"));
                rows.into_iter()
                    .map(|r| match r {
                        Value::Object(m) => m,
                        other => panic!("row of {q} is not an object: {other}"),
                    })
                    .collect()
            })
            .collect()
    }
}

/// The ```sql block after `<!-- offcpu-query: {name} -->` in README.md,
/// built into the test binary (a guest of the kernel matrix has no
/// checkout): the documented query is the one the tests run.
pub fn readme_offcpu_query(name: &str) -> String {
    const README: &str = include_str!("../../README.md");
    let marker = format!("<!-- offcpu-query: {name} -->");
    let after = &README[README
        .find(&marker)
        .unwrap_or_else(|| panic!("README.md has no {marker}"))..];
    let start = after.find("```sql").expect("a sql block after the marker") + 6;
    let end = start + after[start..].find("```").expect("the sql block's end");
    after[start..end].trim().to_owned()
}

/// The import-error query of issue #13: every stat trace_processor counts
/// as an error or as data loss.
pub const IMPORT_ERRORS_SQL: &str = "select name, idx, severity, source, value from stats \
     where value > 0 and severity in ('error', 'data_loss') order by name, idx";

/// Whether an off-CPU or waker stack (the README's "blocks" query) has
/// `function` in its user part, or says the kernel gave no user stack
/// (`[user stack not taken: File exists (os error 17)]`: the stack map
/// bucket held another stack). That frame only comes from the kernel's
/// error, so a stack with neither is a fault of ours. A collision lasts
/// the capture (every block with that stack hashes to the same bucket), so
/// a test cannot ask for one complete block instead.
pub fn stack_holds(stack: &str, function: &str) -> bool {
    stack_part_holds(
        stack,
        function,
        vitalsd::perfetto::fault_samples::USER_STACK_NOT_TAKEN,
    )
}

/// [`stack_holds`] for the kernel part (`[kernel stack not taken]`).
pub fn kernel_stack_holds(stack: &str, function: &str) -> bool {
    stack_part_holds(
        stack,
        function,
        vitalsd::perfetto::fault_samples::KERNEL_STACK_NOT_TAKEN,
    )
}

fn stack_part_holds(stack: &str, function: &str, not_taken: &str) -> bool {
    // Only a bucket collision (-EEXIST) is the documented, benign refusal:
    // any other error (-EFAULT with no user regs, -ENOMEM from a full map
    // a test's few stacks cannot fill, -EINVAL from bad flags) is a fault
    // of ours and fails the check, as a missing function does.
    let collision = format!("{not_taken}: {}]", std::io::Error::from_raw_os_error(17));
    if stack.contains(&collision) {
        eprintln!("{collision} (another stack holds the bucket): {stack}");
        return true;
    }
    stack.contains(function)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A collision excuses a missing function; no other refusal does.
    #[test]
    fn only_a_bucket_collision_excuses_a_missing_function() {
        let f = "vitals_wait_for_release";
        assert!(stack_holds(&format!("[off-cpu] > {f} > pipe_read"), f));
        assert!(stack_holds(
            "[off-cpu] > [user stack not taken: File exists (os error 17)] > pipe_read",
            f
        ));
        assert!(!stack_holds(
            "[off-cpu] > [user stack not taken: Bad address (os error 14)] > pipe_read",
            f
        ));
        assert!(!stack_holds("[off-cpu] > pipe_read", f));
        assert!(kernel_stack_holds(
            "[off-cpu] > f > [kernel stack not taken: File exists (os error 17)]",
            "pipe_read"
        ));
    }

    #[test]
    fn result_sets_split_on_blank_lines() {
        let out = "\"a\"\n1\n\n\"b\",\"c\"\n\n\"d\"\n\"x\"\n";
        assert_eq!(
            result_sets(out),
            vec![
                vec!["\"a\"", "1"],
                vec!["\"b\",\"c\""],
                vec!["\"d\"", "\"x\""]
            ]
        );
    }

    /// An executable shell script in `dir`.
    fn script(dir: &Path, name: &str, body: &str) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let p = dir.join(name);
        std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        p
    }

    #[test]
    fn locate_tries_the_variable_then_shared_then_the_package_and_names_all_three() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let shell = script(d, "tp", "exit 0");
        let missing = d.join("missing");
        let unused = d.join("unused.py");
        let no_shared = [missing.clone()];
        // The variable wins, and a wrong one is an error of its own.
        assert_eq!(
            locate(Some(shell.clone()), &no_shared, &missing, &unused),
            Ok(shell.clone())
        );
        let shared = [shell.clone()];
        let e = locate(Some(missing.clone()), &shared, &missing, &unused).unwrap_err();
        assert!(e.contains(ENV) && e.contains("not an executable"), "{e}");
        // Then ../shared/tools.
        assert_eq!(
            locate(None, &[missing.clone(), shell.clone()], &missing, &unused),
            Ok(shell.clone())
        );
        // Then what the package says (here a stand-in for python + script).
        let python = script(d, "python", &format!("echo {}", shell.display()));
        assert_eq!(
            locate(None, &no_shared, &python, &unused),
            Ok(shell.clone())
        );
        // None: the error names the three places.
        let offline = script(d, "offline", "echo 'could not resolve host' >&2; exit 1");
        let e = locate(None, &no_shared, &offline, &unused).unwrap_err();
        assert!(
            e.contains(ENV)
                && e.contains(missing.to_str().unwrap())
                && e.contains("could not resolve host"),
            "{e}"
        );
        let e = locate(None, &no_shared, &missing, &unused).unwrap_err();
        assert!(e.contains("cargo xtask setup"), "{e}");
    }

    #[test]
    fn quoting() {
        assert_eq!(literal("it's"), "'it''s'");
        assert_eq!(ident("a\"b"), "\"a\"\"b\"");
        assert_eq!(bare(" select 1 ;\n"), "select 1");
    }
}
