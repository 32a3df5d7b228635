//! Windows built from fake procfs trees, for the tests of what reads
//! windows (top, the history).

use super::{Window, Windows};

/// A window for tests of what reads windows (top, history): from a fake
/// procfs tree holding `pid`, a process charged no clock tick between the
/// two scans (ProcessCpuTracker's working set leaves it out).
pub(crate) fn quiet_process_window(pid: i32) -> Window {
    use crate::procfs::{
        testutil::{FakeProc, Task},
        SampleOptions, Sampler,
    };
    let fake = FakeProc::new();
    let cols = [100, 0, 50, 1000, 10, 0, 5, 0, 0, 0];
    fake.set_stat(cols, &[(0, cols)]);
    fake.set_process(&Task {
        pid,
        comm: "quiet",
        minflt: 1,
        majflt: 0,
        utime: 5,
        stime: 5,
        starttime: 9,
    });
    let mut sampler = Sampler::new(fake.root(), SampleOptions::default());
    let mut tracker = Windows::new(100);
    tracker.update(&sampler.sample().unwrap());
    std::thread::sleep(std::time::Duration::from_millis(2));
    let w = tracker
        .update(&sampler.sample().unwrap())
        .expect("a second scan gives a window");
    assert!(
        w.processes.iter().all(|p| !p.working),
        "no tick was charged"
    );
    w
}
