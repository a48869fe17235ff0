//! Pure reclaim decisions: for one PV and what the shell looked up about it, the single next step
//! (add/remove our deletion-protection finalizer, DeleteVolume, delete the PV object, wait, skip),
//! and the PV facts it reads (upstream's `isProvisionerForVolume` among them; the audit reads them too).
//!
//! The shell calls [`decide`] on every PV event and after each step it executes, so a PV moves
//! through these states one write at a time. Everything needed to resume after a crash is in the
//! PV itself (finalizer, phase, claimRef, deletionTimestamp), never only in memory:
//!
//! ```text
//!  ours, reclaim Delete, no finalizer, not deleting ──► AddFinalizer
//!  ours, Retain/Recycle, finalizer ──────────────────► RemoveFinalizer(Retain|Recycle)
//!  finalizer, released (phase Released, or claim gone) ─► DeleteVolume ─► (shell) DELETE PV ─► remove finalizer
//!  finalizer, claim still there (even if Terminating) ─► Skip(ClaimInUse): PV protection, wait
//!  deletionTimestamp but no finalizer ─────────────────► Skip: not ours to act on
//! ```
//!
//! DeleteVolume is never "remembered" on the PV: after it succeeds the shell deletes the PV object
//! and removes the finalizer. If the process dies in between, the PV looks exactly as before the
//! call, so DeleteVolume is simply sent again; CSI requires it to be idempotent (OK for a volume
//! that no longer exists). Within one process the shell passes
//! [`ReclaimContext::volume_deleted`] so that the PV update caused by its own DELETE (the
//! deletionTimestamp appearing) does not send a second DeleteVolume (upstream issue 1235): then
//! [`ReclaimAction::DeletePvObject`] finishes the job.

use std::fmt;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;

use crate::model::meta::annotation;
use crate::model::secrets::{SecretError, SecretRef, resolve_provisioner_secret_for_delete};
use crate::model::topology::AffinityError;
use crate::names;

// === The PV's facts (phase, reclaim policy, finalizer, class, ownership) ===

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

// === Inputs ===

/// Whether the claim named by the PV's `claimRef` still exists (see [`claim_state`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ClaimState {
    /// A PVC with that namespace/name (and UID, when the claimRef has one) exists.
    Exists,
    /// No such PVC, or one with another UID. From a cache this must be confirmed by a live GET
    /// before it is passed here: a lagging cache would otherwise get a volume in use deleted.
    Gone,
    /// Not known (cache not synced, the GET failed). Nothing is deleted on an unknown claim.
    Unknown,
}

/// Whether a VolumeAttachment still names the PV (looked up in the shell's index by PV name).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum AttachmentState {
    /// No VolumeAttachment names the PV.
    Detached,
    /// A VolumeAttachment names the PV; `spec.nodeName` of one of them.
    AttachedTo(String),
    /// The index is not synced yet.
    Unknown,
}

/// Which deployment this instance is, and for node deployments whether this node is the one that
/// may delete the volume. The hook for node-deployment ownership rules.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Locality {
    /// Central (controller) deployment: every volume of our driver is ours to delete.
    Central,
    /// Node deployment: `accessible` is upstream's `VolumeIsAccessible(pv.nodeAffinity, own
    /// NodeGetInfo topology)` (true when the PV has no affinity or the driver reports no topology).
    Node {
        /// Whether this node's instance deletes the volume.
        accessible: bool,
    },
    /// Node deployment, and the PV's node affinity cannot be evaluated: a delete failure
    /// (upstream: an event and a retry), never "not on this node", which would be silent.
    InvalidNodeAffinity(AffinityError),
}

/// The StorageClass named by the PV, as far as the shell's store knows.
#[derive(Clone, Debug)]
pub(crate) enum StorageClassLookup {
    /// Found (CSI migration: an in-tree class as the driver's CSI class).
    Found(Arc<StorageClass>),
    /// Not in the store (the shell waits for synced caches before it starts): deleted meanwhile.
    Missing,
    /// CSI migration: the PV's in-tree class cannot be translated for the driver (the error).
    Untranslatable(String),
}

