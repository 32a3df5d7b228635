//! /proc/<pid>/status: Uid and the memory lines, all in kB.
//!
//! Own parser rather than `procfs::process::Status`: that one builds a
//! HashMap of every line (~55 allocations per process per scan) and we need
//! six keys. Kernel threads have no Vm*/Rss* lines, so those are optional.

use super::{fields, parse_u64, ParseError};

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PidStatus {
    /// Real uid (first of the four Uid values).
    pub uid: u32,
    pub vm_rss_kb: Option<u64>,
    pub rss_anon_kb: Option<u64>,
    pub rss_file_kb: Option<u64>,
    pub rss_shmem_kb: Option<u64>,
    pub vm_swap_kb: Option<u64>,
}

/// Parses the text of /proc/<pid>/status. Uid is required (every task has
/// one); memory lines are optional.
pub fn parse_pid_status(text: &[u8]) -> Result<PidStatus, ParseError> {
    let mut out = PidStatus::default();
    let mut uid = None;
    for line in text.split(|&b| b == b'\n') {
        let Some(colon) = line.iter().position(|&b| b == b':') else {
            continue;
        };
        let (key, rest) = (&line[..colon], &line[colon + 1..]);
        let slot = match key {
            b"Uid" => {
                let v = parse_u64("Uid", fields(rest).next().unwrap_or(b""))?;
                uid = Some(u32::try_from(v).map_err(|_| ParseError::Malformed("Uid"))?);
                continue;
            }
            b"VmRSS" => &mut out.vm_rss_kb,
            b"RssAnon" => &mut out.rss_anon_kb,
            b"RssFile" => &mut out.rss_file_kb,
            b"RssShmem" => &mut out.rss_shmem_kb,
            b"VmSwap" => &mut out.vm_swap_kb,
            _ => continue,
        };
        // "VmRSS:\t    1616 kB": value then unit; the unit is always kB.
        let mut f = fields(rest);
        let v = parse_u64("memory value", f.next().unwrap_or(b""))?;
        if f.next() != Some(b"kB") {
            return Err(ParseError::Malformed("memory unit is not kB"));
        }
        *slot = Some(v);
    }
    out.uid = uid.ok_or(ParseError::MissingField("Uid"))?;
    Ok(out)
}

/// A thread's switch-out counts from its status file
/// (`task_context_switch_counts`: the task's own `nvcsw`/`nivcsw`, not its
/// thread group's).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CtxtSwitches {
    /// Switched out while blocked (a voluntary sleep).
    pub voluntary: u64,
    /// Switched out while still runnable (preempted).
    pub involuntary: u64,
}

/// Parses `voluntary_ctxt_switches` and `nonvoluntary_ctxt_switches`, the
/// last two lines of a status file: searched from the end, so the ~50
/// lines before them are not split.
pub fn parse_ctxt_switches(text: &[u8]) -> Result<CtxtSwitches, ParseError> {
    let (mut voluntary, mut involuntary) = (None, None);
    for line in text.rsplit(|&b| b == b'\n') {
        let Some(colon) = line.iter().position(|&b| b == b':') else {
            continue;
        };
        let (key, rest) = (&line[..colon], &line[colon + 1..]);
        match key {
            b"voluntary_ctxt_switches" => {
                voluntary = Some(parse_u64(
                    "voluntary_ctxt_switches",
                    fields(rest).next().unwrap_or(b""),
                )?)
            }
            b"nonvoluntary_ctxt_switches" => {
                involuntary = Some(parse_u64(
                    "nonvoluntary_ctxt_switches",
                    fields(rest).next().unwrap_or(b""),
                )?)
            }
            _ => {}
        }
        if voluntary.is_some() && involuntary.is_some() {
            break;
        }
    }
    Ok(CtxtSwitches {
        voluntary: voluntary.ok_or(ParseError::MissingField("voluntary_ctxt_switches"))?,
        involuntary: involuntary.ok_or(ParseError::MissingField("nonvoluntary_ctxt_switches"))?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "Name:\tcat\nUmask:\t0022\nState:\tR (running)\nTgid:\t9720\n\
Uid:\t1000\t1000\t1000\t1000\nGid:\t0\t0\t0\t0\nVmPeak:\t    3060 kB\nVmRSS:\t    1616 kB\n\
RssAnon:\t     116 kB\nRssFile:\t    1500 kB\nRssShmem:\t       0 kB\nVmSwap:\t      12 kB\n\
Threads:\t1\n";

    #[test]
    fn parses_uid_and_memory() {
        let s = parse_pid_status(SAMPLE.as_bytes()).unwrap();
        assert_eq!(s.uid, 1000);
        assert_eq!(s.vm_rss_kb, Some(1616));
        assert_eq!(s.rss_anon_kb, Some(116));
        assert_eq!(s.rss_file_kb, Some(1500));
        assert_eq!(s.rss_shmem_kb, Some(0));
        assert_eq!(s.vm_swap_kb, Some(12));
    }

    #[test]
    fn kernel_thread_has_no_memory_lines() {
        let s = parse_pid_status(b"Name:\tkthreadd\nUid:\t0\t0\t0\t0\nThreads:\t1\n").unwrap();
        assert_eq!(s.uid, 0);
        assert_eq!(s.vm_rss_kb, None);
    }

    #[test]
    fn truncated_is_an_error() {
        assert_eq!(
            parse_pid_status(b"Name:\tcat\n"),
            Err(ParseError::MissingField("Uid"))
        );
        assert!(parse_pid_status(b"Uid:\t0\nVmRSS:\t  12").is_err());
    }

    #[test]
    fn ctxt_switches_from_the_end() {
        let text =
            format!("{SAMPLE}voluntary_ctxt_switches:\t150\nnonvoluntary_ctxt_switches:\t4\n");
        assert_eq!(
            parse_ctxt_switches(text.as_bytes()),
            Ok(CtxtSwitches {
                voluntary: 150,
                involuntary: 4
            })
        );
        assert_eq!(
            parse_ctxt_switches(b"Name:\tx\nvoluntary_ctxt_switches:\t1\n"),
            Err(ParseError::MissingField("nonvoluntary_ctxt_switches"))
        );
        assert!(parse_ctxt_switches(
            b"voluntary_ctxt_switches:\tx\nnonvoluntary_ctxt_switches:\t1\n"
        )
        .is_err());
    }
}
