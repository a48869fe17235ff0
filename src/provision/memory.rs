//! What the provisioning controller remembers about each claim between reconciles, as one value
//! with pure transitions (the shell holds it behind one lock and never awaits while holding it):
//!
//! - the retry backoff of failed reconciles;
//! - the infeasible hold-back (CreateVolume answered `InvalidArgument`; [`InfeasibleHold`]);
//! - the pinned accessibility requirement while a CreateVolume may be in progress (upstream's
//!   per-PVC topology cache): retries send it again even if nodes change or vanish meanwhile;
//! - node mode: the competition for unselected claims and when each may be claimed;
//! - node mode: since when an intent has been waiting for a node that is missing;
//! - the claims whose PV this process created and that were not seen Bound yet (for the
//!   claim-to-Bound latency).
//!
//! Keys are the claims' `namespace/name`, the work queue's keys. A claim deleted and created
//! again under its name is another claim: [`ClaimMemory::observe`], at the start of each
//! reconcile, forgets what was remembered for the one before (told by its UID; kept for pending
//! claims only, so a restart over many bound claims keeps nothing per claim).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use super::classify::ProvisioningState;
use super::plan::IgnoreReason;
use crate::csi::v1::TopologyRequirement;
use crate::node_mode::ownership::Competition;
use crate::retry::{Backoff, InfeasibleHold};

/// Per-claim memory of the provisioning controller.
pub(crate) struct ClaimMemory {
    /// The UID each pending claim was last reconciled with.
    uids: HashMap<String, String>,
    backoff: Backoff<String>,
    infeasible: InfeasibleHold<String>,
    pins: HashMap<String, TopologyRequirement>,
    /// Node mode only: controller mode never competes, nor enters `node_mode`.
    competition: Option<Competition>,
    compete_at: HashMap<String, Instant>,
    /// Since when the node an intent waits for (named too: a claim created again under the same
    /// name may wait for another node) has been missing.
    node_gone_since: HashMap<String, (String, Instant)>,
    awaiting_bound: std::collections::HashSet<String>,
    /// When this process created each claim's PV: a reconcile from a cache that has not seen the
    /// PV yet must not replay CreateVolume for it.
    pv_created: HashMap<String, Instant>,
    /// CreateVolume attempts that failed for sure since the last success or stop (the class's
    /// retry policy, `provision::classify`).
    final_failures: HashMap<String, u32>,
}

/// How long after creating a PV a claim is taken as provisioned without the cache showing it:
/// far longer than a watch lags, short enough that a PV deleted at once is noticed.
pub(crate) const PV_CACHE_GRACE: Duration = Duration::from_secs(30);

impl ClaimMemory {
    /// Empty memory with these retry policies.
    pub(crate) fn new(
        backoff: Backoff<String>,
        infeasible: InfeasibleHold<String>,
        competition: Option<Competition>,
    ) -> Self {
        Self {
            uids: HashMap::new(),
            backoff,
            infeasible,
            pins: HashMap::new(),
            competition,
            compete_at: HashMap::new(),
            node_gone_since: HashMap::new(),
            awaiting_bound: std::collections::HashSet::new(),
            pv_created: HashMap::new(),
            final_failures: HashMap::new(),
        }
    }

    /// A reconcile of the claim `key` with UID `uid` starts (`bound`: its volume is named, for
    /// good). What was remembered under `key` for a claim of another UID (deleted, then created
    /// again under its name) is forgotten. A claim first seen pending forgets what an earlier one
    /// left too: a bound claim's UID is not kept.
    pub(crate) fn observe(&mut self, key: &str, uid: &str, bound: bool) {
        if bound {
            // A claim created again already bound (to a static PV) leaves nothing of the one before.
            if self.uids.remove(key).is_some_and(|known| known != uid) {
                self.forget(key);
            }
            return;
        }
        if self.uids.get(key).is_some_and(|known| known == uid) {
            return;
        }
        self.forget(key);
        self.uids.insert(key.to_owned(), uid.to_owned());
    }

    /// Everything remembered about `key`.
    fn forget(&mut self, key: &str) {
        self.retain_keys(|k| k != key, false);
    }

    // === Reconcile outcomes ===

    /// A reconcile failed: the delay before the next one.
    pub(crate) fn failed(&mut self, key: &str) -> Duration {
        self.backoff.failed(&key.to_owned())
    }

    /// A reconcile succeeded: the next failure starts the backoff over.
    pub(crate) fn succeeded(&mut self, key: &str) {
        self.backoff.reset(&key.to_owned());
    }

    /// The claim is ignored for `reason`: what no longer applies is forgotten.
    pub(crate) fn ignored(&mut self, key: &str, reason: &IgnoreReason) {
        if matches!(
            reason,
            IgnoreReason::ClaimDeleting | IgnoreReason::AlreadyBound(_) | IgnoreReason::PvExists(_)
        ) {
            self.pins.remove(key);
        }
        // The competition is over for a claim that is bound, deleted or not ours.
        if !matches!(reason, IgnoreReason::NotThisNode(_)) {
            self.stop_competing(key);
        }
        // A claim that is going away keeps no hold-back behind.
        if matches!(
            reason,
            IgnoreReason::ClaimDeleting | IgnoreReason::AlreadyBound(_)
        ) {
            self.infeasible.remove(&key.to_owned());
        }
    }

    /// Keeps only the claims `keep` accepts (the others left the cache for good).
    pub(crate) fn retain(&mut self, keep: impl Fn(&str) -> bool) {
        self.uids.retain(|k, _| keep(k));
        self.retain_keys(keep, true);
    }

