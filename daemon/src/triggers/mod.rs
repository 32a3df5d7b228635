//! Health rules over the history, with per-rule cooldowns, capture budgets
//! and device conditions. At most one trigger fires per evaluation, and none
//! while a capture runs: one capture at a time.

pub mod conditions;

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};

use serde::Serialize;

use crate::{
    config::{Budget, CaptureSpec, Conditions, Metric, Rule},
    history::{History, VitalsSample},
};

const HOUR_NS: u64 = 3600 * 1_000_000_000;
const DAY_NS: u64 = 24 * HOUR_NS;

/// Forgets starts older than a day, then says which budget (if any) a new
/// start would exceed.
fn over_budget(
    started: &mut VecDeque<u64>,
    now_boottime_ns: u64,
    per_hour: u32,
    per_day: u32,
) -> Option<SkipReason> {
    while started
        .front()
        .is_some_and(|&t| now_boottime_ns.saturating_sub(t) >= DAY_NS)
    {
        started.pop_front();
    }
    let last_hour = started
        .iter()
        .filter(|&&t| now_boottime_ns.saturating_sub(t) < HOUR_NS)
        .count() as u32;
    if last_hour >= per_hour {
        Some(SkipReason::BudgetHour)
    } else if started.len() as u32 >= per_day {
        Some(SkipReason::BudgetDay)
    } else {
        None
    }
}

/// The process a rule fired on.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Offender {
    pub pid: i32,
    pub starttime_ticks: u64,
    pub name: String,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Fired {
    pub rule: String,
    /// The metric's value that crossed (the smallest over the window).
    pub value: f64,
    pub threshold: f64,
    pub offender: Option<Offender>,
    #[serde(skip)]
    pub capture: CaptureSpec,
    pub boottime_ns: u64,
}

/// Why a matching rule did not start a capture.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum SkipReason {
    Cooldown,
    CaptureRunning,
    BudgetHour,
    BudgetDay,
    Thermal,
    NotCharging,
}

impl SkipReason {
    pub fn name(self) -> &'static str {
        match self {
            SkipReason::Cooldown => "cooldown",
            SkipReason::CaptureRunning => "capture_running",
            SkipReason::BudgetHour => "budget_per_hour",
            SkipReason::BudgetDay => "budget_per_day",
            SkipReason::Thermal => "thermal",
            SkipReason::NotCharging => "not_charging",
        }
    }
}

/// What the engine reads from the device; faked in tests.
pub trait DeviceProbe {
    fn max_thermal_millicelsius(&self) -> Option<i64>;
    fn is_charging(&self) -> bool;
}

/// The real sysfs, at the configured roots.
pub struct SysfsProbe<'a>(pub &'a Conditions);

impl DeviceProbe for SysfsProbe<'_> {
    fn max_thermal_millicelsius(&self) -> Option<i64> {
        conditions::max_thermal_millicelsius(&self.0.thermal_root)
    }
    fn is_charging(&self) -> bool {
        conditions::is_charging(&self.0.power_supply_root)
    }
}

#[derive(Debug, Default)]
pub struct Engine {
    rules: Vec<Rule>,
    budget: Budget,
    conditions: Conditions,
    last_fired: HashMap<String, u64>,
    /// BOOTTIME of captures started, for the hourly and daily budgets
    /// (boottime, so a night in suspend still counts as a night).
    started: VecDeque<u64>,
    /// The same for manual captures, which have their own budget.
    manual_started: VecDeque<u64>,
    /// Manual requests refused, by reason.
    pub manual_refused: BTreeMap<SkipReason, u64>,
    pub skipped: BTreeMap<SkipReason, u64>,
    pub fired_total: u64,
    /// Rules in a skip streak, so a rule held above its threshold logs once.
    skipping: HashSet<String>,
}

impl Engine {
    pub fn new(rules: Vec<Rule>, budget: Budget, conditions: Conditions) -> Self {
        Self {
            rules,
            budget,
            conditions,
            ..Default::default()
        }
    }

    /// Config reload: new rules and limits, same cooldown and budget state.
    pub fn reconfigure(&mut self, rules: Vec<Rule>, budget: Budget, conditions: Conditions) {
        self.rules = rules;
        self.budget = budget;
        self.conditions = conditions;
    }

    pub fn conditions(&self) -> &Conditions {
        &self.conditions
    }

    /// The device conditions every capture obeys, rule-triggered or manual:
    /// too hot, or not charging when charging is required.
    fn condition_veto(&self, device: &dyn DeviceProbe) -> Option<(SkipReason, String)> {
        if let Some(limit) = self.conditions.max_thermal_millicelsius {
            if let Some(t) = device.max_thermal_millicelsius() {
                if t > limit {
                    return Some((SkipReason::Thermal, format!("({t} m°C > {limit})")));
                }
            }
        }
        if self.conditions.require_charging && !device.is_charging() {
            return Some((SkipReason::NotCharging, String::new()));
        }
        None
    }

