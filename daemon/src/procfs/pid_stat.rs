//! /proc/<pid>/stat and /proc/<pid>/task/<tid>/stat.
//!
//! Own parser rather than `procfs::process::Stat`: that one panics on some
//! malformed input (`buf[..start_paren - 1]` when the line starts with '('),
//! allocates a String per comm and per line, and demands ~44 fields where we
//! need the first 22. Here: split at the LAST ')' (comm is user-controlled
//! and may contain spaces and ')'), then parse the stable prefix up to
//! starttime (field 22) and ignore whatever follows, so new kernels adding
//! fields at the end do not break us.

use std::fmt;

use super::{fields, parse_i64, parse_u64, ParseError};

/// A task's comm, stored inline so a scan allocates nothing per task.
/// TASK_COMM_LEN is 16, but workqueue workers show longer names
/// ("kworker/0:1-events"), so keep up to 64 bytes.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Comm {
    bytes: [u8; 64],
    len: u8,
}

impl Comm {
    pub fn new(src: &[u8]) -> Self {
        let len = src.len().min(64);
        let mut bytes = [0u8; 64];
        bytes[..len].copy_from_slice(&src[..len]);
        Comm {
            bytes,
            len: len as u8,
        }
    }
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }
    pub fn to_string_lossy(&self) -> String {
        String::from_utf8_lossy(self.as_bytes()).into_owned()
    }
}

impl Default for Comm {
    fn default() -> Self {
        Comm::new(b"")
    }
}

impl fmt::Debug for Comm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&String::from_utf8_lossy(self.as_bytes()), f)
    }
}

impl fmt::Display for Comm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&String::from_utf8_lossy(self.as_bytes()))
    }
}

/// The stable prefix of /proc/<pid>/stat. Counters are cumulative since the
/// task started; times in USER_HZ ticks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PidStat {
    /// Field 1.
    pub pid: i32,
    /// Field 2, without the parentheses.
    pub comm: Comm,
    /// Field 3 (R, S, D, Z, T, t, X, I, ...).
    pub state: u8,
    /// Field 4.
    pub ppid: i32,
    /// Field 10.
    pub minflt: u64,
    /// Field 11: reaped children's minflt.
    pub cminflt: u64,
    /// Field 12.
    pub majflt: u64,
    /// Field 13.
    pub cmajflt: u64,
    /// Field 14.
    pub utime_ticks: u64,
    /// Field 15.
    pub stime_ticks: u64,
    /// Field 20.
    pub num_threads: u64,
    /// Field 22: ticks after boot. With pid it identifies a process instance.
    pub starttime_ticks: u64,
    /// Field 24: resident pages (get_mm_rss(), the same count as status's
    /// VmRSS). None when the line stops before it.
    pub rss_pages: Option<u64>,
}

