use std::{sync::Arc, time::Duration};

use super::*;
use crate::{
    config::{Dur, Metric},
    history::ProcessVitals,
    sources::{system::figures as system, tasks::figures as tasks},
};

const S: u64 = 1_000_000_000;

struct Device {
    temp: Option<i64>,
    charging: bool,
}
impl DeviceProbe for Device {
    fn max_thermal_millicelsius(&self) -> Option<i64> {
        self.temp
    }
    fn is_charging(&self) -> bool {
        self.charging
    }
}
const COOL: Device = Device {
    temp: Some(30_000),
    charging: true,
};

fn sample(t_s: u64, busy: f64, procs: Vec<ProcessVitals>) -> VitalsSample {
    // What the system room offers for busy %, loadavg 3.0 over 2 online
    // CPUs and cpu PSI avg10 12 (some) / 1 (full).
    let mut figures = crate::figures::SampleFigures::default();
    figures.set(&system::LOCAL_BUSY_PCT, busy);
    figures.set(&system::LOADAVG_1M, 3.0);
    figures.set(&system::LOADAVG_1M_PER_CPU, 3.0 / 2.0);
    figures.set(&system::PSI_AVG10[0][0], 12.0);
    figures.set(&system::PSI_AVG10[0][1], 1.0);
    VitalsSample {
        boottime_ns: t_s * S,
        monotonic_ns: t_s * S,
        figures,
        processes: procs,
    }
}

fn proc(pid: i32, cpu: f64, rss: u64) -> ProcessVitals {
    // What the tasks room offers for one process.
    let mut figures = crate::figures::ProcessFigures::default();
    figures.set(&tasks::CORE_EQUIVALENT_PCT, cpu);
    figures.set(&tasks::MAJFLT_PER_S, 0.0);
    figures.set(&tasks::RSS_KB, rss as f64);
    ProcessVitals {
        pid,
        starttime_ticks: 100,
        name: Arc::from("app"),
        figures,
    }
}

fn rule(metric: Metric, threshold: f64, window_s: u64, cooldown_s: u64) -> Rule {
    Rule {
        name: "r".into(),
        metric,
        threshold,
        window: Dur(Duration::from_secs(window_s)),
        cooldown: Dur(Duration::from_secs(cooldown_s)),
        capture: RecordingSpec::default(),
    }
}

fn history(busy: &[f64]) -> History {
    let mut h = History::new(100);
    for (i, b) in busy.iter().enumerate() {
        h.push(sample(
            i as u64 + 1,
            *b,
            vec![proc(42, *b, 1000 + 100 * i as u64)],
        ));
    }
    h
}

fn engine(rules: Vec<Rule>) -> Engine {
    Engine::new(rules, Budget::default(), Conditions::default())
}

#[test]
fn sustained_over_the_whole_window_only() {
    let mut e = engine(vec![rule(Metric::SystemCpuBusyPct, 90.0, 3, 60)]);
    // Too little history for a 3 s window.
    assert!(e
        .evaluate(&history(&[95.0, 95.0]), 2 * S, false, &COOL)
        .is_none());
    // A dip inside the window.
    assert!(e
        .evaluate(&history(&[95.0, 80.0, 95.0]), 3 * S, false, &COOL)
        .is_none());
    let f = e
        .evaluate(&history(&[50.0, 95.0, 92.0, 99.0]), 4 * S, false, &COOL)
        .unwrap();
    assert_eq!(f.value, 92.0);
    assert!(f.offender.is_none());
}

#[test]
fn cooldown_then_fires_again() {
    let mut e = engine(vec![rule(Metric::SystemCpuBusyPct, 90.0, 1, 60)]);
    let h = history(&[95.0]);
    assert!(e.evaluate(&h, 10 * S, false, &COOL).is_some());
    assert!(e.evaluate(&h, 11 * S, false, &COOL).is_none());
    assert!(e.evaluate(&h, 69 * S, false, &COOL).is_none());
    assert_eq!(e.skipped[&SkipReason::Cooldown], 2);
    assert!(e.evaluate(&h, 70 * S, false, &COOL).is_some());
}

