//! The election's decisions, pure: what to write to the Lease given what was read, when the lease
//! counts as expired, until when this replica may act, and the names upstream derives.
//!
//! The rules are client-go's `tryAcquireOrRenew`, so our replicas and upstream's read each other's
//! Lease the same way:
//! - a Lease held by someone else is expired once `leaseDurationSeconds` have passed, on the
//!   *local* monotonic clock, since this replica last saw the record change (never by comparing
//!   `renewTime` with the local wall clock, so clock skew between nodes does not matter);
//! - an empty `holderIdentity` (a released lease) may be taken at once;
//! - taking over increments `leaseTransitions` and sets `acquireTime`; renewing keeps both.

use std::collections::BTreeMap;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::LeaseSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use tokio::time::Instant;

/// Extra time past the lease duration before `/healthz/leader-election` fails (csi-lib-utils'
/// `DefaultHealthCheckTimeout`).
pub(crate) const HEALTH_CHECK_TIMEOUT: Duration = Duration::from_secs(20);

/// csi-lib-utils' `sanitizeName`: every character outside `[a-zA-Z0-9-]` becomes `-`, and an `X`
/// is appended when the result ends in `-`.
pub(crate) fn sanitize_name(name: &str) -> String {
    let mut out: String = name
        .chars()
        .map(|c| match c {
            'a'..='z' | 'A'..='Z' | '0'..='9' | '-' => c,
            _ => '-',
        })
        .collect();
    if out.ends_with('-') {
        out.push('X');
    }
    out
}

/// The lock name before sanitising: the driver name with `/` replaced by `-` (upstream passes this
/// to csi-lib-utils, which also uses it, unsanitised, in the events' source component).
pub(crate) fn lock_name(driver: &str) -> String {
    driver.replace('/', "-")
}

/// The Lease's name: [`lock_name`], sanitised. `hostpath.csi.k8s.io` gives `hostpath-csi-k8s-io`.
pub(crate) fn lease_name(driver: &str) -> String {
    sanitize_name(&lock_name(driver))
}

/// Lease duration, renew deadline and retry period (validated by `config` as client-go does).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Timings {
    /// How long a standby waits after the last change it saw before taking over.
    pub lease_duration: Duration,
    /// How long a leader may act after it started its last successful renewal.
    pub renew_deadline: Duration,
    /// Time between attempts.
    pub retry_period: Duration,
}

impl Timings {
    /// `leaseDurationSeconds` as client-go writes it: whole seconds, truncated.
    pub(crate) fn lease_seconds(&self) -> i32 {
        i32::try_from(self.lease_duration.as_secs()).unwrap_or(i32::MAX)
    }

    /// How long one successful write lets this replica act, counted from *before* the request was
    /// sent. Never longer than what other replicas read from the Lease (the truncated
    /// `leaseDurationSeconds`), so that a standby, which starts counting only once it has seen the
    /// write, cannot take over while this replica still acts.
    pub(crate) fn acting_window(&self) -> Duration {
        self.renew_deadline.min(Duration::from_secs(
            u64::try_from(self.lease_seconds()).unwrap_or(0),
        ))
    }
}

/// What to do after reading the Lease.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum LeaseDecision {
    /// No Lease exists: create it with this spec.
    Create(LeaseSpec),
    /// Write this spec over the Lease that was read (take over, or renew our own).
    Update(LeaseSpec),
    /// Someone else holds a lease that has not expired.
    Held {
        /// Their identity.
        holder: String,
    },
}

/// The election's memory, on the local monotonic clock.
#[derive(Clone, Debug)]
pub(crate) struct Elector {
    me: String,
    timings: Timings,
    /// The record last read or written, and when it was first seen in that state.
    observed: Option<(LeaseSpec, Instant)>,
}

impl Elector {
    /// `me` is the (sanitised) holder identity.
    pub(crate) fn new(me: impl Into<String>, timings: Timings) -> Self {
        Self {
            me: me.into(),
            timings,
            observed: None,
        }
    }

    /// Our identity.
    pub(crate) fn me(&self) -> &str {
        &self.me
    }

    /// The timings.
    pub(crate) fn timings(&self) -> Timings {
        self.timings
    }

    /// Records the Lease as read at `now`. The observation time moves only when the record changed
    /// (client-go compares the whole record): a holder that stops renewing leaves it unchanged,
    /// and its lease then expires `leaseDurationSeconds` after we first saw that last state.
    pub(crate) fn observe(&mut self, spec: &LeaseSpec, now: Instant) {
        match &self.observed {
            Some((seen, _)) if same_record(seen, spec) => {}
            _ => self.observed = Some((spec.clone(), now)),
        }
    }

    /// Records our own successful write, sent at `sent` (before the request went out).
    pub(crate) fn written(&mut self, spec: LeaseSpec, sent: Instant) {
        self.observed = Some((spec, sent));
    }

    /// The holder of the record last observed (`""` when released or unknown).
    pub(crate) fn holder(&self) -> &str {
        self.observed
            .as_ref()
            .and_then(|(s, _)| s.holder_identity.as_deref())
            .unwrap_or("")
    }

    /// Whether the last observed record names us (client-go's `IsLeader`).
    pub(crate) fn is_leader(&self) -> bool {
        !self.me.is_empty() && self.holder() == self.me
    }