/// Parses the text of a /proc/<pid>/stat file.
pub fn parse_pid_stat(text: &[u8]) -> Result<PidStat, ParseError> {
    let open = text
        .iter()
        .position(|&b| b == b'(')
        .ok_or(ParseError::MissingField("comm"))?;
    let close = text
        .iter()
        .rposition(|&b| b == b')')
        .ok_or(ParseError::MissingField("comm"))?;
    if close < open {
        return Err(ParseError::Malformed("')' before '('"));
    }
    let pid = parse_i64("pid", text[..open].trim_ascii())?;
    let comm = Comm::new(&text[open + 1..close]);

    // Tokens after ')': index k-3 holds 1-based field k.
    let mut t = fields(&text[close + 1..]);
    let mut next = |name: &'static str| t.next().ok_or(ParseError::MissingField(name));
    let state_field = next("state")?;
    if state_field.len() != 1 {
        return Err(ParseError::Malformed("state"));
    }
    let state = state_field[0];
    let ppid = parse_i64("ppid", next("ppid")?)?;
    for name in ["pgrp", "session", "tty_nr", "tpgid", "flags"] {
        next(name)?;
    }
    let minflt = parse_u64("minflt", next("minflt")?)?;
    let cminflt = parse_u64("cminflt", next("cminflt")?)?;
    let majflt = parse_u64("majflt", next("majflt")?)?;
    let cmajflt = parse_u64("cmajflt", next("cmajflt")?)?;
    let utime_ticks = parse_u64("utime", next("utime")?)?;
    let stime_ticks = parse_u64("stime", next("stime")?)?;
    for name in ["cutime", "cstime", "priority", "nice"] {
        next(name)?;
    }
    let num_threads = parse_u64("num_threads", next("num_threads")?)?;
    next("itrealvalue")?;
    let starttime_ticks = parse_u64("starttime", next("starttime")?)?;
    let rss_pages = match (t.next(), t.next()) {
        (Some(_vsize), Some(rss)) => Some(parse_u64("rss", rss)?),
        _ => None,
    };

    let to_i32 = |name, v: i64| i32::try_from(v).map_err(|_| ParseError::Malformed(name));
    Ok(PidStat {
        pid: to_i32("pid", pid)?,
        comm,
        state,
        ppid: to_i32("ppid", ppid)?,
        minflt,
        cminflt,
        majflt,
        cmajflt,
        utime_ticks,
        stime_ticks,
        num_threads,
        starttime_ticks,
        rss_pages,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A real line (kernel 6.x) with comm replaced.
    pub(crate) fn line(comm: &str) -> String {
        format!(
            "4242 ({comm}) S 1 4242 4242 0 -1 4194560 1500 20 7 1 330 120 0 0 20 0 3 0 98765 \
             10000 500 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0 0 0 0 0 0 0 0 0\n"
        )
    }

    #[test]
    fn rss_pages_is_field_24_when_present() {
        assert_eq!(
            parse_pid_stat(line("x").as_bytes()).unwrap().rss_pages,
            Some(500)
        );
        // A line that stops at starttime (field 22) still parses.
        let short = "4242 (x) S 1 4242 4242 0 -1 4194560 1500 20 7 1 330 120 0 0 20 0 3 0 98765\n";
        assert_eq!(parse_pid_stat(short.as_bytes()).unwrap().rss_pages, None);
        let bad =
            "4242 (x) S 1 4242 4242 0 -1 4194560 1500 20 7 1 330 120 0 0 20 0 3 0 98765 1 x\n";
        assert!(parse_pid_stat(bad.as_bytes()).is_err());
    }

    #[test]
    fn parses_stable_prefix() {
        let s = parse_pid_stat(line("cat").as_bytes()).unwrap();
        assert_eq!(s.pid, 4242);
        assert_eq!(s.comm.as_bytes(), b"cat");
        assert_eq!(s.state, b'S');
        assert_eq!(s.ppid, 1);
        assert_eq!((s.minflt, s.cminflt, s.majflt, s.cmajflt), (1500, 20, 7, 1));
        assert_eq!((s.utime_ticks, s.stime_ticks), (330, 120));
        assert_eq!(s.num_threads, 3);
        assert_eq!(s.starttime_ticks, 98765);
    }

    #[test]
    fn comm_with_spaces_and_close_paren_open_paren() {
        let s = parse_pid_stat(line("a) (b c) S 9 9").as_bytes()).unwrap();
        assert_eq!(s.comm.as_bytes(), b"a) (b c) S 9 9");
        assert_eq!(s.ppid, 1);
        assert_eq!(s.utime_ticks, 330);
        assert_eq!(s.starttime_ticks, 98765);
    }

    #[test]
    fn extra_trailing_fields_are_ignored() {
        let text = line("x").trim_end().to_owned() + " 1 2 3 4 5 6 7 8\n";
        assert_eq!(
            parse_pid_stat(text.as_bytes()).unwrap().starttime_ticks,
            98765
        );
        // And an old kernel's shorter line that still has field 22 is fine.
        let full = line("x");
        let short: Vec<&str> = full.split(' ').take(22).collect();
        assert_eq!(
            parse_pid_stat(short.join(" ").as_bytes())
                .unwrap()
                .starttime_ticks,
            98765
        );
    }

    #[test]
    fn truncated_line_is_a_typed_error() {
        let full = line("x");
        let short: Vec<&str> = full.split(' ').take(21).collect();
        assert_eq!(
            parse_pid_stat(short.join(" ").as_bytes()),
            Err(ParseError::MissingField("starttime"))
        );
        assert_eq!(
            parse_pid_stat(b"4242 (cat"),
            Err(ParseError::MissingField("comm"))
        );
        assert_eq!(parse_pid_stat(b""), Err(ParseError::MissingField("comm")));
        assert!(parse_pid_stat(b")(").is_err());
    }
}
