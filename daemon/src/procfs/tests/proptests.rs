//! Every parser fed arbitrary bytes: a value or a typed error, never a panic.

use proptest::prelude::*;

use super::*;

proptest! {
    #[test]
    fn stat_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
        let _ = parse_stat(&bytes);
    }

    #[test]
    fn stat_text_like_never_panics(text in "(cpu[0-9]? ?[0-9 ]{0,40}\n|ctxt [0-9]{0,25}\n|btime -?[0-9]*\n|processes \n|procs_(running|blocked) [0-9]*\n){0,12}") {
        let _ = parse_stat(text.as_bytes());
    }

    #[test]
    fn pid_stat_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..1024)) {
        let _ = parse_pid_stat(&bytes);
    }

    #[test]
    fn pid_stat_line_like_never_panics(text in "-?[0-9]{0,12} ?\\(?[ -~]{0,20}\\)? ?[A-Z]? ?(-?[0-9]{0,21} ){0,30}") {
        let _ = parse_pid_stat(text.as_bytes());
    }

    /// Any comm (spaces, parens, newlines, non-UTF-8) survives the last-')'
    /// split and the fields after it are still right.
    #[test]
    fn pid_stat_any_comm(comm in proptest::collection::vec(any::<u8>(), 0..64), utime in any::<u64>()) {
        let mut line = b"77 (".to_vec();
        line.extend_from_slice(&comm);
        line.extend_from_slice(
            format!(") R 1 2 3 4 5 6 7 8 9 10 {utime} 12 13 14 15 16 17 18 19 20 21 22\n").as_bytes(),
        );
        let s = parse_pid_stat(&line).unwrap();
        prop_assert_eq!(s.comm.as_bytes(), &comm[..]);
        prop_assert_eq!(s.utime_ticks, utime);
        prop_assert_eq!(s.starttime_ticks, 19);
    }

    #[test]
    fn pid_status_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..1024)) {
        let _ = parse_pid_status(&bytes);
    }

    #[test]
    fn pid_status_text_like_never_panics(text in "((Uid|VmRSS|RssAnon|VmSwap|Name):\t?[0-9 kB]{0,12}\n){0,8}") {
        let _ = parse_pid_status(text.as_bytes());
    }

    #[test]
    fn pressure_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let _ = parse_pressure(&bytes);
    }

    #[test]
    fn pressure_text_like_never_panics(text in "((some|full)( (avg10|avg60|avg300|total)=?[0-9.]{0,8}){0,5}\n?){0,3}") {
        let _ = parse_pressure(text.as_bytes());
    }

    #[test]
    fn loadavg_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
        let _ = parse_loadavg(&bytes);
    }

    #[test]
    fn loadavg_text_like_never_panics(text in "([0-9.]{0,6} ){0,3}[0-9]{0,11}/?[0-9]{0,11} ?[0-9]{0,11}\n?") {
        let _ = parse_loadavg(text.as_bytes());
    }

    #[test]
    fn cmdline_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let s = parse_cmdline(&bytes);
        prop_assert!(!s.ends_with('\0'));
    }
}
