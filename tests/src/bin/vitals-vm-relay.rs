//! The guest side of `cargo xtask vm-test`'s decoder relay. A QEMU guest of
//! the kernel matrix has no Python, so its init script points VITALS_PYTHON
//! here. Called as the interpreter would be,
//! `vitals-vm-relay <dir>/trace_summary.py [options...] <trace>`, it sends
//! the script's file name, the options and the trace's bytes over the
//! virtio-serial port named `vitals.relay` to the host, where xtask runs
//! that script of the workspace with the official `perfetto` package
//! (xtask/src/vm/relay.rs), and it prints the decoder's stdout and stderr
//! and exits with its status. The test then asserts on the decoded trace
//! just as it does on the host.

use std::{
    fs::OpenOptions,
    io::{BufRead, BufReader, Read, Write},
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

const PORT_NAME: &str = "vitals.relay";

/// /dev/vportNpM of the port named `vitals.relay` (its name is in sysfs;
/// the device appears once virtio_console has probed it).
fn port() -> PathBuf {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(dir) = std::fs::read_dir("/sys/class/virtio-ports") {
            for e in dir.flatten() {
                let name = std::fs::read_to_string(e.path().join("name")).unwrap_or_default();
                let dev = Path::new("/dev").join(e.file_name());
                if name.trim() == PORT_NAME && dev.exists() {
                    return dev;
                }
            }
        }
        assert!(
            Instant::now() < deadline,
            "no virtio port named {PORT_NAME}: not inside a vm-test guest?"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (Some(script), Some(trace)) = (args.first(), args.last()) else {
        eprintln!("usage: vitals-vm-relay <script.py> [options...] <trace>");
        std::process::exit(2);
    };
    if args.len() < 2 {
        eprintln!("usage: vitals-vm-relay <script.py> [options...] <trace>");
        std::process::exit(2);
    }
    let options = &args[1..args.len() - 1];
    let script = Path::new(script)
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("")
        .to_owned();
    let bytes = std::fs::read(trace).unwrap_or_else(|e| panic!("reading {trace}: {e}"));

    let path = port();
    let mut dev = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .unwrap_or_else(|e| panic!("opening {}: {e}", path.display()));
    let header = serde_json::json!({ "script": script, "args": options, "len": bytes.len() });
    dev.write_all(format!("{header}\n").as_bytes()).unwrap();
    dev.write_all(&bytes).unwrap();
    dev.flush().unwrap();

    let mut r = BufReader::new(dev);
    let mut line = String::new();
    r.read_line(&mut line).expect("reading the relay's answer");
    let resp: serde_json::Value = serde_json::from_str(line.trim())
        .unwrap_or_else(|e| panic!("relay answered {line:?}: {e}"));
    let len = |k: &str| {
        resp[k]
            .as_u64()
            .unwrap_or_else(|| panic!("no {k} in {resp}")) as usize
    };
    let mut out = vec![0u8; len("stdout_len")];
    r.read_exact(&mut out)
        .expect("reading the decoder's stdout");
    let mut err = vec![0u8; len("stderr_len")];
    r.read_exact(&mut err)
        .expect("reading the decoder's stderr");
    std::io::stdout().write_all(&out).unwrap();
    std::io::stderr().write_all(&err).unwrap();
    std::process::exit(resp["code"].as_i64().unwrap_or(1) as i32);
}