/// The facts [`decide`] reads besides the PV, gathered once per step by the shell (its stores,
/// its memory of the PV, one live read of the claim when [`claim_lookup`] says so) and read as
/// they are.
#[derive(Clone, Debug)]
pub(crate) struct ReclaimContext<'a> {
    /// Our driver name (`GetPluginInfo`).
    pub(crate) driver_name: &'a str,
    /// Whether the PV's claim still exists; only read when [`claim_to_check`] returns a claim.
    pub(crate) claim: ClaimState,
    /// Whether the driver has the `PUBLISH_UNPUBLISH_VOLUME` controller capability (only then are
    /// VolumeAttachments consulted, as upstream).
    pub(crate) publish_unpublish: bool,
    /// VolumeAttachments naming this PV; only read when `publish_unpublish`.
    pub(crate) attachment: AttachmentState,
    /// Central or node deployment.
    pub(crate) locality: Locality,
    /// The PV's StorageClass ([`storage_class_name`]); only read when the PV lacks the
    /// deletion-secret annotations ([`needs_storage_class`]).
    pub(crate) storage_class: StorageClassLookup,
    /// This process already got OK from DeleteVolume for this PV UID (in-memory only).
    pub(crate) volume_deleted: bool,
    /// CSI migration: an in-tree PV of the plugin our driver took over, as the CSI PV it
    /// translates to (decided on instead of the PV), or the translation's error
    /// ([`crate::migration::as_csi`]); `None` for any other PV.
    pub(crate) translated: Option<Result<PersistentVolume, String>>,
}

// === Outputs ===

/// The one next step for a PV.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum ReclaimAction {
    /// Add our deletion-protection finalizer (a patch; see `k8s::patch::add_finalizer`).
    AddFinalizer,
    /// Remove our finalizer without touching the backend volume.
    RemoveFinalizer(RemoveReason),
    /// Call DeleteVolume; on OK delete the PV object (UID precondition) and remove our finalizer.
    DeleteVolume {
        /// `spec.csi.volumeHandle`.
        volume_id: String,
        /// Which provisioner secret to send.
        secrets: DeletionSecrets,
    },
    /// DeleteVolume already returned OK in this process: delete the PV object (only if
    /// `issue_delete`, i.e. it has no deletionTimestamp yet), then remove our finalizer.
    DeletePvObject {
        /// Whether the PV still needs a DELETE call.
        issue_delete: bool,
    },
    /// A VolumeAttachment still names the PV: retry later. Emit one event per waiting episode
    /// ([`detach_message`], [`wait_for_detach_episode`]), not one per retry.
    WaitForDetach {
        /// `spec.nodeName` of the VolumeAttachment.
        node: String,
    },
    /// Deleting the volume failed before reaching the driver: VolumeFailedDelete event with the
    /// error's text, retry with backoff (the StorageClass may be fixed meanwhile).
    Fail(ReclaimError),
    /// Nothing to do now.
    Skip(SkipReason),
}

/// Why our finalizer is removed without deleting the volume.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RemoveReason {
    /// Reclaim policy Retain (or unset, which the API defaults to Retain): the volume is kept.
    ReclaimRetain,
    /// Reclaim policy Recycle: never deleted by a provisioner.
    ReclaimRecycle,
    /// A PV of our driver that is no longer ours to protect: a static PV that is not bound any
    /// more (KEP-2644 protects only bound static PVs). Only PVs no other provisioner can claim
    /// (no `provisioned-by`, our driver) lose the finalizer this way: the finalizer name is shared
    /// by every external-provisioner in the cluster, so another driver's PV is never touched.
    NotOursAnyMore,
}

