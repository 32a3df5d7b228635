//! /proc/<pid>/cmdline: NUL-separated argv, empty for kernel threads and
//! zombies. Read once per process instance (it rarely changes and costs a
//! page walk of the target's memory), not every window.

/// The cmdline as the kernel holds it, argv NUL-separated, kept that way
/// so arguments with spaces stay whole. A process may rewrite its argv area
/// (setproctitle), so the bytes are not guaranteed UTF-8 or NUL-terminated:
/// trailing NULs are dropped and invalid UTF-8 replaced.
pub fn parse_cmdline(bytes: &[u8]) -> String {
    match bytes.iter().rposition(|&b| b != 0) {
        Some(end) => String::from_utf8_lossy(&bytes[..=end]).into_owned(),
        None => String::new(),
    }
}

/// The arguments of a parsed cmdline; ProcessTree.Process.cmdline wants
/// one string per argument.
pub fn argv(cmdline: &str) -> impl Iterator<Item = &str> {
    cmdline.split('\0').filter(move |_| !cmdline.is_empty())
}

/// Android-style process name: argv[0]'s basename, as ProcessCpuTracker
/// shows it (app processes set argv[0] to the package name).
pub fn name_from_cmdline(cmdline: &str) -> &str {
    let argv0 = cmdline.split('\0').next().unwrap_or("");
    argv0.rsplit('/').next().unwrap_or(argv0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv_of(bytes: &[u8]) -> Vec<String> {
        argv(&parse_cmdline(bytes)).map(str::to_owned).collect()
    }

    #[test]
    fn argv_keeps_arguments_with_spaces_whole() {
        assert_eq!(
            argv_of(b"/bin/sh\0-c\0echo a b\0"),
            vec!["/bin/sh", "-c", "echo a b"]
        );
        assert_eq!(argv_of(b"\0\0"), Vec::<String>::new());
        assert_eq!(argv_of(b""), Vec::<String>::new());
        assert_eq!(argv_of(b"no-nul"), vec!["no-nul"]);
    }

    #[test]
    fn names() {
        let c = parse_cmdline(b"/system/bin/app_process\0-Xzygote\0\0");
        assert_eq!(name_from_cmdline(&c), "app_process");
        // A space inside argv[0] is part of the name, not a separator.
        let c = parse_cmdline(b"/opt/my app/bin/my tool\0--x");
        assert_eq!(name_from_cmdline(&c), "my tool");
        assert_eq!(name_from_cmdline("com.android.phone"), "com.android.phone");
        assert_eq!(parse_cmdline(b"\0\0"), "");
    }
}