#[test]
fn one_capture_at_a_time() {
    let mut e = engine(vec![rule(Metric::SystemCpuBusyPct, 90.0, 1, 0)]);
    assert!(e.evaluate(&history(&[95.0]), S, true, &COOL).is_none());
    assert_eq!(e.skipped[&SkipReason::CaptureRunning], 1);
}

#[test]
fn budgets_per_hour_and_per_day() {
    let mut e = Engine::new(
        vec![rule(Metric::SystemCpuBusyPct, 90.0, 1, 1)],
        Budget {
            captures_per_hour: 2,
            captures_per_day: 3,
            ..Budget::default()
        },
        Conditions::default(),
    );
    let h = history(&[95.0]);
    let mut fired = 0;
    for minute in 0..60 {
        fired += e.evaluate(&h, minute * 60 * S, false, &COOL).is_some() as u32;
    }
    assert_eq!(fired, 2, "hourly budget");
    assert!(e.skipped[&SkipReason::BudgetHour] > 0);
    for minute in 60..240 {
        fired += e.evaluate(&h, minute * 60 * S, false, &COOL).is_some() as u32;
    }
    assert_eq!(fired, 3, "daily budget");
    assert!(e.skipped[&SkipReason::BudgetDay] > 0);
    // A day after the first capture, budget frees up again.
    assert!(e.evaluate(&h, 24 * 3600 * S + 1, false, &COOL).is_some());
}

#[test]
fn thermal_and_charging_skip() {
    let mut e = Engine::new(
        vec![rule(Metric::SystemCpuBusyPct, 90.0, 1, 0)],
        Budget::default(),
        Conditions {
            max_thermal_millicelsius: Some(45_000),
            require_charging: true,
            ..Conditions::default()
        },
    );
    let h = history(&[95.0]);
    let hot = Device {
        temp: Some(50_000),
        charging: true,
    };
    assert!(e.evaluate(&h, S, false, &hot).is_none());
    assert_eq!(e.skipped[&SkipReason::Thermal], 1);
    let unplugged = Device {
        temp: Some(30_000),
        charging: false,
    };
    assert!(e.evaluate(&h, 2 * S, false, &unplugged).is_none());
    assert_eq!(e.skipped[&SkipReason::NotCharging], 1);
    assert!(e.evaluate(&h, 3 * S, false, &COOL).is_some());
}

/// Manual captures spend their own budget, never the rules'; they obey
/// the same device conditions; heap requests obey the conditions only.
#[test]
fn manual_requests_have_their_own_budget_and_the_same_conditions() {
    let mut e = Engine::new(
        vec![rule(Metric::SystemCpuBusyPct, 90.0, 1, 0)],
        Budget {
            captures_per_hour: 1,
            captures_per_day: 1,
            manual_captures_per_hour: 2,
            manual_captures_per_day: 3,
        },
        Conditions {
            max_thermal_millicelsius: Some(45_000),
            ..Conditions::default()
        },
    );
    let hot = Device {
        temp: Some(50_000),
        charging: true,
    };
    let refused = e.admit_manual(S, &hot, false).unwrap_err();
    assert_eq!(refused.0, SkipReason::Thermal, "{refused:?}");
    assert_eq!(
        e.admit_manual(S, &hot, true).unwrap_err().0,
        SkipReason::Thermal
    );
    assert!(e.admit_manual(S, &COOL, false).is_ok());
    assert!(e.admit_manual(2 * S, &COOL, false).is_ok());
    let refused = e.admit_manual(3 * S, &COOL, false).unwrap_err();
    assert_eq!(refused.0, SkipReason::BudgetHour);
    assert!(refused.1.contains("manual"), "{refused:?}");
    // Heap requests are not counted against the capture budget.
    assert!(e.admit_manual(4 * S, &COOL, true).is_ok());
    assert_eq!(e.manual_refused[&SkipReason::BudgetHour], 1);
    assert_eq!(e.manual_refused[&SkipReason::Thermal], 2);
    // The rule's budget is untouched by the manual captures...
    let h = history(&[95.0]);
    assert!(e.evaluate(&h, 5 * S, false, &COOL).is_some());
    // ...and spending it leaves the manual one as it was.
    assert!(e.evaluate(&h, 6 * S, false, &COOL).is_none());
    assert!(e.admit_manual(2 * 3600 * S, &COOL, false).is_ok());
    assert_eq!(
        e.admit_manual(2 * 3600 * S + 1, &COOL, false)
            .unwrap_err()
            .0,
        SkipReason::BudgetDay
    );
}

