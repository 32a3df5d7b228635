//! The readers' unit tests; `proptests`: every parser fed arbitrary bytes.

mod proptests;

use super::*;

#[test]
fn numbers() {
    assert_eq!(parse_u64("x", b"123"), Ok(123));
    assert!(parse_u64("x", b"").is_err());
    assert!(parse_u64("x", b"12a").is_err());
    assert!(parse_u64("x", b"99999999999999999999999").is_err());
    assert_eq!(parse_i64("x", b"-1"), Ok(-1));
    assert!(parse_i64("x", b"-").is_err());
}

#[test]
fn read_into_grows_past_first_buffer() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("big");
    let data: Vec<u8> = (0..10_000u32).map(|i| b'a' + (i % 26) as u8).collect();
    std::fs::write(&p, &data).unwrap();
    let mut buf = Vec::new();
    read_into(&p, &mut buf).unwrap();
    assert_eq!(buf, data);
    // Reuse: a small file after a big one leaves only the small content.
    std::fs::write(&p, b"abc").unwrap();
    read_into(&p, &mut buf).unwrap();
    assert_eq!(buf, b"abc");
}

#[test]
fn vanished_errors() {
    assert!(is_vanished(&io::Error::from_raw_os_error(libc::ENOENT)));
    assert!(is_vanished(&io::Error::from_raw_os_error(libc::ESRCH)));
    assert!(!is_vanished(&io::Error::from_raw_os_error(libc::EACCES)));
}
