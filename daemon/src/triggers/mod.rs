//! Health rules over the history, with per-rule cooldowns, capture budgets
//! and device conditions. At most one trigger fires per evaluation, and none
//! while a capture runs: one capture at a time.

pub mod conditions;

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};

use serde::Serialize;

use crate::{
    config::{Budget, Conditions, RecordingSpec, Rule, Watch},
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
    pub capture: RecordingSpec,
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
            .filter_map(|r| match r.metric.watch()? {
                Watch::Held { process, .. } | Watch::Growth { process, .. } => {
                    process.map(str::to_owned)
                }
                Watch::System { .. } => None,
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

fn name_matches(want: Option<&str>, name: &str) -> bool {
    want.is_none_or(|w| w == name)
}

fn offender(p: &crate::history::ProcessVitals) -> Offender {
    Offender {
        pid: p.pid,
        starttime_ticks: p.starttime_ticks,
        name: p.name.to_string(),
    }
}

/// The same process instance in sample `s`, if kept there.
fn instance<'s>(
    s: &'s VitalsSample,
    p: &crate::history::ProcessVitals,
) -> Option<&'s crate::history::ProcessVitals> {
    s.processes
        .iter()
        .find(|q| q.pid == p.pid && q.starttime_ticks == p.starttime_ticks)
}

/// The smallest value over the window if it stayed above the threshold the
/// whole time (RSS growth: the growth across the window), and the offender.
/// The metric names its figure (`Metric::watch`); a figure absent from a
/// sample (not read that window) does not hold.
fn matches(rule: &Rule, h: &History, interval_ns: u64) -> Option<(f64, Option<Offender>)> {
    let samples = window_samples(rule, h, interval_ns)?;
    let t = rule.threshold;
    let first = samples.first()?;
    let last = samples.last()?;
    match rule.metric.watch()? {
        Watch::System { figure } => {
            let mut min = f64::INFINITY;
            for s in &samples {
                let v = s.figures.get(figure)?;
                if v <= t {
                    return None;
                }
                min = min.min(v);
            }
            Some((min, None))
        }
        // Per process instance: present in every sample with the value
        // above t.
        Watch::Held { figure, process } => {
            let mut best: Option<(f64, Offender)> = None;
            for p in last
                .processes
                .iter()
                .filter(|p| name_matches(process, &p.name))
            {
                let mut min = f64::INFINITY;
                let held = samples.iter().all(|s| {
                    instance(s, p)
                        .and_then(|q| q.figures.get(figure))
                        .is_some_and(|v| {
                            min = min.min(v);
                            v > t
                        })
                });
                if held && best.as_ref().is_none_or(|(b, _)| min > *b) {
                    best = Some((min, offender(p)));
                }
            }
            best.map(|(v, o)| (v, Some(o)))
        }
        Watch::Growth { figure, process } => {
            let mut best: Option<(f64, Offender)> = None;
            for p in last
                .processes
                .iter()
                .filter(|p| name_matches(process, &p.name))
            {
                let Some(end) = p.figures.get(figure) else {
                    continue;
                };
                let Some(start) = instance(first, p).and_then(|q| q.figures.get(figure)) else {
                    continue;
                };
                let growth = end - start;
                if growth > t && best.as_ref().is_none_or(|(b, _)| growth > *b) {
                    best = Some((growth, offender(p)));
                }
            }
            best.map(|(v, o)| (v, Some(o)))
        }
    }
}

#[cfg(test)]
mod tests;