    /// Keeps the entries of the keys `keep` accepts; `expire`: and drops PV creations older than
    /// [`PV_CACHE_GRACE`].
    fn retain_keys(&mut self, keep: impl Fn(&str) -> bool, expire: bool) {
        self.backoff.retain(|k| keep(k));
        self.infeasible.retain(|k| keep(k));
        if let Some(competition) = &mut self.competition {
            competition.retain(&keep);
        }
        self.compete_at.retain(|k, _| keep(k));
        self.node_gone_since.retain(|k, _| keep(k));
        self.awaiting_bound.retain(|k| keep(k));
        self.final_failures.retain(|k, _| keep(k));
        let now = Instant::now();
        self.pv_created
            .retain(|k, at| keep(k) && (!expire || now.duration_since(*at) < PV_CACHE_GRACE));
        self.pins.retain(|k, _| keep(k));
    }

    // === CreateVolume attempts ===

    /// `Err(remaining)` while the claim is held back after an infeasible answer for this class.
    pub(crate) fn check_feasible(
        &mut self,
        key: &str,
        class_uid: &str,
        now: Instant,
    ) -> Result<(), Duration> {
        self.infeasible.check(&key.to_owned(), class_uid, now)
    }

    /// The requirement a retry must send again, if one is pinned.
    pub(crate) fn pinned(&self, key: &str) -> Option<TopologyRequirement> {
        self.pins.get(key).cloned()
    }

    /// CreateVolume was sent with `requirement`: retries send it again (nothing to pin when it had
    /// none: a request without requirements is recomputed identically without looking at nodes).
    pub(crate) fn sent(&mut self, key: &str, requirement: Option<&TopologyRequirement>) {
        if let Some(requirement) = requirement {
            self.pins.insert(key.to_owned(), requirement.clone());
        }
    }

    /// CreateVolume failed in state `outcome`; `infeasible`: hold the claim back for `class_uid`.
    pub(crate) fn create_failed(
        &mut self,
        key: &str,
        outcome: ProvisioningState,
        infeasible: Option<(&str, Instant)>,
    ) {
        // Upstream forgets the pin on a final error and on reschedule, and keeps it while the
        // volume may still be in progress or nothing reached the driver.
        if matches!(
            outcome,
            ProvisioningState::Finished | ProvisioningState::Reschedule
        ) {
            self.pins.remove(key);
        }
        if let Some((class_uid, now)) = infeasible {
            self.infeasible.record(key.to_owned(), class_uid, now);
        }
    }

    /// A CreateVolume failed for sure: how many have since the last success or stop.
    pub(crate) fn final_failure(&mut self, key: &str) -> u32 {
        let n = self.final_failures.entry(key.to_owned()).or_default();
        *n += 1;
        *n
    }

    /// The retry policy stopped the claim: removing the stop gives it a fresh count.
    pub(crate) fn stopped(&mut self, key: &str) {
        self.final_failures.remove(key);
    }

    /// The PV exists: the attempt is over.
    pub(crate) fn provisioned(&mut self, key: &str) {
        self.final_failures.remove(key);
        self.infeasible.remove(&key.to_owned());
        self.pins.remove(key);
        self.awaiting_bound.insert(key.to_owned());
        self.pv_created.insert(key.to_owned(), Instant::now());
    }

    /// Whether this process created the claim's PV within [`PV_CACHE_GRACE`] of `now`.
    pub(crate) fn recently_provisioned(&self, key: &str, now: Instant) -> bool {
        self.pv_created
            .get(key)
            .is_some_and(|at| now.duration_since(*at) < PV_CACHE_GRACE)
    }

    /// The claim `key` is Bound: `true` the first time for a claim whose PV this process created
    /// (its latency is to be recorded once), `false` otherwise.
    pub(crate) fn bound(&mut self, key: &str) -> bool {
        self.awaiting_bound.remove(key)
    }

    /// The requirement is no longer needed (node cleared, intent finished or cleaned up).
    pub(crate) fn unpin(&mut self, key: &str) {
        self.pins.remove(key);
    }

    // === Node mode ===

    /// When this instance may claim the unselected claim `key` (a new jittered delay the first
    /// time; `jitter` in `[0, 1)`).
    pub(crate) fn compete_due(&mut self, key: &str, now: Instant, jitter: f64) -> Instant {
        if let Some(due) = self.compete_at.get(key) {
            return *due;
        }
        let delay = self.competition.as_mut().map(|c| c.next_delay(key, jitter));
        let due = now + delay.unwrap_or_default();
        self.compete_at.insert(key.to_owned(), due);
        due
    }

    /// The wait is over (claimed or lost): a later competition draws a new delay.
    pub(crate) fn compete_now(&mut self, key: &str) {
        self.compete_at.remove(key);
    }

    /// The competition for `key` is over.
    pub(crate) fn stop_competing(&mut self, key: &str) {
        if let Some(competition) = &mut self.competition {
            competition.forget(key);
        }
    }

    /// Since when the intent of `key` has been waiting for its missing `node` (starts now, and
    /// anew when the node is another).
    pub(crate) fn node_missing_since(&mut self, key: &str, node: &str, now: Instant) -> Instant {
        match self.node_gone_since.get(key) {
            Some((known, since)) if known == node => *since,
            _ => {
                self.node_gone_since
                    .insert(key.to_owned(), (node.to_owned(), now));
                now
            }
        }
    }

    /// The node is back, or the claim moved on: a later absence starts a new grace period.
    pub(crate) fn node_not_missing(&mut self, key: &str) {
        self.node_gone_since.remove(key);
    }
}

#[cfg(test)]
#[path = "memory_tests.rs"]
mod tests;
