//! What an intent needs, whichever store holds it (pure): drop it (its PV exists), keep it (its
//! claim still wants the volume), look at the PV live, clean up (delete the volume), forget it
//! (no volume was made), or wait for a gone node. The resolver (`provision::controller::intents::resolve`)
//! performs the outcome.

use k8s_openapi::api::core::v1::PersistentVolumeClaim;

use crate::provision::controller::intents::ledger::Entry;

/// What to do with an entry, from the caches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Resolution {
    /// The PV exists: the volume is accounted for; drop the entry.
    Drop,
    /// The claim still wants the volume: the provisioning controller goes on with it.
    Keep,
    /// The claim is bound to a PV of the entry's name that is not in the cache, or is cached but
    /// not known to hold the entry's volume: whether it does takes a live read
    /// ([`pv_holds_entry`]). In node mode it may be another node's copy (the claim moved while
    /// this node's CreateVolume was in flight), which this node's instance never caches; then
    /// this node's volume is referenced by nothing.
    CheckPv,
    /// The claim is gone, being deleted or bound to another PV: after a live check that no PV of
    /// the entry's name holds the volume, delete it (replaying CreateVolume for its id if
    /// unknown), then drop.
    Cleanup(CleanupCause),
    /// Nothing to delete: no volume was made (node mode, no node selected: see
    /// [`Owner::NoNode`]) and the claim no longer wants one, or (another node's record) the claim
    /// is bound to the recorded volume. Drop the entry without calling the driver.
    Forget,
    /// Node mode: the claim of another node's entry is gone; if that node is gone for good
    /// (confirmed after the deleted-node grace period), its volume went with it: drop the entry.
    AwaitNodeGone(String),
}

/// Why an entry's volume is no longer wanted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum CleanupCause {
    /// No claim with this UID exists.
    ClaimGone,
    /// The claim is being deleted.
    ClaimDeleting,
    /// The claim is bound to another PV.
    BoundElsewhere(String),
    /// The PV of the entry's name holds another volume (another node's copy, or the first of a
    /// driver that answered a repeated CreateVolume with a new id).
    PvOfAnotherVolume,
}

/// Whether a PV of an entry's name holds the entry's volume ([`pv_holds_entry`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Holds {
    /// Same volume id, or nothing tells them apart: never a volume deleted on a guess.
    Yes,
    /// The entry's known id differs from the PV's handle: another volume.
    No,
    /// Node mode, id unknown, and the PV was made by another node's instance: only this node's
    /// driver can tell (a replayed CreateVolume answers this node's id for the name; the same id
    /// as the PV's handle is one volume both reach, as with zonal storage).
    AskDriver,
}

/// Whether `pv`, of `entry`'s name, holds the entry's volume. `own_node`: this instance's node in
/// node mode.
pub(crate) fn pv_holds_entry(
    entry: &Entry,
    pv: &k8s_openapi::api::core::v1::PersistentVolume,
    own_node: Option<&str>,
) -> Holds {
    if let Some(id) = &entry.id {
        let handle = pv
            .spec
            .as_ref()
            .and_then(|s| s.csi.as_ref())
            .map(|c| c.volume_handle.as_str());
        return match handle {
            Some(handle) if handle != id => Holds::No,
            _ => Holds::Yes,
        };
    }
    let recorded = pv
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(crate::names::ANN_NODE_NAME));
    match (own_node, recorded) {
        (Some(own), Some(recorded)) if recorded != own => Holds::AskDriver,
        _ => Holds::Yes,
    }
}

/// Who acts on an entry. Ledger entries are always this instance's (in node mode
/// each node has its own); a claim record in node mode belongs to the claim's selected node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Owner {
    /// This instance.
    Me,
    /// Node mode, no node selected any more: only a reschedule clears it, and it follows a final
    /// answer of CreateVolume, so no volume exists; the next node's instance records anew.
    NoNode,
    /// Node mode: another node's instance.
    Node(String),
}

impl Owner {
    /// The owner of a claim record whose claim selects `selected` (`me`: this instance's node in
    /// node mode).
    pub(crate) fn of_record(me: Option<&str>, selected: Option<&str>) -> Self {
        match (me, selected) {
            (None, _) => Owner::Me,
            (Some(me), Some(node)) if node == me => Owner::Me,
            (Some(_), Some(node)) => Owner::Node(node.to_owned()),
            (Some(_), None) => Owner::NoNode,
        }
    }
}

/// Decides what an entry needs, from who owns it, whether its PV is in the cache (holding the
/// entry's volume, [`pv_holds_entry`]) and its claim as cached (looked up by namespace and name;
/// another UID is another claim).
pub(crate) fn resolve(
    entry: &Entry,
    owner: &Owner,
    pv_cached: bool,
    claim: Option<&PersistentVolumeClaim>,
) -> Resolution {
    if pv_cached {
        return Resolution::Drop;
    }
    let claim = claim.filter(|c| c.metadata.uid.as_deref() == Some(entry.uid.as_str()));
    let cause = match claim {
        None => CleanupCause::ClaimGone,
        Some(claim) if claim.metadata.deletion_timestamp.is_some() => CleanupCause::ClaimDeleting,
        Some(claim) => match crate::model::claim::bound_volume(claim) {
            Some(other) if other != entry.volume => CleanupCause::BoundElsewhere(other.to_owned()),
            Some(_) if *owner == Owner::Me => return Resolution::CheckPv,
            // Bound to the volume it recorded, by another node's instance (or before a
            // reschedule): accounted for, by whichever instance sees it (as the PV controller
            // binds only to a PV that exists).
            Some(_) => return Resolution::Forget,
            None => return Resolution::Keep,
        },
    };
    match (owner, cause) {
        (Owner::Me, cause) => Resolution::Cleanup(cause),
        (Owner::NoNode, _) => Resolution::Forget,
        // Deleted: only if that node is gone does its volume go with it.
        (Owner::Node(node), CleanupCause::ClaimGone | CleanupCause::ClaimDeleting) => {
            Resolution::AwaitNodeGone(node.clone())
        }
        // Bound elsewhere: the node's instance deletes its volume.
        (Owner::Node(_), _) => Resolution::Keep,
    }
}

#[cfg(test)]
#[path = "resolution_tests.rs"]
mod tests;
