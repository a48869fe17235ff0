//! Run-time switchboard: injected errors and latencies per method, probe readiness, the
//! crash-after-create countdown, capability and misbehaviour switches, and per-method call counts.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::config::{Config, ControllerCap, FaultRule, Misbehaviour, Trigger};

/// How often a method was called and how it ended.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CallStats {
    /// Calls received (including ones failed by injection).
    pub total: u64,
    /// Calls answered OK.
    pub ok: u64,
    /// Calls answered with an error.
    pub failed: u64,
}

/// What the driver must do with one call before running it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CallPlan {
    /// Sleep this long first.
    pub latency: Duration,
    /// Fail with this rule's code (before or after the operation).
    pub fail: Option<FaultRule>,
}

/// A snapshot of the switches, for the state dump.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FaultsDump {
    /// Active error rules by method.
    pub faults: BTreeMap<String, FaultRule>,
    /// Active latencies by method, in milliseconds.
    pub latencies_ms: BTreeMap<String, u64>,
    /// Probes still to answer not-ready.
    pub probe_not_ready_count: u64,
    /// Milliseconds until Probe reports ready by time.
    pub probe_not_ready_ms: u64,
    /// New volumes still to create before the crash (1 = the next one).
    pub crash_after_create: Option<u64>,
    /// Advertised controller capabilities.
    pub capabilities: BTreeSet<ControllerCap>,
    /// Active misbehaviours.
    pub misbehaviours: BTreeSet<Misbehaviour>,
}

#[derive(Debug)]
struct State {
    rules: BTreeMap<String, FaultRule>,
    latencies: BTreeMap<String, Duration>,
    probe_not_ready_count: u64,
    probe_ready_at: Instant,
    crash_after_create: Option<u64>,
    capabilities: BTreeSet<ControllerCap>,
    misbehaviours: BTreeSet<Misbehaviour>,
    calls: BTreeMap<String, CallStats>,
}

/// The switchboard; every method takes `&self` so it can be shared by RPCs and the control socket.
#[derive(Debug)]
pub struct Faults {
    state: Mutex<State>,
}