#[test]
fn thermal_and_charging_from_fake_sysfs() {
    let d = tempfile::tempdir().unwrap();
    let t = d.path().join("thermal/thermal_zone0");
    let b = d.path().join("power/battery");
    std::fs::create_dir_all(&t).unwrap();
    std::fs::create_dir_all(&b).unwrap();
    std::fs::write(t.join("temp"), "60000\n").unwrap();
    std::fs::write(b.join("status"), "Discharging\n").unwrap();
    let cond = Conditions {
        max_thermal_millicelsius: Some(45_000),
        require_charging: true,
        thermal_root: d.path().join("thermal"),
        power_supply_root: d.path().join("power"),
    };
    let mut e = Engine::new(
        vec![rule(Metric::SystemCpuBusyPct, 90.0, 1, 0)],
        Budget::default(),
        cond.clone(),
    );
    let h = history(&[95.0]);
    assert!(e.evaluate(&h, S, false, &SysfsProbe(&cond)).is_none());
    assert_eq!(e.skipped[&SkipReason::Thermal], 1);
    std::fs::write(t.join("temp"), "40000\n").unwrap();
    assert!(e.evaluate(&h, 2 * S, false, &SysfsProbe(&cond)).is_none());
    assert_eq!(e.skipped[&SkipReason::NotCharging], 1);
    std::fs::write(b.join("status"), "Charging\n").unwrap();
    assert!(e.evaluate(&h, 3 * S, false, &SysfsProbe(&cond)).is_some());
}

#[test]
fn process_rules_name_the_offender() {
    let mut e = engine(vec![rule(
        Metric::ProcessCpuPct {
            process: Some("app".into()),
        },
        80.0,
        2,
        0,
    )]);
    let f = e
        .evaluate(&history(&[90.0, 95.0, 99.0]), 3 * S, false, &COOL)
        .unwrap();
    assert_eq!(f.offender.unwrap().pid, 42);
    let mut e = engine(vec![rule(
        Metric::ProcessCpuPct {
            process: Some("other".into()),
        },
        80.0,
        2,
        0,
    )]);
    assert!(e
        .evaluate(&history(&[90.0, 95.0, 99.0]), 3 * S, false, &COOL)
        .is_none());
    // RSS grew 100 kB per sample: 200 kB over a 3-sample window.
    let mut e = engine(vec![rule(
        Metric::RssGrowthKb { process: None },
        150.0,
        3,
        0,
    )]);
    let f = e
        .evaluate(&history(&[1.0, 1.0, 1.0]), 3 * S, false, &COOL)
        .unwrap();
    assert_eq!(f.value, 200.0);
    let mut e = engine(vec![rule(Metric::LoadavgPerCpu, 1.0, 1, 0)]);
    assert_eq!(
        e.evaluate(&history(&[1.0]), S, false, &COOL).unwrap().value,
        1.5
    );
    let mut e = engine(vec![rule(
        Metric::PsiAvg10 {
            resource: "cpu".into(),
            full: false,
        },
        10.0,
        1,
        0,
    )]);
    assert_eq!(
        e.evaluate(&history(&[1.0]), S, false, &COOL).unwrap().value,
        12.0
    );
}
