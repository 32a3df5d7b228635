//! Fake procfs trees in a TempDir, in the spirit of below's procfs tests.

use std::fs;
use std::path::Path;

use tempfile::TempDir;

/// The ten /proc/stat cpu columns, user..guest_nice.
pub type Cols = [u64; 10];

pub struct FakeProc {
    pub dir: TempDir,
}

pub fn stat_text(total: Cols, cpus: &[(u32, Cols)]) -> String {
    let cols = |c: &Cols| c.iter().map(u64::to_string).collect::<Vec<_>>().join(" ");
    let mut s = format!("cpu  {}\n", cols(&total));
    for (id, c) in cpus {
        s += &format!("cpu{id} {}\n", cols(c));
    }
    s += "intr 100 1 2\nctxt 5000\nbtime 1700000000\nprocesses 900\nprocs_running 2\nprocs_blocked 0\nsoftirq 1 2\n";
    s
}

pub struct Task<'a> {
    pub pid: i32,
    pub comm: &'a str,
    pub minflt: u64,
    pub majflt: u64,
    pub utime: u64,
    pub stime: u64,
    pub starttime: u64,
}

pub fn pid_stat_line(t: &Task<'_>) -> String {
    format!(
        "{} ({}) S 1 {} {} 0 -1 4194560 {} 0 {} 0 {} {} 0 0 20 0 1 0 {} 10000 500 \
         18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0\n",
        t.pid, t.comm, t.pid, t.pid, t.minflt, t.majflt, t.utime, t.stime, t.starttime
    )
}

impl FakeProc {
    pub fn new() -> Self {
        let f = FakeProc {
            dir: tempfile::tempdir().unwrap(),
        };
        f.write("loadavg", "1.50 0.75 0.25 3/120 4321\n");
        f.write(
            "pressure/cpu",
            "some avg10=1.00 avg60=0.50 avg300=0.10 total=1000\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n",
        );
        f.write(
            "pressure/memory",
            "some avg10=0.00 avg60=0.00 avg300=0.00 total=10\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=5\n",
        );
        f.write(
            "pressure/io",
            "some avg10=0.00 avg60=0.00 avg300=0.00 total=20\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=7\n",
        );
        f
    }

    pub fn root(&self) -> &Path {
        self.dir.path()
    }

    pub fn write(&self, rel: &str, text: &str) {
        let p = self.dir.path().join(rel);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(p, text).unwrap();
    }

    pub fn remove(&self, rel: &str) {
        let p = self.dir.path().join(rel);
        if p.is_dir() {
            fs::remove_dir_all(p).unwrap();
        } else {
            fs::remove_file(p).unwrap();
        }
    }

    pub fn set_stat(&self, total: Cols, cpus: &[(u32, Cols)]) {
        self.write("stat", &stat_text(total, cpus));
    }

    /// Writes /proc/<pid>/{stat,status,cmdline} and the main thread's
    /// task/<pid>/stat.
    pub fn set_process(&self, t: &Task<'_>) {
        let line = pid_stat_line(t);
        self.write(&format!("{}/stat", t.pid), &line);
        self.write(&format!("{}/task/{}/stat", t.pid, t.pid), &line);
        self.write(
            &format!("{}/status", t.pid),
            "Name:\tx\nUid:\t1000\t1000\t1000\t1000\nVmRSS:\t 2048 kB\nRssAnon:\t 1024 kB\nRssFile:\t 1024 kB\nRssShmem:\t 0 kB\nVmSwap:\t 0 kB\n",
        );
        self.write(
            &format!("{}/cmdline", t.pid),
            &format!("/usr/bin/{}\0--flag\0", t.comm),
        );
    }

    pub fn set_thread(&self, pid: i32, t: &Task<'_>) {
        self.write(&format!("{pid}/task/{}/stat", t.pid), &pid_stat_line(t));
    }
}