impl Faults {
    /// The switches as configured at start.
    pub fn new(config: &Config) -> Self {
        Faults {
            state: Mutex::new(State {
                rules: config.faults.clone(),
                latencies: config.latencies.clone(),
                probe_not_ready_count: config.probe_not_ready.count,
                probe_ready_at: Instant::now() + config.probe_not_ready.duration,
                crash_after_create: config.crash_after_create,
                capabilities: config.capabilities.clone(),
                misbehaviours: config.misbehaviours.clone(),
                calls: BTreeMap::new(),
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave the switches half-written (every update is
        // a single assignment), so a poisoned lock is still safe to use.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Counts a call to `method` and decides its latency and injected error. A count-limited
    /// rule is used up here.
    pub fn begin(&self, method: &str) -> CallPlan {
        let mut st = self.lock();
        st.calls.entry(method.to_owned()).or_default().total += 1;
        let latency = st
            .latencies
            .get(method)
            .or_else(|| st.latencies.get("*"))
            .copied()
            .unwrap_or_default();
        let key = if st.rules.contains_key(method) {
            method
        } else {
            "*"
        };
        let mut fail = None;
        let mut exhausted = false;
        if let Some(rule) = st.rules.get_mut(key) {
            let fires = match &mut rule.trigger {
                Trigger::Always => true,
                Trigger::Count { remaining } => {
                    let fires = *remaining > 0;
                    *remaining = remaining.saturating_sub(1);
                    exhausted = *remaining == 0;
                    fires
                }
                Trigger::Rate { rate } => rand::random::<f64>() < *rate,
            };
            if fires {
                fail = Some(*rule);
            }
        }
        if exhausted {
            st.rules.remove(key);
        }
        CallPlan { latency, fail }
    }

    /// Records how a call ended.
    pub fn finish(&self, method: &str, ok: bool) {
        let mut st = self.lock();
        let stats = st.calls.entry(method.to_owned()).or_default();
        if ok {
            stats.ok += 1;
        } else {
            stats.failed += 1;
        }
    }

    /// Per-method call counts.
    pub fn calls(&self) -> BTreeMap<String, CallStats> {
        self.lock().calls.clone()
    }

    /// Forgets all call counts.
    pub fn reset_counts(&self) {
        self.lock().calls.clear();
    }

    /// Sets (replaces) the error rule of `method` (or `*`).
    pub fn set_fault(&self, method: &str, rule: FaultRule) {
        self.lock().rules.insert(method.to_owned(), rule);
    }

    /// Removes the error rule of `method` (or `*`).
    pub fn set_fault_cleared(&self, method: &str) {
        self.lock().rules.remove(method);
    }

    /// Sets the latency of `method` (or `*`); zero removes it.
    pub fn set_latency(&self, method: &str, latency: Duration) {
        let mut st = self.lock();
        if latency.is_zero() {
            st.latencies.remove(method);
        } else {
            st.latencies.insert(method.to_owned(), latency);
        }
    }

    /// Removes every error rule and latency, probe not-ready and the crash countdown.
    pub fn clear_faults(&self) {
        let mut st = self.lock();
        st.rules.clear();
        st.latencies.clear();
        st.probe_not_ready_count = 0;
        st.probe_ready_at = Instant::now();
        st.crash_after_create = None;
    }

    /// Reports not-ready for the next `count` probes and until `duration` from now.
    pub fn set_probe_not_ready(&self, count: u64, duration: Duration) {
        let mut st = self.lock();
        st.probe_not_ready_count = count;
        st.probe_ready_at = Instant::now() + duration;
    }

    /// Answers one probe: ready unless a not-ready count or period is still running.
    pub fn probe_ready(&self) -> bool {
        let mut st = self.lock();
        let by_time = Instant::now() >= st.probe_ready_at;
        if st.probe_not_ready_count > 0 {
            st.probe_not_ready_count -= 1;
            return false;
        }
        by_time
    }

    /// Crashes after the `n`th next newly created volume; `None` disarms.
    pub fn set_crash_after_create(&self, n: Option<u64>) {
        self.lock().crash_after_create = n.filter(|n| *n > 0);
    }

    /// Called once per newly created (and persisted) volume: true when the driver must crash now.
    pub fn crash_due(&self) -> bool {
        let mut st = self.lock();
        match st.crash_after_create {
            Some(1) => {
                st.crash_after_create = None;
                true
            }
            Some(n) => {
                st.crash_after_create = Some(n - 1);
                false
            }
            None => false,
        }
    }

    /// Whether `cap` is advertised and served.
    pub fn has_capability(&self, cap: ControllerCap) -> bool {
        self.lock().capabilities.contains(&cap)
    }

    /// The advertised capabilities.
    pub fn capabilities(&self) -> BTreeSet<ControllerCap> {
        self.lock().capabilities.clone()
    }

    /// Switches a capability on or off.
    pub fn set_capability(&self, cap: ControllerCap, enabled: bool) {
        let mut st = self.lock();
        if enabled {
            st.capabilities.insert(cap);
        } else {
            st.capabilities.remove(&cap);
        }
    }

    /// Whether a misbehaviour is on.
    pub fn misbehaves(&self, m: Misbehaviour) -> bool {
        self.lock().misbehaviours.contains(&m)
    }

    /// Switches a misbehaviour on or off.
    pub fn set_misbehaviour(&self, m: Misbehaviour, enabled: bool) {
        let mut st = self.lock();
        if enabled {
            st.misbehaviours.insert(m);
        } else {
            st.misbehaviours.remove(&m);
        }
    }

    /// The switches, for the state dump.
    pub fn dump(&self) -> FaultsDump {
        let st = self.lock();
        FaultsDump {
            faults: st.rules.clone(),
            latencies_ms: st
                .latencies
                .iter()
                .map(|(m, d)| (m.clone(), u64::try_from(d.as_millis()).unwrap_or(u64::MAX)))
                .collect(),
            probe_not_ready_count: st.probe_not_ready_count,
            probe_not_ready_ms: u64::try_from(
                st.probe_ready_at
                    .saturating_duration_since(Instant::now())
                    .as_millis(),
            )
            .unwrap_or(u64::MAX),
            crash_after_create: st.crash_after_create,
            capabilities: st.capabilities.clone(),
            misbehaviours: st.misbehaviours.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::Code;

    fn faults() -> Faults {
        Faults::new(&Config::new("/unused", "n1"))
    }

    #[test]
    fn a_counted_fault_fails_exactly_that_many_calls_then_switches_off() {
        let f = faults();
        f.set_fault("CreateVolume", FaultRule::times(Code::Unavailable, 2));
        let codes: Vec<_> = (0..4)
            .map(|_| f.begin("CreateVolume").fail.map(|r| r.code))
            .collect();
        assert_eq!(
            codes,
            vec![Some(Code::Unavailable), Some(Code::Unavailable), None, None]
        );
        assert!(f.dump().faults.is_empty());
        assert_eq!(f.calls()["CreateVolume"].total, 4);
    }

    #[test]
    fn a_method_rule_wins_over_the_wildcard_and_other_methods_are_untouched() {
        let f = faults();
        f.set_fault("*", FaultRule::always(Code::Internal));
        f.set_fault("DeleteVolume", FaultRule::always(Code::Aborted));
        assert_eq!(f.begin("DeleteVolume").fail.unwrap().code, Code::Aborted);
        assert_eq!(f.begin("Probe").fail.unwrap().code, Code::Internal);
        f.clear_faults();
        assert_eq!(f.begin("Probe").fail, None);
    }

    #[test]
    fn rate_zero_never_fails_and_rate_one_always_fails() {
        let f = faults();
        f.set_fault("ListVolumes", FaultRule::rate(Code::Unavailable, 0.0));
        assert!((0..100).all(|_| f.begin("ListVolumes").fail.is_none()));
        f.set_fault("ListVolumes", FaultRule::rate(Code::Unavailable, 1.0));
        assert!((0..100).all(|_| f.begin("ListVolumes").fail.is_some()));
    }

    #[test]
    fn latency_applies_per_method_with_a_wildcard_fallback() {
        let f = faults();
        f.set_latency("*", Duration::from_millis(5));
        f.set_latency("CreateVolume", Duration::from_secs(1));
        assert_eq!(f.begin("CreateVolume").latency, Duration::from_secs(1));
        assert_eq!(f.begin("DeleteVolume").latency, Duration::from_millis(5));
        f.set_latency("*", Duration::ZERO);
        assert_eq!(f.begin("DeleteVolume").latency, Duration::ZERO);
    }

    #[test]
    fn probe_reports_not_ready_for_the_first_n_probes() {
        let f = faults();
        f.set_probe_not_ready(2, Duration::ZERO);
        let answers: Vec<bool> = (0..3).map(|_| f.probe_ready()).collect();
        assert_eq!(answers, vec![false, false, true]);
        f.set_probe_not_ready(0, Duration::from_secs(3600));
        assert!(!f.probe_ready());
    }

    #[test]
    fn the_crash_countdown_fires_once_on_the_nth_create() {
        let f = faults();
        f.set_crash_after_create(Some(3));
        let fired: Vec<bool> = (0..5).map(|_| f.crash_due()).collect();
        assert_eq!(fired, vec![false, false, true, false, false]);
    }

    #[test]
    fn call_outcomes_are_counted_separately() {
        let f = faults();
        f.begin("DeleteVolume");
        f.finish("DeleteVolume", true);
        f.begin("DeleteVolume");
        f.finish("DeleteVolume", false);
        assert_eq!(
            f.calls()["DeleteVolume"],
            CallStats {
                total: 2,
                ok: 1,
                failed: 1
            }
        );
        f.reset_counts();
        assert!(f.calls().is_empty());
    }
}
