use super::*;
use crate::procfs::stat::parse_stat;

#[test]
fn delta_refuses_backwards_iowait() {
    let a = parse_stat(b"cpu  24068 3 4277 59835 385 1 65 11 7 2\ncpu0 24068 3 4277 59835 385 1 65 11 7 2\nctxt 1\nbtime 1\nprocesses 1\nprocs_running 1\nprocs_blocked 0\n").unwrap().total;
    let mut b = a;
    b.user_ticks += 10;
    assert_eq!(cpu_delta(&b, &a).unwrap().user_ticks, 10);
    b.iowait_ticks -= 1;
    assert_eq!(cpu_delta(&b, &a), None);
}
