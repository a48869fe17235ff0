//! Which claims and volumes a node-deployment instance owns: upstream's `checkNode` table, the
//! immediate-binding competition (`becomeOwner`), clearing a selected node that has no instance of
//! our driver (upstream issue 544, in both modes), and the node-mode deletion check.
//!
//! The claim table ([`check_node`], reference §6.2):
//!
//! | `volume.kubernetes.io/selected-node` | decision |
//! |---|---|
//! | our node | [`ClaimOwnership::Owned`] |
//! | another node | [`ClaimOwnership::NotOwned`], silently: no event, no error (upstream issue 669) — unless that node has no instance of our driver, see below |
//! | empty | immediate-binding path: class binding mode `Immediate`, `--node-deployment-immediate-binding`, and `allowedTopologies` compatible with our segments → [`ClaimOwnership::Compete`]; otherwise not owned |
//!
//! Competing ([`Competition`], [`compete_delay`], [`recheck_before_claiming`], [`become_owner_patch`]):
//! wait a jittered exponential delay per claim, re-read the claim, then write our node into
//! `selected-node` with the claim's resourceVersion as a precondition. Exactly one instance's write
//! succeeds; the others get 409 Conflict, call [`Competition::next_delay`] again and re-check (by
//! then the claim names the winner and they stop). The winner's own later PVC update makes the
//! claim [`ClaimOwnership::Owned`].
//!
//! A claim whose selected node has no CSINode entry for our driver would stay Pending forever (no
//! instance will ever provision it there): `csinode::selected_node_check` returns
//! `ClearSelectedNode`, whose patch removes the annotation (again with a resourceVersion precondition) so the scheduler
//! picks another node, plus the event saying which node and why.

use std::collections::HashMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::{CSINode, StorageClass};
use serde_json::{Value, json};

use crate::model::claim::{bound_volume, claim_class_name, selected_node};
use crate::model::topology::{
    self, AffinityError, ClearSelectedNode, CsiNodeLookup, allowed_topologies_admit,
    live_instances, selected_node_check,
};
use crate::names;
use crate::retry::delay_after;

/// What a node-mode instance does with a claim.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum ClaimOwnership {
    /// The claim's selected node is ours: provision it.
    Owned,
    /// Unselected claim of an Immediate class we could serve: start competing for it
    /// ([`Competition::next_delay`], then [`recheck_before_claiming`]). Not owned *yet*: the claim
    /// becomes [`ClaimOwnership::Owned`] when the PVC update carrying our node arrives.
    Compete,
    /// Not ours. Silent: log at debug level at most, no event (upstream issue 669).
    NotOwned(NotOwned),
    /// The selected node has no instance of our driver: clear the annotation (see `model::topology::selected_node_check`).
    ClearSelectedNode(ClearSelectedNode),
}

/// Why a claim is not this instance's (for debug logs; never an event).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum NotOwned {
    /// Another node is selected (the normal case for most claims on a large cluster).
    SelectedOtherNode(String),
    /// Neither `spec.storageClassName` nor the beta class annotation names a class.
    NoStorageClassName,
    /// The named class is not in the cache. Retry with backoff: it may not have arrived yet.
    StorageClassNotFound(String),
    /// The class binds `WaitForFirstConsumer` (or the mode is unset): wait for the scheduler.
    NotImmediateBinding,
    /// `--node-deployment-immediate-binding=false`.
    ImmediateBindingDisabled,
    /// The class's `allowedTopologies` exclude this node ("allowed topologies is not compatible").
    AllowedTopologiesIncompatible,
}

impl NotOwned {
    /// Whether the same claim may become ours without itself changing (a class that arrives later).
    #[cfg(test)]
    pub(crate) fn should_retry(&self) -> bool {
        matches!(self, Self::StorageClassNotFound(_))
    }
}

/// This instance's node as the ownership decisions need it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct NodeIdentity {
    /// `NODE_NAME`.
    pub(crate) name: String,
    /// `NodeGetInfo.accessible_topology.segments` (empty when the driver reports none).
    pub(crate) segments: HashMap<String, String>,
}

/// What the shell looks up before calling [`check_node`].
#[derive(Clone, Copy, Debug)]
pub(crate) struct OwnershipInputs<'a> {
    /// This instance's node.
    pub(crate) me: &'a NodeIdentity,
    /// Our driver's name (for the clear-selected-node message).
    pub(crate) driver: &'a str,
    /// Topology gate on and the plugin has `VOLUME_ACCESSIBILITY_CONSTRAINTS`.
    pub(crate) topology_supported: bool,
    /// `--node-deployment-immediate-binding`.
    pub(crate) immediate_binding: bool,
    /// The claim's class from the cache (named by [`claim_class_name`]); `None` when not found.
    /// Only read for unselected claims.
    pub(crate) storage_class: Option<&'a StorageClass>,
    /// Only read when another node is selected: whether that node runs our driver. The shell passes
    /// [`CsiNodeLookup::Unknown`] unless this instance is the one chosen to clear (rendezvous rank 0
    /// of the claim UID among live instances) and the CSINode cache has synced.
    pub(crate) selected_node_driver: CsiNodeLookup,
}