/// Why nothing is done.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SkipReason {
    /// Another provisioner's PV, or not a CSI PV of our driver.
    NotOurs,
    /// A static PV of our driver that has never been bound: no finalizer (KEP-2644).
    NeverBound,
    /// Reclaim policy is not Delete and our finalizer is already gone.
    NotDeletePolicy,
    /// Being deleted without our finalizer: already handled, or never protected by us.
    DeletingWithoutFinalizer,
    /// Its claim still exists: never deleted from the backend, even while the PV is Terminating
    /// (it waits until released).
    ClaimInUse {
        /// The PV already has a deletionTimestamp (deleted before its PVC).
        deleting: bool,
    },
    /// Not released and no claim to wait for (Available, Pending without claim, Failed).
    NotReleased,
    /// The claim's existence is unknown; retry.
    ClaimUnknown,
    /// Node deployment: another node's instance deletes this volume.
    NotOnThisNode,
    /// The VolumeAttachment index is not synced; retry.
    AttachmentsUnknown,
    /// An in-tree volume migrated to our driver whose source is another plugin's than the one
    /// our driver took over: nothing translates it, its volume cannot be deleted here, so the PV
    /// gets no finalizer (it would stay Terminating forever). A volume of that plugin whose
    /// handle does not translate is not skipped: it fails with the translation's error.
    MigrationUnsupported,
}

/// The provisioner secret for DeleteVolume (upstream `handleSecretsForDeletion`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum DeletionSecrets {
    /// Send no secret.
    None,
    /// Fetch this Secret and send its data. If the fetch fails, log it and delete without
    /// secrets (upstream: the secret may have been deleted already).
    Fetch(SecretRef),
    /// Delete without secrets, and log this warning (upstream logs it too).
    NoneWithWarning(SecretWarning),
}

/// Why a PV without deletion-secret annotations is deleted without secrets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum SecretWarning {
    /// Its StorageClass no longer exists.
    StorageClassMissing {
        /// The class name.
        class: String,
    },
    /// It has no claimRef to resolve the templates with.
    NoClaimRef,
}

impl fmt::Display for SecretWarning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::StorageClassMissing { class } => write!(
                f,
                "failed to get storageclass: {class}, proceeding to delete without secrets"
            ),
            Self::NoClaimRef => f.write_str(
                "claim reference does not exist in volume, proceeding to delete without secrets",
            ),
        }
    }
}

/// Why the volume cannot be deleted before even calling the driver. `Display` is the event text.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum ReclaimError {
    /// The PV has no `spec.csi` (upstream's text).
    #[error("invalid CSI PV")]
    InvalidCsiPv,
    /// An in-tree PV migrated to our driver whose in-tree plugin is not the one our driver took
    /// over: nothing translates it.
    #[error(
        "invalid CSI PV: in-tree volume migrated to {driver} cannot be deleted, {driver} is not the CSI driver of its in-tree plugin"
    )]
    MigrationUnsupported {
        /// Our driver name.
        driver: String,
    },
    /// CSI migration: the in-tree PV or its class cannot be translated (the translation's text,
    /// as upstream reports it).
    #[error("{0}")]
    Translation(String),
    /// Node mode: the PV's node affinity cannot be evaluated against our topology (upstream's
    /// text).
    #[error("checking volume affinity failed: {0}")]
    NodeAffinity(AffinityError),
    /// The StorageClass's provisioner secret templates cannot be resolved (upstream's text).
    #[error("failed to get secretreference for volume {pv}: {source}")]
    Secret {
        /// PV name.
        pv: String,
        /// The template error.
        #[source]
        source: SecretError,
    },
}

/// Whether `pv` is a volume of ours whose backend volume is still to be deleted: it carries our
/// deletion-protection finalizer, its reclaim policy is Delete, and it is released (or failed), or
/// being deleted (perhaps still bound: PV protection keeps it until it is released). A count of
/// these that does not come down is a deletion that is stuck (detach, driver errors).
pub(crate) fn awaits_deletion(pv: &PersistentVolume, driver_name: &str) -> bool {
    has_our_finalizer(pv)
        && reclaim_policy(pv) == ReclaimPolicy::Delete
        && is_ours(pv, driver_name)
        && (pv.metadata.deletion_timestamp.is_some()
            || matches!(
                phase(pv),
                Some(names::PV_PHASE_RELEASED | names::PV_PHASE_FAILED)
            ))
}

