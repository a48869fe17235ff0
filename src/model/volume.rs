//! PersistentVolume facts: phase, reclaim policy, finalizer, class, and whether a PV is our
//! driver's (upstream's `isProvisionerForVolume`).

use k8s_openapi::api::core::v1::PersistentVolume;

use super::meta::annotation;
use crate::names;

/// The PV's phase.
pub(crate) fn phase(pv: &PersistentVolume) -> Option<&str> {
    pv.status.as_ref()?.phase.as_deref()
}

/// Whether the PV carries our deletion-protection finalizer.
pub(crate) fn has_our_finalizer(pv: &PersistentVolume) -> bool {
    pv.metadata
        .finalizers
        .as_deref()
        .unwrap_or_default()
        .iter()
        .any(|f| f == names::FINALIZER_PV_DELETION_PROTECTION)
}

/// The UID in the PV's claimRef, when set.
pub(crate) fn claim_uid(pv: &PersistentVolume) -> Option<&str> {
    let claim_ref = pv.spec.as_ref()?.claim_ref.as_ref()?;
    claim_ref.uid.as_deref().filter(|uid| !uid.is_empty())
}

/// The PV's reclaim policy; unset or unknown counts as Retain (the API default, and the safe side).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ReclaimPolicy {
    /// `Delete`.
    Delete,
    /// `Retain`, unset, or unknown.
    Retain,
    /// `Recycle`.
    Recycle,
}

/// The PV's reclaim policy.
pub(crate) fn reclaim_policy(pv: &PersistentVolume) -> ReclaimPolicy {
    let policy = pv
        .spec
        .as_ref()
        .and_then(|s| s.persistent_volume_reclaim_policy.as_deref());
    match policy {
        Some(names::RECLAIM_DELETE) => ReclaimPolicy::Delete,
        Some(names::RECLAIM_RECYCLE) => ReclaimPolicy::Recycle,
        _ => ReclaimPolicy::Retain,
    }
}

/// How a PV relates to our driver.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Ownership {
    /// Ours: provisioned by our driver (`dynamic`), or a static PV of our driver that has been
    /// bound to a claim.
    Ours {
        /// `pv.kubernetes.io/provisioned-by` names our driver (or it was migrated to it).
        dynamic: bool,
    },
    /// A static PV of our driver that has never been bound (or is unbound again): not protected.
    OurDriverUnbound,
    /// Another provisioner's, or not ours at all.
    NotOurs,
}

/// Upstream's `isProvisionerForVolume`, with KEP-2644's rule that a static PV is protected only
/// once bound:
/// - with `pv.kubernetes.io/provisioned-by`: ours iff it names our driver or the in-tree plugin
///   our driver took over, or `pv.kubernetes.io/migrated-to` names our driver;
/// - without (static): ours iff `spec.csi.driver` (or, for in-tree PVs, `migrated-to`) names our
///   driver and the PV is (or was) bound: phase Bound, Released or Failed.
pub(crate) fn ownership(pv: &PersistentVolume, driver_name: &str) -> Ownership {
    let migrated_to = annotation(&pv.metadata, names::ANN_MIGRATED_TO);
    // CSI migration: the in-tree plugin the driver took over is a name the sidecar knows.
    let in_tree = crate::migration::Plugin::of_driver(driver_name).map(|p| p.in_tree_name());
    if let Some(provisioner) = annotation(&pv.metadata, names::ANN_PROVISIONED_BY) {
        return if provisioner == driver_name
            || Some(provisioner) == in_tree
            || migrated_to == Some(driver_name)
        {
            Ownership::Ours { dynamic: true }
        } else {
            Ownership::NotOurs
        };
    }
    let driver = match pv.spec.as_ref().and_then(|s| s.csi.as_ref()) {
        Some(csi) => Some(csi.driver.as_str()),
        None => migrated_to,
    };
    if driver != Some(driver_name) {
        return Ownership::NotOurs;
    }
    let bound = matches!(
        phase(pv),
        Some(names::PV_PHASE_BOUND | names::PV_PHASE_RELEASED | names::PV_PHASE_FAILED)
    );
    if bound {
        Ownership::Ours { dynamic: false }
    } else {
        Ownership::OurDriverUnbound
    }
}

/// Whether this sidecar owns `pv` (see [`ownership`]).
pub(crate) fn is_ours(pv: &PersistentVolume, driver_name: &str) -> bool {
    matches!(ownership(pv, driver_name), Ownership::Ours { .. })
}

/// The PV's StorageClass name: the beta annotation wins over `spec.storageClassName` (lib
/// `GetPersistentVolumeClass`). `None` when neither is set (or both are empty).
pub(crate) fn storage_class_name(pv: &PersistentVolume) -> Option<&str> {
    annotation(&pv.metadata, names::ANN_BETA_STORAGE_CLASS)
        .or_else(|| pv.spec.as_ref()?.storage_class_name.as_deref())
        .filter(|name| !name.is_empty())
}