/// Upstream `checkNode` (reference §6.2) plus the clear-selected-node rule.
pub(crate) fn check_node(
    pvc: &PersistentVolumeClaim,
    inputs: &OwnershipInputs<'_>,
) -> ClaimOwnership {
    match selected_node(pvc) {
        Some(node) if node == inputs.me.name => ClaimOwnership::Owned,
        Some(node) => match selected_node_check(pvc, inputs.driver, inputs.selected_node_driver) {
            Some(clear) => ClaimOwnership::ClearSelectedNode(clear),
            None => ClaimOwnership::NotOwned(NotOwned::SelectedOtherNode(node.to_owned())),
        },
        None => immediate_binding_path(pvc, inputs),
    }
}

fn immediate_binding_path(
    pvc: &PersistentVolumeClaim,
    inputs: &OwnershipInputs<'_>,
) -> ClaimOwnership {
    let Some(class_name) = claim_class_name(pvc) else {
        // Upstream dereferences a nil class name here and crashes; not owned is the safe answer.
        return ClaimOwnership::NotOwned(NotOwned::NoStorageClassName);
    };
    let Some(class) = inputs.storage_class else {
        return ClaimOwnership::NotOwned(NotOwned::StorageClassNotFound(class_name.to_owned()));
    };
    if class.volume_binding_mode.as_deref() != Some("Immediate") {
        return ClaimOwnership::NotOwned(NotOwned::NotImmediateBinding);
    }
    if !inputs.immediate_binding {
        return ClaimOwnership::NotOwned(NotOwned::ImmediateBindingDisabled);
    }
    if inputs.topology_supported
        && let Some(allowed) = class.allowed_topologies.as_deref()
        && !allowed_topologies_admit(allowed, &inputs.me.segments)
    {
        return ClaimOwnership::NotOwned(NotOwned::AllowedTopologiesIncompatible);
    }
    ClaimOwnership::Compete
}

// === Clearing a selected node without our driver ===

/// Node mode: whether this instance looks at (and may clear) the selected node of the claim
/// `claim_uid` (in controller mode the one instance always does): only the first instance in rendezvous
/// order of the claim UID among the live instances (nodes whose CSINode lists `driver`), so one
/// instance clears the claim and records one event instead of every node of the cluster.
pub(crate) fn checks_selected_node(
    me: &str,
    claim_uid: &str,
    csinodes: &[std::sync::Arc<CSINode>],
    driver: &str,
) -> bool {
    let live = live_instances(csinodes.iter().map(AsRef::as_ref), driver);
    crate::rendezvous::rank_of(claim_uid, me, live.iter().map(String::as_str)) == Some(0)
}

// === The immediate-binding competition (upstream becomeOwner) ===

/// `becomeOwner`'s delay before attempt `attempt` (0 for the first): `base·2^attempt` capped at
/// `max`, minus `jitter·base` where `jitter` is a uniform sample in `[0, 1)`, floored at zero. So
/// the first attempt waits in `(0, base]` and instances rarely write at the same moment.
pub(crate) fn compete_delay(attempt: u32, base: Duration, max: Duration, jitter: f64) -> Duration {
    let jitter = if jitter.is_finite() {
        jitter.clamp(0.0, 1.0)
    } else {
        0.0
    };
    delay_after(base, max, attempt).saturating_sub(base.mul_f64(jitter))
}

/// Per-claim attempt counts of the competition (upstream's per-UID exponential limiter; keyed by
/// the claim's key, which `ClaimMemory::observe` clears for a claim created again).
#[derive(Clone, Debug)]
pub(crate) struct Competition {
    base: Duration,
    max: Duration,
    attempts: HashMap<String, u32>,
}

impl Competition {
    /// `--node-deployment-base-delay`, `--node-deployment-max-delay`.
    pub(crate) fn new(base: Duration, max: Duration) -> Self {
        Self {
            base,
            max,
            attempts: HashMap::new(),
        }
    }

    /// The delay before the next attempt for claim `key`, counting this attempt. `jitter` is a
    /// uniform sample in `[0, 1)` (the shell draws it; tests pass fixed values).
    pub(crate) fn next_delay(&mut self, key: &str, jitter: f64) -> Duration {
        let attempt = self.attempts.entry(key.to_owned()).or_insert(0);
        let delay = compete_delay(*attempt, self.base, self.max, jitter);
        *attempt = attempt.saturating_add(1);
        delay
    }