/// The claim whose existence decides whether `pv` counts as released although its phase is not
/// `Released` yet: `(namespace, name, uid)` of a claimRef carrying a UID. `None`: nothing to look
/// up (phase already Released, no claim UID, or Failed and not being deleted).
pub(crate) fn claim_to_check(pv: &PersistentVolume) -> Option<(&str, &str, &str)> {
    match phase(pv) {
        Some(names::PV_PHASE_RELEASED) => return None,
        Some(names::PV_PHASE_FAILED) if pv.metadata.deletion_timestamp.is_none() => return None,
        _ => {}
    }
    let claim_ref = pv.spec.as_ref()?.claim_ref.as_ref()?;
    Some((
        claim_ref.namespace.as_deref().unwrap_or_default(),
        claim_ref.name.as_deref()?,
        claim_uid(pv)?,
    ))
}

/// How the reclaimer learns whether a PV's claim exists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ClaimLookup {
    /// The cache answers.
    Known(ClaimState),
    /// Absent from the cache while the PV is not being deleted, for the first time: the PV
    /// controller marks the PV `Released` moments after its claim goes, and that update answers
    /// for free, so the claim reads as [`ClaimState::Unknown`] until then.
    WaitForRelease,
    /// Absent again (or the PV is being deleted): a live read confirms, since a lagging cache
    /// must never get a volume in use deleted.
    ReadLive,
}

/// [`ClaimLookup`] for `pv` whose claim the cache has as `cached`; `absence_seen`: an earlier
/// look found it absent already.
pub(crate) fn claim_lookup(
    pv: &PersistentVolume,
    cached: Option<&PersistentVolumeClaim>,
    absence_seen: bool,
) -> ClaimLookup {
    match claim_state(pv, cached) {
        ClaimState::Exists => ClaimLookup::Known(ClaimState::Exists),
        _ if pv.metadata.deletion_timestamp.is_none() && !absence_seen => {
            ClaimLookup::WaitForRelease
        }
        _ => ClaimLookup::ReadLive,
    }
}

/// [`ClaimState`] from a lookup of [`claim_to_check`]'s claim: `found` is the PVC with that
/// namespace/name, if any. A PVC re-created under the same name (another UID) is not our claim.
pub(crate) fn claim_state(
    pv: &PersistentVolume,
    found: Option<&PersistentVolumeClaim>,
) -> ClaimState {
    let ours = found.is_some_and(|found| {
        claim_uid(pv).is_none_or(|want| found.metadata.uid.as_deref() == Some(want))
    });
    if ours {
        ClaimState::Exists
    } else {
        ClaimState::Gone
    }
}

/// Whether the PV's claim is gone, so its reclaim policy applies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Release {
    Released,
    ClaimInUse,
    NotReleased,
    Unknown,
}

fn release(pv: &PersistentVolume, claim: ClaimState) -> Release {
    let deleting = pv.metadata.deletion_timestamp.is_some();
    match phase(pv) {
        Some(names::PV_PHASE_RELEASED) => return Release::Released,
        // Upstream never deletes a Failed PV: an admin has to look at it. Once the admin deletes
        // it, the rules below apply, so it does not stay Terminating forever.
        Some(names::PV_PHASE_FAILED) if !deleting => return Release::NotReleased,
        _ => {}
    }
    if claim_to_check(pv).is_some() {
        // Bound to (or created for) a specific claim: released iff that claim is gone, even if the
        // PV controller has not updated the phase yet.
        return match claim {
            ClaimState::Exists => Release::ClaimInUse,
            ClaimState::Gone => Release::Released,
            ClaimState::Unknown => Release::Unknown,
        };
    }
    let has_claim_ref = pv.spec.as_ref().is_some_and(|s| s.claim_ref.is_some());
    if has_claim_ref {
        // Pre-bound to a claim by name only: waiting for that claim.
        return Release::ClaimInUse;
    }
    // No claim at all. Nothing can be using it (pods reach PVs only through claims), so once an
    // admin deletes it the reclaim policy applies, instead of leaving it Terminating forever.
    if deleting {
        Release::Released
    } else {
        Release::NotReleased
    }
}

