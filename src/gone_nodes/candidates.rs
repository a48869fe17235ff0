//! Which volumes the dead-node clean-up considers ([`classify`]), and why the others are not
//! ([`Skip`]).

use k8s_openapi::api::core::v1::{ObjectReference, PersistentVolume, PersistentVolumeClaim};

use super::policy::GoneConfig;
use crate::model::claim::bound_volume;
use crate::model::locate::{NodeQuery, Unlocated, node_query};
use crate::names;

/// Why a PV is not (or no longer) a dead-node candidate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Skip {
    /// Not a CSI volume of our driver.
    NotOurDriver,
    /// Reclaim policy other than `Delete`: the admin keeps it.
    NotDeletePolicy,
    /// Being deleted without our finalizer: someone else's business (upstream "already handled").
    AlreadyHandled,
    /// Bound, and `--deleted-node-pvc-cleanup` is off (or the claim reference lacks a UID,
    /// namespace or name).
    BoundClaimKept,
    /// `Pending`, `Available`, `Failed` or no phase.
    NotReleased,
    /// The affinity can be satisfied by more than one node (zonal volume), or in controller mode a
    /// volume without affinity: other nodes or the controller plugin can still reach it.
    NotNodeLocal,
    /// No node recorded and no affinity: where it lived is unknown.
    NoNodeKnown,
}

impl From<Unlocated> for Skip {
    fn from(why: Unlocated) -> Self {
        match why {
            Unlocated::NotNodeLocal => Skip::NotNodeLocal,
            Unlocated::NoNodeKnown => Skip::NoNodeKnown,
        }
    }
}

/// A claim to delete, with its UID as the delete precondition (local-static-provisioner does the
/// same): a claim re-created under the same name is another object and is never touched.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ClaimToDelete {
    /// Namespace.
    pub(crate) namespace: String,
    /// Name.
    pub(crate) name: String,
    /// UID from the PV's `claimRef`: the `DeleteParams` precondition.
    pub(crate) uid: String,
}

/// What answering a candidate means.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Answer {
    /// A released volume (or one deleted first, whose claim is gone).
    Volume {
        /// The PV object still has to be deleted (no deletionTimestamp yet).
        delete_object: bool,
        /// Our deletion-protection finalizer is on it.
        remove_finalizer: bool,
    },
    /// Opt-in: the claim still bound to it.
    Claim(ClaimToDelete),
}

/// A dead-node candidate: where its node is looked up and what answering it means.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Candidate {
    /// The lookup that decides absence.
    pub(crate) query: NodeQuery,
    /// The action once absence is confirmed.
    pub(crate) target: Answer,
}

/// Whether `pv` is a dead-node candidate under `config` (independent of any node's existence).
pub(crate) fn classify(pv: &PersistentVolume, config: &GoneConfig) -> Result<Candidate, Skip> {
    let spec = pv.spec.as_ref().ok_or(Skip::NotOurDriver)?;
    if spec.csi.as_ref().map(|c| c.driver.as_str()) != Some(config.driver.as_str()) {
        return Err(Skip::NotOurDriver);
    }
    if spec.persistent_volume_reclaim_policy.as_deref() != Some("Delete") {
        return Err(Skip::NotDeletePolicy);
    }
    let has_finalizer = pv
        .metadata
        .finalizers
        .iter()
        .flatten()
        .any(|f| f == names::FINALIZER_PV_DELETION_PROTECTION);
    let deleting = pv.metadata.deletion_timestamp.is_some();
    if deleting && !has_finalizer {
        return Err(Skip::AlreadyHandled);
    }
    let phase = pv.status.as_ref().and_then(|s| s.phase.as_deref());
    let target = match phase {
        Some("Released") => Answer::Volume {
            delete_object: !deleting,
            remove_finalizer: has_finalizer,
        },
        Some("Bound") => {
            let claim = spec.claim_ref.as_ref().filter(|_| config.pvc_cleanup);
            // Every part non-empty: an empty name would address the whole collection.
            let part = |field: fn(&ObjectReference) -> &Option<String>| {
                claim
                    .and_then(|c| field(c).clone())
                    .filter(|v| !v.is_empty())
            };
            match (part(|c| &c.namespace), part(|c| &c.name), part(|c| &c.uid)) {
                (Some(namespace), Some(name), Some(uid)) => Answer::Claim(ClaimToDelete {
                    namespace,
                    name,
                    uid,
                }),
                _ => return Err(Skip::BoundClaimKept),
            }
        }
        _ => return Err(Skip::NotReleased),
    };
    let query = node_query(pv, config.mode, &config.per_node_keys)?;
    Ok(Candidate { query, target })
}

/// Whether `pvc` is the very claim `pv` is bound to: same UID as the PV's `claimRef` and
/// `spec.volumeName` naming the PV (local-static-provisioner's bond check). The shell checks this
/// on a fresh read before deleting a claim for [`Answer::Claim`].
pub(crate) fn claim_bond_matches(pv: &PersistentVolume, pvc: &PersistentVolumeClaim) -> bool {
    let claim_uid = pv
        .spec
        .as_ref()
        .and_then(|s| s.claim_ref.as_ref())
        .and_then(|c| c.uid.as_deref());
    claim_uid.is_some()
        && claim_uid == pvc.metadata.uid.as_deref()
        && bound_volume(pvc).is_some_and(|v| pv.metadata.name.as_deref() == Some(v))
}

#[cfg(test)]
#[path = "candidates_props_tests.rs"]
mod props_tests;