    /// Attempts made so far for `key`.
    #[cfg(test)]
    pub(crate) fn attempts(&self, key: &str) -> u32 {
        self.attempts.get(key).copied().unwrap_or(0)
    }

    /// Forgets `key`: after a win, when another node was selected, or when the claim is deleted.
    pub(crate) fn forget(&mut self, key: &str) {
        self.attempts.remove(key);
    }

    /// Keeps only the claims `keep` accepts (drops the attempts of claims that are gone).
    pub(crate) fn retain(&mut self, mut keep: impl FnMut(&str) -> bool) {
        self.attempts.retain(|key, _| keep(key));
    }

    /// Number of claims being competed for (for a gauge or a test).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.attempts.len()
    }
}

/// What to do after the competition delay, from a fresh read of the claim.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Recheck {
    /// Still unselected: write [`become_owner_patch`] with this resourceVersion.
    Claim {
        /// The claim's resourceVersion, the write's precondition.
        resource_version: String,
    },
    /// Our node is already selected (our earlier write landed): forget the claim, it is owned.
    AlreadyOurs,
    /// Stop competing and forget the claim.
    Abandon(Abandon),
}

/// Why a competition ends without a write.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Abandon {
    /// The claim is gone (upstream error `PVC not found`).
    ClaimGone,
    /// A claim of the same name with another UID (upstream error `PVC was replaced`).
    ClaimReplaced,
    /// Another node won.
    TakenBy(String),
    /// The claim is bound or being deleted.
    NoLongerPending,
    /// The claim has no resourceVersion, so the write could not be made conditional.
    NoResourceVersion,
}

/// Re-checks a claim (`current`, freshly read; `None` = 404) before writing our node into it.
pub(crate) fn recheck_before_claiming(
    current: Option<&PersistentVolumeClaim>,
    uid: &str,
    me: &str,
) -> Recheck {
    let Some(pvc) = current else {
        return Recheck::Abandon(Abandon::ClaimGone);
    };
    if pvc.metadata.uid.as_deref() != Some(uid) {
        return Recheck::Abandon(Abandon::ClaimReplaced);
    }
    match selected_node(pvc) {
        Some(node) if node == me => return Recheck::AlreadyOurs,
        Some(node) => return Recheck::Abandon(Abandon::TakenBy(node.to_owned())),
        None => {}
    }
    if bound_volume(pvc).is_some() || pvc.metadata.deletion_timestamp.is_some() {
        return Recheck::Abandon(Abandon::NoLongerPending);
    }
    match pvc.metadata.resource_version.as_deref() {
        Some(rv) if !rv.is_empty() => Recheck::Claim {
            resource_version: rv.to_owned(),
        },
        _ => Recheck::Abandon(Abandon::NoResourceVersion),
    }
}

/// Merge patch writing our node into `selected-node`, valid only against `resource_version`: the
/// optimistic-concurrency write that decides the competition (409 Conflict for every loser).
pub(crate) fn become_owner_patch(node: &str, resource_version: &str) -> Value {
    json!({
        "metadata": {
            "resourceVersion": resource_version,
            "annotations": { names::ANN_SELECTED_NODE: node },
        }
    })
}

// === Deletion in node mode ===

/// Whether this node-mode instance may delete `pv` (upstream §6.4): its node affinity must be
/// satisfied by our `NodeGetInfo` segments. A PV without node affinity, or a driver reporting no
/// topology (empty `segments`), counts as accessible everywhere, so every instance may ask its
/// driver, which decides. `Ok(false)`: the delete path ends silently with [`NOT_PROVISIONED_HERE`]
/// (upstream IgnoredError: no event, no retry). An error (an invalid affinity) is a delete failure.
///
/// `migrated`: `pv` is an in-tree PV as translated for our driver. Its affinity keeps the in-tree
/// region label beside the zone the translation renames, which no driver reports: where the zone's
/// name carries the region, the zone alone is judged
/// ([`crate::migration::topology::drop_implied_regions`]). Upstream judges the region too: no
/// instance ever deletes such a PV, and it stays Released with its volume.
pub(crate) fn may_delete_here(
    pv: &PersistentVolume,
    segments: &HashMap<String, String>,
    migrated: bool,
) -> Result<bool, AffinityError> {
    let affinity = pv.spec.as_ref().and_then(|s| s.node_affinity.as_ref());
    let topology = (!segments.is_empty()).then_some(segments);
    if !(migrated && topology.is_some()) {
        return topology::volume_is_accessible(affinity, topology);
    }
    let mut judged = affinity.cloned();
    if let Some(affinity) = judged.as_mut() {
        crate::migration::topology::drop_implied_regions(affinity, |key| {
            segments.contains_key(key)
        });
    }
    topology::volume_is_accessible(judged.as_ref(), topology)
}

#[cfg(test)]
#[path = "ownership_tests.rs"]
mod tests;