/// Upstream `handleSecretsForDeletion`, minus the fetch.
pub(crate) fn deletion_secrets(
    pv: &PersistentVolume,
    storage_class: &StorageClassLookup,
) -> Result<DeletionSecrets, ReclaimError> {
    let pv_name = pv.metadata.name.as_deref().unwrap_or_default();
    let name = annotation(&pv.metadata, names::ANN_DELETION_SECRET_NAME);
    let namespace = annotation(&pv.metadata, names::ANN_DELETION_SECRET_NAMESPACE);
    if let (Some(name), Some(namespace)) = (name, namespace) {
        // Both annotations present: they are the answer, whatever the class says now. A half-empty
        // pair means no secret, as upstream.
        return Ok(if name.is_empty() || namespace.is_empty() {
            DeletionSecrets::None
        } else {
            DeletionSecrets::Fetch(SecretRef::new(name, namespace))
        });
    }
    let Some(class_name) = storage_class_name(pv) else {
        return Ok(DeletionSecrets::None);
    };
    let class = match storage_class {
        StorageClassLookup::Found(class) => class,
        StorageClassLookup::Missing => {
            return Ok(DeletionSecrets::NoneWithWarning(
                SecretWarning::StorageClassMissing {
                    class: class_name.to_owned(),
                },
            ));
        }
        StorageClassLookup::Untranslatable(e) => {
            return Err(ReclaimError::Translation(e.clone()));
        }
    };
    let Some(claim_ref) = pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref()) else {
        return Ok(DeletionSecrets::NoneWithWarning(SecretWarning::NoClaimRef));
    };
    let empty = Default::default();
    let params = class.parameters.as_ref().unwrap_or(&empty);
    let resolved = resolve_provisioner_secret_for_delete(
        params,
        pv_name,
        claim_ref.name.as_deref().unwrap_or_default(),
        claim_ref.namespace.as_deref().unwrap_or_default(),
    )
    .map_err(|source| ReclaimError::Secret {
        pv: pv_name.to_owned(),
        source,
    })?;
    Ok(resolved.map_or(DeletionSecrets::None, DeletionSecrets::Fetch))
}