    /// Whether the observed lease is still valid at `now`: seen less than its
    /// `leaseDurationSeconds` ago.
    pub(crate) fn lease_valid(&self, now: Instant) -> bool {
        self.observed.as_ref().is_some_and(|(spec, at)| {
            let secs = spec.lease_duration_seconds.unwrap_or(0).max(0);
            *at + Duration::from_secs(u64::try_from(secs).unwrap_or(0)) > now
        })
    }

    /// The renewal to try without reading first (client-go's fast path): only while we hold a
    /// lease that is still valid by our own observation.
    pub(crate) fn fast_renewal(&self, now: Instant, wall: Timestamp) -> Option<LeaseSpec> {
        let (seen, _) = self.observed.as_ref()?;
        (self.is_leader() && self.lease_valid(now)).then(|| self.renewed(seen, wall))
    }

    /// What to write after reading `current` (`None`: the Lease does not exist). Call
    /// [`Elector::observe`] with `current` first.
    pub(crate) fn decide(
        &self,
        current: Option<&LeaseSpec>,
        now: Instant,
        wall: Timestamp,
    ) -> LeaseDecision {
        let Some(current) = current else {
            return LeaseDecision::Create(self.fresh(0, wall));
        };
        let holder = current.holder_identity.as_deref().unwrap_or("");
        if holder == self.me {
            return LeaseDecision::Update(self.renewed(current, wall));
        }
        if !holder.is_empty() && self.lease_valid(now) {
            return LeaseDecision::Held {
                holder: holder.to_owned(),
            };
        }
        let transitions = current.lease_transitions.unwrap_or(0).saturating_add(1);
        LeaseDecision::Update(self.fresh(transitions, wall))
    }

    /// The record that gives the lease up (client-go's `release`): no holder, a 1 s duration,
    /// transitions kept. `None` when `current` is not ours (nothing to give up).
    pub(crate) fn release(&self, current: &LeaseSpec, wall: Timestamp) -> Option<LeaseSpec> {
        if current.holder_identity.as_deref() != Some(self.me.as_str()) {
            return None;
        }
        let mut spec = self.fresh(current.lease_transitions.unwrap_or(0), wall);
        spec.holder_identity = Some(String::new());
        spec.lease_duration_seconds = Some(1);
        Some(spec)
    }

    /// Why `/healthz/leader-election` fails, as client-go's `Check`: only a replica that believes
    /// it leads and has not renewed for longer than the lease duration plus
    /// [`HEALTH_CHECK_TIMEOUT`] (its renewal loop is stuck) is unhealthy.
    pub(crate) fn health(&self, now: Instant) -> Result<(), Duration> {
        let Some((_, at)) = &self.observed else {
            return Ok(());
        };
        let since = now.saturating_duration_since(*at);
        if self.is_leader() && since > self.timings.lease_duration + HEALTH_CHECK_TIMEOUT {
            return Err(since);
        }
        Ok(())
    }

    fn fresh(&self, transitions: i32, wall: Timestamp) -> LeaseSpec {
        let now = micro(wall);
        LeaseSpec {
            holder_identity: Some(self.me.clone()),
            lease_duration_seconds: Some(self.timings.lease_seconds()),
            acquire_time: Some(now.clone()),
            renew_time: Some(now),
            lease_transitions: Some(transitions),
            ..LeaseSpec::default()
        }
    }

    fn renewed(&self, current: &LeaseSpec, wall: Timestamp) -> LeaseSpec {
        let mut spec = self.fresh(current.lease_transitions.unwrap_or(0), wall);
        // client-go keeps the acquire time of its own term (a zero time when the record had none).
        spec.acquire_time = current.acquire_time.clone().or(spec.acquire_time);
        spec
    }
}

/// Whether two Lease specs hold the same election record (client-go compares the record, in
/// which an absent field and its zero value are the same).
fn same_record(a: &LeaseSpec, b: &LeaseSpec) -> bool {
    let text = |s: &Option<String>| s.as_deref().unwrap_or("").to_owned();
    let key = |s: &LeaseSpec| {
        (
            text(&s.holder_identity),
            s.lease_duration_seconds.unwrap_or(0),
            s.acquire_time.clone(),
            s.renew_time.clone(),
            s.lease_transitions.unwrap_or(0),
            text(&s.strategy),
            text(&s.preferred_holder),
        )
    };
    key(a) == key(b)
}

/// A wall-clock time as the API server stores a MicroTime (microseconds), so that reading back
/// our own write compares equal to what we remembered.
fn micro(wall: Timestamp) -> MicroTime {
    MicroTime(Timestamp::from_microsecond(wall.as_microsecond()).unwrap_or(wall))
}

/// `labels` merged into `existing` (client-go adds its labels on every write and keeps others).
pub(crate) fn merged_labels(
    existing: Option<BTreeMap<String, String>>,
    labels: &BTreeMap<String, String>,
) -> Option<BTreeMap<String, String>> {
    if labels.is_empty() {
        return existing;
    }
    let mut out = existing.unwrap_or_default();
    out.extend(labels.iter().map(|(k, v)| (k.clone(), v.clone())));
    Some(out)
}

#[cfg(test)]
#[path = "decide_tests.rs"]
mod tests;