    /// Whether a manual capture may start now: the same device conditions
    /// as rules, and the manual budget (`budget.manual_captures_per_*`),
    /// which it then spends. `heap` requests obey the conditions only
    /// (heapprofd's own rate limits count them).
    pub fn admit_manual(
        &mut self,
        now_boottime_ns: u64,
        device: &dyn DeviceProbe,
        heap: bool,
    ) -> Result<(), (SkipReason, String)> {
        let refused = if let Some(veto) = self.condition_veto(device) {
            Some(veto)
        } else if heap {
            None
        } else {
            let (h, d) = (
                self.budget.manual_captures_per_hour,
                self.budget.manual_captures_per_day,
            );
            over_budget(&mut self.manual_started, now_boottime_ns, h, d).map(|r| {
                let limit = if r == SkipReason::BudgetHour {
                    format!("{h} per hour")
                } else {
                    format!("{d} per day")
                };
                (r, format!("(manual captures: {limit})"))
            })
        };
        match refused {
            Some(r) => {
                *self.manual_refused.entry(r.0).or_default() += 1;
                Err(r)
            }
            None => {
                if !heap {
                    self.manual_started.push_back(now_boottime_ns);
                }
                Ok(())
            }
        }
    }

    /// Names of processes rules watch, so history keeps them.
    pub fn watched_processes(&self) -> Vec<String> {
        self.rules
            .iter()
            .filter_map(|r| match &r.metric {
                Metric::ProcessCpuPct { process }
                | Metric::MajorFaultRate { process }
                | Metric::RssGrowthKb { process } => process.clone(),
                _ => None,
            })
            .collect()
    }

    fn skip(&mut self, rule: &str, reason: SkipReason, detail: &str) {
        *self.skipped.entry(reason).or_default() += 1;
        if self.skipping.insert(rule.to_owned()) {
            log::info!(
                "rule {rule} matched but no capture: {} {detail}",
                reason.name()
            );
        } else {
            log::debug!("rule {rule} still matching, skipped: {}", reason.name());
        }
    }

    /// Evaluates every rule against the history; returns the trigger to act
    /// on, if any. `now_boottime_ns` and the history's clocks come from the
    /// caller so tests control time.
    pub fn evaluate(
        &mut self,
        history: &History,
        now_boottime_ns: u64,
        capture_running: bool,
        device: &dyn DeviceProbe,
    ) -> Option<Fired> {
        let interval_ns = interval_ns(history);
        let rules = self.rules.clone();
        for rule in &rules {
            let Some((value, offender)) = matches(rule, history, interval_ns) else {
                self.skipping.remove(&rule.name);
                continue;
            };
            if let Some(&last) = self.last_fired.get(&rule.name) {
                if now_boottime_ns.saturating_sub(last) < rule.cooldown.0.as_nanos() as u64 {
                    self.skip(&rule.name, SkipReason::Cooldown, "");
                    continue;
                }
            }
            if capture_running {
                self.skip(&rule.name, SkipReason::CaptureRunning, "");
                continue;
            }
            let (per_hour, per_day) = (self.budget.captures_per_hour, self.budget.captures_per_day);
            if let Some(reason) = over_budget(&mut self.started, now_boottime_ns, per_hour, per_day)
            {
                self.skip(&rule.name, reason, "");
                continue;
            }
            if let Some((reason, detail)) = self.condition_veto(device) {
                self.skip(&rule.name, reason, &detail);
                continue;
            }
            self.skipping.remove(&rule.name);
            self.last_fired.insert(rule.name.clone(), now_boottime_ns);
            self.started.push_back(now_boottime_ns);
            self.fired_total += 1;
            log::info!(
                "rule {} fired: {value:.2} > {} {}",
                rule.name,
                rule.threshold,
                offender
                    .as_ref()
                    .map(|o| format!("({} pid {})", o.name, o.pid))
                    .unwrap_or_default()
            );
            return Some(Fired {
                rule: rule.name.clone(),
                value,
                threshold: rule.threshold,
                offender,
                capture: rule.capture.clone(),
                boottime_ns: now_boottime_ns,
            });
        }
        None
    }
}

fn interval_ns(h: &History) -> u64 {
    let v: Vec<u64> = h.iter().rev().take(2).map(|s| s.monotonic_ns).collect();
    match v.as_slice() {
        [a, b] if a > b => a - b,
        _ => 1_000_000_000,
    }
}

/// The samples covering `window`, or None if history does not reach back
/// that far yet (a rule needs its whole window of evidence).
fn window_samples<'a>(
    rule: &Rule,
    h: &'a History,
    interval_ns: u64,
) -> Option<Vec<&'a VitalsSample>> {
    let span = rule.window.0.as_nanos() as u64;
    let first = h.iter().next()?;
    let last = h.latest()?;
    // Each sample covers the interval before it.
    if last.monotonic_ns.saturating_sub(first.monotonic_ns) + interval_ns < span {
        return None;
    }
    let from = last
        .monotonic_ns
        .saturating_sub(span.saturating_sub(interval_ns));
    let v: Vec<&VitalsSample> = h.iter().filter(|s| s.monotonic_ns >= from).collect();
    (!v.is_empty()).then_some(v)
}