/// The next step for `pv`.
pub(crate) fn decide(pv: &PersistentVolume, ctx: &ReclaimContext<'_>) -> ReclaimAction {
    // Whose PV it is is read on the PV as written, as upstream reads it: a translated in-tree PV
    // names our driver in `spec.csi`, which would make a static one without provisioned-by or
    // migrated-to (never the driver's, for upstream) ours, and its volume deleted.
    let owner = ownership(pv, ctx.driver_name);
    // CSI migration: the translated PV is the one decided on; without one, its error is.
    let (pv, translation_error) = match &ctx.translated {
        Some(Ok(csi)) => (csi, None),
        Some(Err(e)) => (pv, Some(e.as_str())),
        None => (pv, None),
    };
    let has_finalizer = has_our_finalizer(pv);
    let deleting = pv.metadata.deletion_timestamp.is_some();

    match owner {
        Ownership::Ours { .. } => {}
        Ownership::OurDriverUnbound if has_finalizer => {
            return ReclaimAction::RemoveFinalizer(RemoveReason::NotOursAnyMore);
        }
        Ownership::OurDriverUnbound => return ReclaimAction::Skip(SkipReason::NeverBound),
        Ownership::NotOurs => return ReclaimAction::Skip(SkipReason::NotOurs),
    }

    match reclaim_policy(pv) {
        ReclaimPolicy::Delete => {}
        ReclaimPolicy::Retain if has_finalizer => {
            return ReclaimAction::RemoveFinalizer(RemoveReason::ReclaimRetain);
        }
        ReclaimPolicy::Recycle if has_finalizer => {
            return ReclaimAction::RemoveFinalizer(RemoveReason::ReclaimRecycle);
        }
        ReclaimPolicy::Retain | ReclaimPolicy::Recycle => {
            return ReclaimAction::Skip(SkipReason::NotDeletePolicy);
        }
    }

    if !has_finalizer {
        // An in-tree PV reaches here untranslated when it is not of the plugin our driver took
        // over: nothing here can ever delete its volume, so a finalizer would only pin the PV (one
        // upstream already added is kept: see below). One of that plugin whose handle does not
        // translate is protected as upstream protects it: its deletion then fails in the open
        // (event, metric) and is retried, instead of the PV sitting Released unexplained.
        let csi = pv.spec.as_ref().is_some_and(|s| s.csi.is_some());
        if !csi && translation_error.is_none() {
            return ReclaimAction::Skip(SkipReason::MigrationUnsupported);
        }
        // Protect first, even a PV that is already Released: if an admin deleted it while we wait
        // (for the driver, a detach...), the volume would otherwise leak.
        return if deleting {
            ReclaimAction::Skip(SkipReason::DeletingWithoutFinalizer)
        } else {
            ReclaimAction::AddFinalizer
        };
    }

    match release(pv, ctx.claim) {
        Release::Released => {}
        Release::ClaimInUse => return ReclaimAction::Skip(SkipReason::ClaimInUse { deleting }),
        Release::NotReleased => return ReclaimAction::Skip(SkipReason::NotReleased),
        Release::Unknown => return ReclaimAction::Skip(SkipReason::ClaimUnknown),
    }

    if ctx.volume_deleted {
        return ReclaimAction::DeletePvObject {
            issue_delete: !deleting,
        };
    }
    // Upstream translates before it looks at the node: an untranslatable PV fails in the open on
    // every instance, rather than being skipped as no instance's (its in-tree affinity names no
    // segment a driver reports).
    if let Some(e) = translation_error {
        return ReclaimAction::Fail(ReclaimError::Translation(e.to_owned()));
    }
    match &ctx.locality {
        Locality::Node { accessible: false } => {
            return ReclaimAction::Skip(SkipReason::NotOnThisNode);
        }
        Locality::InvalidNodeAffinity(error) => {
            return ReclaimAction::Fail(ReclaimError::NodeAffinity(error.clone()));
        }
        Locality::Central | Locality::Node { accessible: true } => {}
    }
    let Some(csi) = pv.spec.as_ref().and_then(|s| s.csi.as_ref()) else {
        return ReclaimAction::Fail(
            if annotation(&pv.metadata, names::ANN_MIGRATED_TO).is_some() {
                ReclaimError::MigrationUnsupported {
                    driver: ctx.driver_name.to_owned(),
                }
            } else {
                ReclaimError::InvalidCsiPv
            },
        );
    };
    let secrets = match deletion_secrets(pv, &ctx.storage_class) {
        Ok(secrets) => secrets,
        Err(err) => return ReclaimAction::Fail(err),
    };
    if ctx.publish_unpublish {
        match &ctx.attachment {
            AttachmentState::Detached => {}
            AttachmentState::AttachedTo(node) => {
                return ReclaimAction::WaitForDetach { node: node.clone() };
            }
            AttachmentState::Unknown => {
                return ReclaimAction::Skip(SkipReason::AttachmentsUnknown);
            }
        }
    }
    ReclaimAction::DeleteVolume {
        volume_id: csi.volume_handle.clone(),
        secrets,
    }
}

/// Upstream's text for a PV that waits for detach (the VolumeFailedDelete event message).
pub(crate) fn detach_message(pv_name: &str, node: &str) -> String {
    format!("persistentvolume {pv_name} is still attached to node {node}")
}

/// Event dedupe key of one "waiting for detach" episode of a PV (by UID: a re-created PV of the
/// same name starts a new episode). End it when the PV is deleted or the wait is over.
pub(crate) fn wait_for_detach_episode(pv: &PersistentVolume) -> String {
    format!(
        "wait-for-detach/{}",
        pv.metadata
            .uid
            .as_deref()
            .or(pv.metadata.name.as_deref())
            .unwrap_or_default()
    )
}

#[cfg(test)]
#[path = "plan_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "deletion_secrets_props_tests.rs"]
mod deletion_secrets_props_tests;

#[cfg(test)]
#[path = "plan_secrets_tests.rs"]
mod secrets_tests;

#[cfg(test)]
#[path = "plan_props_tests.rs"]
mod props_tests;
