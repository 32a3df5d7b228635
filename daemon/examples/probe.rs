fn main() {
    let mut acc = vitalsd::bpf::Accounting::load(&Default::default()).unwrap();
    println!("fault source {:?}", acc.fault_source());
    let mut t = vitalsd::bpf::totals::Totals::new();
    for _ in 0..2 {
        std::thread::sleep(std::time::Duration::from_secs(1));
        let s = acc.read().unwrap();
        let rows = t.update(&s);
        let total: u64 = rows.iter().map(|r| r.oncpu_ns).sum();
        println!("tasks {} exited {} rows {} total_oncpu {:.3}s idle {:.3}s drops {:?}", s.tasks.len(), s.exited.len(), rows.len(), total as f64/1e9, t.idle_ns as f64/1e9, s.drops);
    }
}