fn name_matches(want: &Option<String>, name: &str) -> bool {
    want.as_deref().is_none_or(|w| w == name)
}

/// The smallest value over the window if it stayed above the threshold the
/// whole time (RSS growth: the growth across the window), and the offender.
fn matches(rule: &Rule, h: &History, interval_ns: u64) -> Option<(f64, Option<Offender>)> {
    let samples = window_samples(rule, h, interval_ns)?;
    let t = rule.threshold;
    let system = |f: &dyn Fn(&VitalsSample) -> Option<f64>| -> Option<(f64, Option<Offender>)> {
        let mut min = f64::INFINITY;
        for s in &samples {
            let v = f(s)?;
            if v <= t {
                return None;
            }
            min = min.min(v);
        }
        Some((min, None))
    };
    // Per process instance: present in every sample with the value above t.
    let per_process = |want: &Option<String>, f: &dyn Fn(&crate::history::ProcessVitals) -> f64| {
        let last = samples.last()?;
        let mut best: Option<(f64, Offender)> = None;
        for p in last
            .processes
            .iter()
            .filter(|p| name_matches(want, &p.name))
        {
            let mut min = f64::INFINITY;
            let held = samples.iter().all(|s| {
                s.processes
                    .iter()
                    .find(|q| q.pid == p.pid && q.starttime_ticks == p.starttime_ticks)
                    .is_some_and(|q| {
                        let v = f(q);
                        min = min.min(v);
                        v > t
                    })
            });
            if held && best.as_ref().is_none_or(|(b, _)| min > *b) {
                best = Some((
                    min,
                    Offender {
                        pid: p.pid,
                        starttime_ticks: p.starttime_ticks,
                        name: p.name.to_string(),
                    },
                ));
            }
        }
        best.map(|(v, o)| (v, Some(o)))
    };
    match &rule.metric {
        Metric::SystemCpuBusyPct => system(&|s| s.local_busy_pct),
        Metric::LoadavgPerCpu => system(&|s| {
            (s.online_cpus > 0)
                .then_some(())
                .and(s.loadavg1.map(|l| l as f64 / s.online_cpus as f64))
        }),
        Metric::PsiAvg10 { resource, full } => {
            let i = ["cpu", "memory", "io"].iter().position(|r| r == resource)?;
            system(&|s| s.psi_avg10[i][usize::from(*full)].map(f64::from))
        }
        Metric::ProcessCpuPct { process } => per_process(process, &|p| p.core_equivalent_pct),
        Metric::MajorFaultRate { process } => per_process(process, &|p| p.majflt_per_s),
        Metric::RssGrowthKb { process } => {
            let first = samples.first()?;
            let last = samples.last()?;
            let mut best: Option<(f64, Offender)> = None;
            for p in last
                .processes
                .iter()
                .filter(|p| name_matches(process, &p.name))
            {
                let Some(end) = p.rss_kb else { continue };
                let Some(start) = first
                    .processes
                    .iter()
                    .find(|q| q.pid == p.pid && q.starttime_ticks == p.starttime_ticks)
                    .and_then(|q| q.rss_kb)
                else {
                    continue;
                };
                let growth = end as f64 - start as f64;
                if growth > t && best.as_ref().is_none_or(|(b, _)| growth > *b) {
                    best = Some((
                        growth,
                        Offender {
                            pid: p.pid,
                            starttime_ticks: p.starttime_ticks,
                            name: p.name.to_string(),
                        },
                    ));
                }
            }
            best.map(|(v, o)| (v, Some(o)))
        }
    }
}

#[cfg(test)]
mod tests {
    use std::{sync::Arc, time::Duration};

    use super::*;
    use crate::{config::Dur, history::ProcessVitals};

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
        VitalsSample {
            boottime_ns: t_s * S,
            monotonic_ns: t_s * S,
            local_busy_pct: Some(busy),
            loadavg1: Some(3.0),
            online_cpus: 2,
            psi_avg10: [[Some(12.0), Some(1.0)], [None, None], [None, None]],
            processes: procs,
        }
    }

    fn proc(pid: i32, cpu: f64, rss: u64) -> ProcessVitals {
        ProcessVitals {
            pid,
            starttime_ticks: 100,
            name: Arc::from("app"),
            core_equivalent_pct: cpu,
            majflt_per_s: 0.0,
            rss_kb: Some(rss),
            ebpf: None,
        }
    }

    fn rule(metric: Metric, threshold: f64, window_s: u64, cooldown_s: u64) -> Rule {
        Rule {
            name: "r".into(),
            metric,
            threshold,
            window: Dur(Duration::from_secs(window_s)),
            cooldown: Dur(Duration::from_secs(cooldown_s)),
            capture: CaptureSpec::default(),
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
}
