//! PersistentVolumeClaim facts: the selected node, the class, and which provisioner it names.

use k8s_openapi::api::core::v1::PersistentVolumeClaim;

use super::meta::{annotation, non_empty_annotation};
use crate::names;

/// The non-empty `volume.kubernetes.io/selected-node` of a claim.
pub(crate) fn selected_node(pvc: &PersistentVolumeClaim) -> Option<&str> {
    non_empty_annotation(&pvc.metadata, names::ANN_SELECTED_NODE)
}

/// The claim's class: the beta annotation wins over `spec.storageClassName` (lib
/// `GetPersistentVolumeClaimClass`, where a present beta annotation wins even when empty); `None`
/// when neither names one.
pub(crate) fn claim_class_name(pvc: &PersistentVolumeClaim) -> Option<&str> {
    annotation(&pvc.metadata, names::ANN_BETA_STORAGE_CLASS)
        .or(pvc.spec.as_ref()?.storage_class_name.as_deref())
        .filter(|c| !c.is_empty())
}

/// The provisioner the claim names: `volume.kubernetes.io/storage-provisioner`, else the beta key.
pub(crate) fn provisioner(pvc: &PersistentVolumeClaim) -> Option<&str> {
    annotation(&pvc.metadata, names::ANN_STORAGE_PROVISIONER)
        .or_else(|| annotation(&pvc.metadata, names::ANN_BETA_STORAGE_PROVISIONER))
}

/// Whether the claim is `driver`'s to provision: it names the driver as its provisioner, or was
/// migrated to it (`pv.kubernetes.io/migrated-to`); and, as upstream's library requires, the
/// provisioner it names is one the sidecar knows: the driver, or the in-tree plugin the driver
/// took over (CSI migration).
pub(crate) fn is_ours(pvc: &PersistentVolumeClaim, driver: &str) -> bool {
    let named = provisioner(pvc);
    let in_tree = crate::migration::Plugin::of_driver(driver).map(|p| p.in_tree_name());
    let known = named.is_some_and(|p| p == driver || Some(p) == in_tree);
    known
        && (named == Some(driver)
            || non_empty_annotation(&pvc.metadata, names::ANN_MIGRATED_TO) == Some(driver))
}

/// The PV the claim is bound to (`spec.volumeName`), when set.
pub(crate) fn bound_volume(pvc: &PersistentVolumeClaim) -> Option<&str> {
    pvc.spec
        .as_ref()?
        .volume_name
        .as_deref()
        .filter(|v| !v.is_empty())
}

/// `(since, from)` of an unused claim: Kubernetes' `Unused` condition where present (then our
/// annotation is ignored), else our annotation.
pub(crate) fn unused_since(
    claim: &PersistentVolumeClaim,
) -> Option<(jiff::Timestamp, &'static str)> {
    let condition = claim
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == names::CONDITION_UNUSED));
    if let Some(c) = condition {
        return (c.status == "True")
            .then(|| c.last_transition_time.as_ref().map(|t| (t.0, "condition")))
            .flatten();
    }
    let since = annotation(&claim.metadata, names::ANN_UNUSED_SINCE)?;
    Some((since.parse().ok()?, "annotation"))
}

/// Whether the claim `read` at the start of a reconcile is gone or being deleted by now, as `now`
/// (its name's current cache entry) says: absent, replaced by a claim of another UID, or carrying
/// a deletion timestamp.
pub(crate) fn abandoned_since(
    read: &PersistentVolumeClaim,
    now: Option<&PersistentVolumeClaim>,
) -> bool {
    now.is_none_or(|c| {
        c.metadata.uid != read.metadata.uid || c.metadata.deletion_timestamp.is_some()
    })
}

#[cfg(test)]
#[path = "claim_props_tests.rs"]
mod props_tests;

#[cfg(test)]
#[path = "claim_tests.rs"]
mod tests;
