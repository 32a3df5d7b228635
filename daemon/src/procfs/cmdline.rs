//! /proc/<pid>/cmdline: NUL-separated argv, empty for kernel threads and
//! zombies. Read once per process instance (it rarely changes and costs a
//! page walk of the target's memory), not every window.

/// argv as the kernel holds it: NUL-separated. A process may rewrite its
/// argv area (setproctitle), so the bytes are not guaranteed UTF-8 or
/// NUL-terminated; trailing NULs are dropped and invalid UTF-8 replaced.
/// ProcessTree.Process.cmdline wants this form (one string per argument).
pub fn parse_argv(bytes: &[u8]) -> Vec<String> {
    match bytes.iter().rposition(|&b| b != 0) {
        Some(end) => bytes[..=end]
            .split(|&b| b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect(),
        None => Vec::new(),
    }
}

/// argv joined by spaces, for tables.
pub fn parse_cmdline(bytes: &[u8]) -> String {
    parse_argv(bytes).join(" ")
}

/// Android-style process name: argv[0]'s basename, as ProcessCpuTracker
/// shows it (app processes set argv[0] to the package name).
pub fn name_from_cmdline(cmdline: &str) -> &str {
    let argv0 = cmdline.split(' ').next().unwrap_or("");
    argv0.rsplit('/').next().unwrap_or(argv0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_argv() {
        assert_eq!(
            parse_argv(b"/bin/sh\0-c\0echo a b\0"),
            vec!["/bin/sh", "-c", "echo a b"]
        );
        assert_eq!(parse_argv(b"\0\0"), Vec::<String>::new());
        assert_eq!(parse_argv(b"no-nul"), vec!["no-nul"]);
    }

    #[test]
    fn joins_argv() {
        assert_eq!(
            parse_cmdline(b"/system/bin/app_process\0-Xzygote\0\0"),
            "/system/bin/app_process -Xzygote"
        );
        assert_eq!(parse_cmdline(b""), "");
        assert_eq!(parse_cmdline(b"\0\0"), "");
        assert_eq!(
            name_from_cmdline("/system/bin/surfaceflinger --x"),
            "surfaceflinger"
        );
        assert_eq!(name_from_cmdline("com.android.phone"), "com.android.phone");
    }
}
