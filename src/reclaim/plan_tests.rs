//! Tests for `reclaim::plan`: every upstream delete/ownership/finalizer case (reference §14.4 and
//! §14.11: TestDelete, TestDeleteMigration, TestShouldDelete, TestShouldDeleteWithFinalizer,
//! TestIsProvisionerForVolume, the finalizer cases of TestController) and the KEP-2644 orders,
//! as decisions. Upstream's "nil PV" cases have no equivalent: a `&PersistentVolume` is never nil.

use k8s_openapi::api::core::v1::PersistentVolume;
use k8s_openapi::api::storage::v1::StorageClass;

use super::*;
use crate::names::FINALIZER_PV_DELETION_PROTECTION as OURS;
use crate::testing::{DRIVER, PvBuilder, pv, pvc, sc};

const OTHER: &str = "other.csi.test";

pub(super) fn ctx() -> ReclaimContext<'static> {
    ReclaimContext {
        driver_name: DRIVER,
        claim: ClaimState::Unknown,
        publish_unpublish: false,
        attachment: AttachmentState::Detached,
        locality: Locality::Central,
        storage_class: StorageClassLookup::Missing,
        volume_deleted: false,
        translated: None,
    }
}

/// A PV our driver provisioned for claim ns/c, as a sidecar older than the deletion-secret
/// annotations wrote it.
pub(super) fn old_dynamic() -> PvBuilder {
    pv("pv-1")
        .provisioned_by(DRIVER)
        .reclaim("Delete")
        .class("fast")
        .claim_ref("ns", "c", "uid-c")
}

/// A PV our driver provisioned for claim ns/c, as we write it (deletion-secret pair empty).
pub(super) fn dynamic() -> PvBuilder {
    old_dynamic().deletion_secret("", "")
}

fn bound() -> PvBuilder {
    dynamic().phase("Bound").finalizer(OURS)
}

pub(super) fn released() -> PvBuilder {
    dynamic().phase("Released").finalizer(OURS)
}

pub(super) fn delete_volume(secrets: DeletionSecrets) -> ReclaimAction {
    ReclaimAction::DeleteVolume {
        volume_id: "handle-pv-1".to_owned(),
        secrets,
    }
}

pub(super) fn decide_with(volume: &PersistentVolume, ctx: &ReclaimContext<'_>) -> ReclaimAction {
    decide(volume, ctx)
}

fn d(volume: impl Into<PersistentVolume>) -> ReclaimAction {
    decide_with(&volume.into(), &ctx())
}

pub(super) fn class_with(params: &[(&str, &str)]) -> StorageClass {
    params
        .iter()
        .fold(sc("fast"), |b, (k, v)| b.param(k, v))
        .build()
}

// === Ownership: TestIsProvisionerForVolume ===

#[test]
fn a_pv_provisioned_by_our_driver_is_ours_whatever_its_source() {
    // "known dynamically provisioned csi volume" / "... in-tree volume" / "... in-tree migrated".
    assert!(is_ours(&dynamic().phase("Bound").build(), DRIVER));
    assert!(is_ours(
        &pv("pv-1")
            .no_csi()
            .provisioned_by(DRIVER)
            .phase("Available")
            .build(),
        DRIVER
    ));
    assert!(is_ours(
        &pv("pv-1")
            .no_csi()
            .provisioned_by(DRIVER)
            .annotation(names::ANN_MIGRATED_TO, DRIVER)
            .build(),
        DRIVER
    ));
}

#[test]
fn a_pv_provisioned_by_another_driver_is_not_ours_even_if_its_csi_driver_is() {
    // "unknown dynamically provisioned csi volume" / "... in-tree volume" / "... migrated volume".
    assert!(!is_ours(
        &pv("pv-1")
            .driver(OTHER)
            .provisioned_by(OTHER)
            .phase("Bound")
            .build(),
        DRIVER
    ));
    assert!(!is_ours(
        &pv("pv-1")
            .no_csi()
            .provisioned_by("kubernetes.io/gce-pd")
            .build(),
        DRIVER
    ));
    assert!(!is_ours(
        &pv("pv-1")
            .no_csi()
            .provisioned_by("kubernetes.io/gce-pd")
            .annotation(names::ANN_MIGRATED_TO, OTHER)
            .build(),
        DRIVER
    ));
    // provisioned-by decides; spec.csi.driver is not consulted then.
    assert!(!is_ours(
        &pv("pv-1").provisioned_by(OTHER).phase("Bound").build(),
        DRIVER
    ));
}

#[test]
fn an_in_tree_pv_migrated_to_our_driver_is_ours() {
    // "migrated to" (TestShouldDelete) and "known dynamically provisioned in-tree migrated volume".
    let migrated = pv("pv-1")
        .no_csi()
        .provisioned_by("kubernetes.io/gce-pd")
        .annotation(names::ANN_MIGRATED_TO, DRIVER)
        .build();
    assert_eq!(
        ownership(&migrated, DRIVER),
        Ownership::Ours { dynamic: true }
    );
}

#[test]
fn a_static_csi_pv_of_our_driver_is_ours_once_bound() {
    // "known statically provisioned csi volume" (Bound) / "unknown statically provisioned csi volume".
    let bound = pv("pv-1")
        .phase("Bound")
        .claim_ref("ns", "c", "uid-c")
        .build();
    assert_eq!(
        ownership(&bound, DRIVER),
        Ownership::Ours { dynamic: false }
    );
    assert!(!is_ours(
        &pv("pv-1").driver(OTHER).phase("Bound").build(),
        DRIVER
    ));
    for phase in ["Released", "Failed"] {
        assert!(is_ours(&pv("pv-1").phase(phase).build(), DRIVER), "{phase}");
    }
}

#[test]
fn a_static_pv_that_was_never_bound_is_not_ours_and_gets_no_finalizer() {
    // KEP-2644; upstream would protect it already. Pre-bound to a claim by name only, or free.
    for volume in [
        pv("pv-1").reclaim("Delete").phase("Available").build(),
        pv("pv-1").reclaim("Delete").phase("Pending").build(),
        pv("pv-1").reclaim("Delete").build(),
        {
            let mut v = pv("pv-1").reclaim("Delete").phase("Available").build();
            if let Some(spec) = v.spec.as_mut() {
                spec.claim_ref = Some(k8s_openapi::api::core::v1::ObjectReference {
                    namespace: Some("ns".to_owned()),
                    name: Some("later".to_owned()),
                    ..Default::default()
                });
            }
            v
        },
    ] {
        assert_eq!(ownership(&volume, DRIVER), Ownership::OurDriverUnbound);
        assert_eq!(
            decide_with(&volume, &ctx()),
            ReclaimAction::Skip(SkipReason::NeverBound)
        );
    }
}

#[test]
fn a_static_in_tree_pv_counts_only_when_migrated_to_our_driver_and_bound() {
    // "statically provisioned in-tree volume always return false", "{known|unknown} statically
    // provisioned in-tree migrate volume" (upstream: known is ours even while Available).
    let plain = pv("pv-1").no_csi().phase("Bound").build();
    assert!(!is_ours(&plain, DRIVER));
    let migrated = pv("pv-1")
        .no_csi()
        .annotation(names::ANN_MIGRATED_TO, DRIVER);
    assert!(is_ours(&migrated.clone().phase("Bound").build(), DRIVER));
    assert!(!is_ours(&migrated.phase("Available").build(), DRIVER));
    let elsewhere = pv("pv-1")
        .no_csi()
        .annotation(names::ANN_MIGRATED_TO, OTHER)
        .phase("Bound");
    assert!(!is_ours(&elsewhere.build(), DRIVER));
}

// === Finalizer upkeep (TestController finalizer cases) ===

#[test]
fn the_finalizer_is_added_to_our_bound_pvs_with_delete_policy() {
    // Upgrade from a sidecar without the finalizer; "ensure finalizer is added on statically
    // provisioned CSI volumes if it is in a Bound state".
    assert_eq!(d(dynamic().phase("Bound")), ReclaimAction::AddFinalizer);
    let static_bound = pv("pv-1")
        .reclaim("Delete")
        .phase("Bound")
        .claim_ref("ns", "c", "uid-c");
    assert_eq!(d(static_bound), ReclaimAction::AddFinalizer);
}

#[test]
fn in_tree_volumes_our_driver_cannot_translate_get_no_finalizer() {
    // Upstream adds it ("ensure finalizer is added on statically provisioned migrated in-tree
    // volumes if bound"); to a PV migrated to a driver that did not take over its in-tree plugin
    // we do not: nothing translates it, and a finalizer we cannot honour would leave the PV
    // Terminating forever.
    let volume = pv("pv-1")
        .no_csi()
        .reclaim("Delete")
        .annotation(names::ANN_MIGRATED_TO, DRIVER)
        .phase("Bound");
    assert_eq!(
        d(volume.clone()),
        ReclaimAction::Skip(SkipReason::MigrationUnsupported)
    );
    // One upstream added stays, and the deletion reports why it cannot proceed.
    let released = volume
        .phase("Released")
        .finalizer(OURS)
        .claim_ref("ns", "c", "uid-c");
    assert!(matches!(
        d(released),
        ReclaimAction::Fail(ReclaimError::MigrationUnsupported { .. })
    ));
}

#[test]
fn a_dynamic_pv_is_protected_before_it_is_bound() {
    assert_eq!(d(dynamic().phase("Available")), ReclaimAction::AddFinalizer);
    assert_eq!(d(dynamic()), ReclaimAction::AddFinalizer);
}

#[test]
fn a_released_pv_without_the_finalizer_is_protected_before_its_volume_is_deleted() {
    // Upstream deletes at once ("should delete", "nil deletion timestamp"); we add the finalizer
    // first so an admin deleting the PV while we wait cannot leak the volume. Next step deletes.
    let unprotected = dynamic().phase("Released");
    assert_eq!(d(unprotected.clone()), ReclaimAction::AddFinalizer);
    assert_eq!(
        d(unprotected.finalizer(OURS)),
        delete_volume(DeletionSecrets::None)
    );
}

#[test]
fn the_finalizer_is_not_added_while_the_pv_is_being_deleted_and_the_volume_is_kept() {
    // "ensure finalizer is not added if the volume is under deletion, also ensures that volume is
    // not deleted" / TestShouldDelete "non-nil deletion timestamp".
    for phase in ["Released", "Bound"] {
        assert_eq!(
            d(dynamic().phase(phase).deleting()),
            ReclaimAction::Skip(SkipReason::DeletingWithoutFinalizer),
            "{phase}"
        );
    }
}

#[test]
fn retain_or_recycle_removes_our_finalizer_and_nothing_else() {
    // "ensure finalizer is removed if the reclaim policy is Retain or Recycle".
    for (policy, reason) in [
        ("Retain", RemoveReason::ReclaimRetain),
        ("Recycle", RemoveReason::ReclaimRecycle),
    ] {
        for volume in [
            bound().reclaim(policy),
            released().reclaim(policy),
            released().reclaim(policy).deleting(),
        ] {
            assert_eq!(
                d(volume),
                ReclaimAction::RemoveFinalizer(reason),
                "{policy}"
            );
        }
        assert_eq!(
            d(dynamic().phase("Released").reclaim(policy)),
            ReclaimAction::Skip(SkipReason::NotDeletePolicy)
        );
    }
}

#[test]
fn an_unset_reclaim_policy_is_treated_as_retain() {
    let mut volume = released().build();
    if let Some(spec) = volume.spec.as_mut() {
        spec.persistent_volume_reclaim_policy = None;
    }
    assert_eq!(
        decide_with(&volume, &ctx()),
        ReclaimAction::RemoveFinalizer(RemoveReason::ReclaimRetain)
    );
}

#[test]
fn our_finalizer_is_removed_from_a_static_pv_of_our_driver_that_is_unbound_again() {
    // The admin removed the claimRef to reuse the volume: KEP-2644 protects bound static PVs only.
    let volume = pv("pv-1")
        .reclaim("Delete")
        .phase("Available")
        .finalizer(OURS);
    assert_eq!(
        d(volume.clone()),
        ReclaimAction::RemoveFinalizer(RemoveReason::NotOursAnyMore)
    );
    assert_eq!(
        d(volume.deleting()),
        ReclaimAction::RemoveFinalizer(RemoveReason::NotOursAnyMore)
    );
}

#[test]
fn the_shared_finalizer_on_another_drivers_pv_is_never_touched() {
    // Every external-provisioner uses the same finalizer name.
    for volume in [
        pv("pv-1")
            .driver(OTHER)
            .provisioned_by(OTHER)
            .finalizer(OURS),
        pv("pv-1")
            .provisioned_by(OTHER)
            .finalizer(OURS)
            .phase("Available"),
        pv("pv-1")
            .driver(OTHER)
            .finalizer(OURS)
            .phase("Released")
            .deleting(),
    ] {
        assert_eq!(
            d(volume.reclaim("Retain")),
            ReclaimAction::Skip(SkipReason::NotOurs)
        );
    }
}

// === When the volume is deleted: TestShouldDelete, TestShouldDeleteWithFinalizer ===

#[test]
fn a_released_pv_with_our_finalizer_is_deleted_with_or_without_deletion_timestamp() {
    // "should delete with finalizer present and (no|with) deletionTimestamp", "ensure volume with
    // finalizer is deleted if it is in a Released state and reclaim policy is Delete (and already
    // under deletion)".
    assert_eq!(d(released()), delete_volume(DeletionSecrets::None));
    assert_eq!(
        d(released().deleting()),
        delete_volume(DeletionSecrets::None)
    );
}

#[test]
fn a_bound_pv_is_never_deleted_even_with_a_deletion_timestamp() {
    // "should not delete when volume still bound and the finalizer exists with no
    // deletionTimestamp", "don't delete volume-1 because it's still bound", PV protection.
    let claim_exists = ReclaimContext {
        claim: ClaimState::Exists,
        ..ctx()
    };
    assert_eq!(
        decide_with(&bound().build(), &claim_exists),
        ReclaimAction::Skip(SkipReason::ClaimInUse { deleting: false })
    );
    assert_eq!(
        decide_with(&bound().deleting().build(), &claim_exists),
        ReclaimAction::Skip(SkipReason::ClaimInUse { deleting: true })
    );
}

#[test]
fn a_non_delete_reclaim_policy_never_deletes() {
    // "non-delete reclaim policy", "should not delete for non-delete reclaim policy", "don't
    // delete volume-1 because its reclaim policy is not delete".
    let retained = dynamic().phase("Released").reclaim("Retain");
    assert_eq!(
        d(retained),
        ReclaimAction::Skip(SkipReason::NotDeletePolicy)
    );
}

#[test]
fn a_failed_pv_is_not_deleted_until_an_admin_deletes_it() {
    // "failed: shouldn't delete".
    let failed = dynamic().phase("Failed").finalizer(OURS);
    assert_eq!(
        d(failed.clone()),
        ReclaimAction::Skip(SkipReason::NotReleased)
    );
    assert_eq!(claim_to_check(&failed.clone().build()), None);
    // Deleted by an admin: like any other PV, it waits for its claim, then is reclaimed.
    let deleted = failed.deleting().build();
    assert_eq!(claim_to_check(&deleted), Some(("ns", "c", "uid-c")));
    let exists = ReclaimContext {
        claim: ClaimState::Exists,
        ..ctx()
    };
    assert_eq!(
        decide_with(&deleted, &exists),
        ReclaimAction::Skip(SkipReason::ClaimInUse { deleting: true })
    );
    let gone = ReclaimContext {
        claim: ClaimState::Gone,
        ..ctx()
    };
    assert_eq!(
        decide_with(&deleted, &gone),
        delete_volume(DeletionSecrets::None)
    );
}

#[test]
fn only_our_released_pvs_are_deleted() {
    // "delete volume-1 but not volume-2".
    assert_eq!(d(released()), delete_volume(DeletionSecrets::None));
    let theirs = pv("pv-2")
        .driver(OTHER)
        .provisioned_by(OTHER)
        .reclaim("Delete")
        .phase("Released");
    assert_eq!(d(theirs), ReclaimAction::Skip(SkipReason::NotOurs));
}

#[test]
fn a_pv_whose_claim_is_gone_counts_as_released_while_the_phase_lags() {
    let gone = ReclaimContext {
        claim: ClaimState::Gone,
        ..ctx()
    };
    assert_eq!(
        decide_with(&bound().build(), &gone),
        delete_volume(DeletionSecrets::None)
    );
    assert_eq!(
        decide_with(&bound().build(), &ctx()),
        ReclaimAction::Skip(SkipReason::ClaimUnknown)
    );
}

#[test]
fn a_claim_recreated_under_the_same_name_is_not_the_pvs_claim() {
    let volume = bound().build();
    assert_eq!(claim_to_check(&volume), Some(("ns", "c", "uid-c")));
    let same = pvc("ns", "c").uid("uid-c").build();
    let recreated = pvc("ns", "c").uid("uid-new").build();
    assert_eq!(claim_state(&volume, Some(&same)), ClaimState::Exists);
    assert_eq!(claim_state(&volume, Some(&recreated)), ClaimState::Gone);
    assert_eq!(claim_state(&volume, None), ClaimState::Gone);
}

#[test]
fn a_first_absence_waits_for_released_and_a_second_is_read_live() {
    let volume = bound().build();
    let same = pvc("ns", "c").uid("uid-c").build();
    assert_eq!(
        claim_lookup(&volume, Some(&same), true),
        ClaimLookup::Known(ClaimState::Exists),
        "the cache answers for a claim it has"
    );
    assert_eq!(
        claim_lookup(&volume, None, false),
        ClaimLookup::WaitForRelease
    );
    assert_eq!(claim_lookup(&volume, None, true), ClaimLookup::ReadLive);
    let mut deleting = bound().build();
    deleting.metadata.deletion_timestamp = Some(crate::testing::deletion_time());
    assert_eq!(
        claim_lookup(&deleting, None, false),
        ClaimLookup::ReadLive,
        "a PV being deleted gets no Released to wait for"
    );
}

#[test]
fn no_claim_lookup_is_needed_once_the_phase_says_released() {
    assert_eq!(claim_to_check(&released().build()), None);
    let pre_bound_by_name = {
        let mut v = dynamic().phase("Available").build();
        if let Some(r) = v.spec.as_mut().and_then(|s| s.claim_ref.as_mut()) {
            r.uid = None;
        }
        v
    };
    assert_eq!(claim_to_check(&pre_bound_by_name), None);
}

#[test]
fn a_deleted_pv_without_any_claim_is_reclaimed_instead_of_hanging() {
    let mut volume = dynamic()
        .phase("Available")
        .finalizer(OURS)
        .deleting()
        .build();
    if let Some(spec) = volume.spec.as_mut() {
        spec.claim_ref = None;
    }
    assert_eq!(
        decide_with(&volume, &ctx()),
        delete_volume(DeletionSecrets::None)
    );
    volume.metadata.deletion_timestamp = None;
    assert_eq!(
        decide_with(&volume, &ctx()),
        ReclaimAction::Skip(SkipReason::NotReleased)
    );
}

// === TestDelete ===

#[test]
fn a_pv_without_a_csi_source_fails_with_upstreams_message() {
    // "fail - nil volume.Spec.CSI".
    let action = d(released().no_csi());
    assert_eq!(action, ReclaimAction::Fail(ReclaimError::InvalidCsiPv));
    assert_eq!(ReclaimError::InvalidCsiPv.to_string(), "invalid CSI PV");
}

#[test]
fn an_in_tree_pv_our_driver_cannot_translate_fails_clearly() {
    // A PV migrated to a driver that did not take over its in-tree plugin: nothing translates it.
    let volume = released()
        .no_csi()
        .annotation(names::ANN_MIGRATED_TO, DRIVER);
    let ReclaimAction::Fail(err) = d(volume) else {
        panic!("expected a failure");
    };
    assert!(
        err.to_string()
            .contains("is not the CSI driver of its in-tree plugin"),
        "{err}"
    );
    // "no migration": a CSI PV is deleted normally.
    assert_eq!(d(released()), delete_volume(DeletionSecrets::None));
}

#[test]
fn a_simple_released_pv_deletes_its_volume_handle() {
    // "simple - valid case", "simple - valid case with ClaimRef set".
    let volume = released().handle("vol-123").build();
    assert_eq!(
        decide_with(&volume, &ctx()),
        ReclaimAction::DeleteVolume {
            volume_id: "vol-123".to_owned(),
            secrets: DeletionSecrets::None,
        }
    );
}

#[test]
fn an_attached_pv_waits_for_detach_whatever_the_attachment_status() {
    // "fail - delete when attached to node", "... volumeattachment exists but not attached to
    // node", "... volumeattachment exists with deletionTimestamp set": the index reports any
    // VolumeAttachment naming the PV.
    let attached = ReclaimContext {
        publish_unpublish: true,
        attachment: AttachmentState::AttachedTo("node-1".to_owned()),
        ..ctx()
    };
    assert_eq!(
        decide_with(&released().build(), &attached),
        ReclaimAction::WaitForDetach {
            node: "node-1".to_owned()
        }
    );
    assert_eq!(
        detach_message("pv-1", "node-1"),
        "persistentvolume pv-1 is still attached to node node-1"
    );
}

#[test]
fn attachments_matter_only_for_drivers_with_publish_unpublish() {
    // "simple - valid case with existing volumeattachment on different pv" is the index's job
    // (lookup by PV name); here: without the capability VolumeAttachments are not consulted.
    let no_capability = ReclaimContext {
        publish_unpublish: false,
        attachment: AttachmentState::AttachedTo("node-1".to_owned()),
        ..ctx()
    };
    assert_eq!(
        decide_with(&released().build(), &no_capability),
        delete_volume(DeletionSecrets::None)
    );
    let not_synced = ReclaimContext {
        publish_unpublish: true,
        attachment: AttachmentState::Unknown,
        ..ctx()
    };
    assert_eq!(
        decide_with(&released().build(), &not_synced),
        ReclaimAction::Skip(SkipReason::AttachmentsUnknown)
    );
}

#[test]
fn one_waiting_episode_per_pv_uid() {
    let a = released().build();
    let recreated = released().uid("uid-other").build();
    assert_eq!(wait_for_detach_episode(&a), wait_for_detach_episode(&a));
    assert_ne!(
        wait_for_detach_episode(&a),
        wait_for_detach_episode(&recreated)
    );
}

#[test]
fn distributed_provisioning_deletes_only_volumes_of_this_node() {
    // "distributed, ignore PV from other host" / "distributed, delete PV from our host".
    let other_node = ReclaimContext {
        locality: Locality::Node { accessible: false },
        ..ctx()
    };
    assert_eq!(
        decide_with(&released().build(), &other_node),
        ReclaimAction::Skip(SkipReason::NotOnThisNode)
    );
    let this_node = ReclaimContext {
        locality: Locality::Node { accessible: true },
        ..ctx()
    };
    assert_eq!(
        decide_with(&released().build(), &this_node),
        delete_volume(DeletionSecrets::None)
    );
    // Finalizer upkeep still happens on every instance, as upstream.
    assert_eq!(
        decide_with(&dynamic().phase("Bound").build(), &other_node),
        ReclaimAction::AddFinalizer
    );
}

#[test]
fn an_invalid_node_affinity_in_node_mode_is_a_delete_failure_not_another_nodes_volume() {
    // Upstream: "checking volume affinity failed: ..." is returned from Delete, so the PV gets a
    // VolumeFailedDelete event and is retried; skipping it silently would leave it forever.
    let error = crate::model::topology::AffinityError {
        key: "zone".to_owned(),
        operator: "Bogus".to_owned(),
        reason: "unknown operator",
    };
    let invalid = ReclaimContext {
        locality: Locality::InvalidNodeAffinity(error.clone()),
        ..ctx()
    };
    let action = decide_with(&released().build(), &invalid);
    assert_eq!(
        action,
        ReclaimAction::Fail(ReclaimError::NodeAffinity(error))
    );
    let ReclaimAction::Fail(failure) = action else {
        unreachable!()
    };
    assert_eq!(
        failure.to_string(),
        "checking volume affinity failed: invalid node selector requirement zone Bogus: unknown operator"
    );
}

// === KEP-2644 orders and restarts, step by step ===

/// Applies what the shell would do for `action` to the PV (finalizer writes, the DELETE).
fn execute(volume: &mut PersistentVolume, action: &ReclaimAction, volume_deleted: &mut bool) {
    let finalizers = volume.metadata.finalizers.get_or_insert_with(Vec::new);
    match action {
        ReclaimAction::AddFinalizer => finalizers.push(OURS.to_owned()),
        ReclaimAction::RemoveFinalizer(_) => finalizers.retain(|f| f != OURS),
        ReclaimAction::DeleteVolume { .. } => *volume_deleted = true,
        ReclaimAction::DeletePvObject { issue_delete } => {
            if *issue_delete {
                volume.metadata.deletion_timestamp = Some(crate::testing::deletion_time());
            }
            finalizers.retain(|f| f != OURS);
        }
        other => panic!("nothing to execute for {other:?}"),
    }
}

#[test]
fn pvc_deleted_first_deletes_the_volume_once_then_the_pv() {
    let mut volume = dynamic().phase("Bound").build();
    let mut deleted = false;
    let claim_exists = ReclaimContext {
        claim: ClaimState::Exists,
        ..ctx()
    };
    let action = decide_with(&volume, &claim_exists);
    assert_eq!(action, ReclaimAction::AddFinalizer);
    execute(&mut volume, &action, &mut deleted);
    assert_eq!(
        decide_with(&volume, &claim_exists),
        ReclaimAction::Skip(SkipReason::ClaimInUse { deleting: false })
    );

    // The PVC is deleted; the PV controller marks the PV Released.
    volume.status.get_or_insert_with(Default::default).phase = Some("Released".to_owned());
    let action = decide_with(&volume, &ctx());
    assert_eq!(action, delete_volume(DeletionSecrets::None));
    execute(&mut volume, &action, &mut deleted);

    // DeleteVolume returned OK: the PV update caused by our own DELETE must not resend it.
    let after = |v: &PersistentVolume, volume_deleted: bool| {
        decide_with(
            v,
            &ReclaimContext {
                volume_deleted,
                ..ctx()
            },
        )
    };
    let action = after(&volume, deleted);
    assert_eq!(action, ReclaimAction::DeletePvObject { issue_delete: true });
    volume.metadata.deletion_timestamp = Some(crate::testing::deletion_time());
    assert_eq!(
        after(&volume, deleted),
        ReclaimAction::DeletePvObject {
            issue_delete: false
        }
    );
    execute(&mut volume, &action, &mut deleted);
    assert_eq!(
        after(&volume, deleted),
        ReclaimAction::Skip(SkipReason::DeletingWithoutFinalizer)
    );
}

#[test]
fn pv_deleted_first_waits_while_bound_then_deletes_the_volume() {
    // The KEP-2644 case: the PV is deleted before its PVC.
    let mut volume = bound().deleting().build();
    let claim_exists = ReclaimContext {
        claim: ClaimState::Exists,
        ..ctx()
    };
    assert_eq!(
        decide_with(&volume, &claim_exists),
        ReclaimAction::Skip(SkipReason::ClaimInUse { deleting: true })
    );
    // The PVC goes away; whether or not the phase has caught up, the volume is deleted.
    let claim_gone = ReclaimContext {
        claim: ClaimState::Gone,
        ..ctx()
    };
    assert_eq!(
        decide_with(&volume, &claim_gone),
        delete_volume(DeletionSecrets::None)
    );
    volume.status.get_or_insert_with(Default::default).phase = Some("Released".to_owned());
    assert_eq!(
        decide_with(&volume, &ctx()),
        delete_volume(DeletionSecrets::None)
    );
}

#[test]
fn a_static_pv_bound_to_a_claim_gets_the_finalizer_and_follows_both_orders() {
    let static_pv = || {
        pv("pv-1")
            .reclaim("Delete")
            .claim_ref("ns", "c", "uid-c")
            .phase("Bound")
    };
    assert_eq!(d(static_pv()), ReclaimAction::AddFinalizer);
    let gone = ReclaimContext {
        claim: ClaimState::Gone,
        storage_class: StorageClassLookup::Missing,
        ..ctx()
    };
    let no_secrets = || delete_volume(DeletionSecrets::None);
    // Static PVs carry no class here: no secret, no warning.
    assert_eq!(
        decide_with(&static_pv().finalizer(OURS).build(), &gone),
        no_secrets()
    );
    assert_eq!(
        decide_with(&static_pv().finalizer(OURS).deleting().build(), &gone),
        no_secrets()
    );
}

#[test]
fn a_restart_between_delete_volume_and_finalizer_removal_sends_delete_volume_again() {
    // Nothing on the PV says DeleteVolume succeeded; a fresh process repeats it (idempotent).
    for volume in [released().build(), released().deleting().build()] {
        assert_eq!(
            decide_with(&volume, &ctx()),
            delete_volume(DeletionSecrets::None)
        );
    }
}

#[test]
fn a_failed_delete_volume_is_retried_and_the_pv_is_kept() {
    // "provisioner fails to delete the volume with finalizer, the pv is not deleted": the shell
    // did not set volume_deleted, so the next decision is DeleteVolume again, never the PV DELETE.
    assert_eq!(d(released()), delete_volume(DeletionSecrets::None));
}

#[test]
fn a_pv_delete_that_failed_after_delete_volume_is_retried_without_a_second_call() {
    // "volume deletion succeeds but the pv deletion fails, the pv still exists".
    let done = ReclaimContext {
        volume_deleted: true,
        ..ctx()
    };
    assert_eq!(
        decide_with(&released().build(), &done),
        ReclaimAction::DeletePvObject { issue_delete: true }
    );
}

#[test]
fn a_volume_awaits_deletion_once_released_or_deleted_while_ours_with_delete_policy() {
    assert!(awaits_deletion(&released().build(), DRIVER));
    assert!(awaits_deletion(
        &dynamic().phase("Failed").finalizer(OURS).build(),
        DRIVER
    ));
    // Deleted first, still bound: its volume goes once the claim does.
    assert!(awaits_deletion(&bound().deleting().build(), DRIVER));
    assert!(!awaits_deletion(&bound().build(), DRIVER), "in use");
    assert!(
        !awaits_deletion(&released().reclaim("Retain").build(), DRIVER),
        "kept by policy"
    );
    assert!(
        !awaits_deletion(&dynamic().phase("Released").build(), DRIVER),
        "without our finalizer the volume is not ours to track"
    );
    assert!(
        !awaits_deletion(&released().build(), "other.csi.example"),
        "another driver's"
    );
}

/// Issue 31: for a driver that took over an in-tree plugin, a PV the plugin provisioned (no
/// `migrated-to` yet) is ours; one of another plugin is not. A PV that cannot be translated to
/// the driver's CSI PV fails its deletion with the translation's own text, as upstream.
#[test]
fn in_tree_pvs_of_the_plugin_our_driver_took_over_are_ours() {
    let gce = pv("pv-1")
        .no_csi()
        .provisioned_by("kubernetes.io/gce-pd")
        .build();
    assert_eq!(
        ownership(&gce, "pd.csi.storage.gke.io"),
        Ownership::Ours { dynamic: true }
    );
    assert_eq!(ownership(&gce, "ebs.csi.aws.com"), Ownership::NotOurs);
    assert_eq!(ownership(&gce, DRIVER), Ownership::NotOurs);
    let broken = ReclaimContext {
        translated: Some(Err(
            "failed to get id components.Got: 4, wanted 6 components or more. ".to_owned(),
        )),
        ..ctx()
    };
    assert_eq!(
        decide_with(&released().no_csi().build(), &broken),
        ReclaimAction::Fail(ReclaimError::Translation(
            "failed to get id components.Got: 4, wanted 6 components or more. ".to_owned()
        ))
    );
}

/// Issue 41: an in-tree PV of the plugin our driver took over whose handle does not translate is
/// protected while bound and, once released, fails its deletion with the translation's text (an
/// event and the failure metric in the shell), as upstream; never skipped in silence.
#[test]
fn an_untranslatable_in_tree_pv_of_our_plugin_is_protected_then_fails_its_deletion() {
    const ERROR: &str = "failed to translate Kubernetes ID to EBS Volume ID Invalid format for AWS volume (aws://us-east-1a/not-an-ebs-id)";
    let broken = ReclaimContext {
        translated: Some(Err(ERROR.to_owned())),
        claim: ClaimState::Exists,
        ..ctx()
    };
    let in_tree = || {
        pv("pv-1")
            .no_csi()
            .provisioned_by("kubernetes.io/aws-ebs")
            .annotation(names::ANN_MIGRATED_TO, DRIVER)
            .reclaim("Delete")
            .claim_ref("ns", "c", "uid-c")
    };
    assert_eq!(
        decide_with(&in_tree().phase("Bound").build(), &broken),
        ReclaimAction::AddFinalizer
    );
    assert_eq!(
        decide_with(&in_tree().phase("Bound").finalizer(OURS).build(), &broken),
        ReclaimAction::Skip(SkipReason::ClaimInUse { deleting: false })
    );
    let failed = decide_with(
        &in_tree().phase("Released").finalizer(OURS).build(),
        &broken,
    );
    assert_eq!(
        failed,
        ReclaimAction::Fail(ReclaimError::Translation(ERROR.to_owned()))
    );
    let ReclaimAction::Fail(err) = failed else {
        unreachable!()
    };
    assert_eq!(err.to_string(), ERROR, "the event's text, upstream's words");
    // Node mode: no instance's segments match an in-tree affinity, yet the failure is reported
    // (upstream translates before it checks the node), not skipped as another node's.
    let on_no_node = ReclaimContext {
        locality: Locality::Node { accessible: false },
        claim: ClaimState::Unknown,
        ..broken
    };
    assert_eq!(
        decide_with(
            &in_tree().phase("Released").finalizer(OURS).build(),
            &on_no_node
        ),
        ReclaimAction::Fail(ReclaimError::Translation(ERROR.to_owned()))
    );
}

/// CSI migration: a static in-tree PV of the plugin our driver took over, with neither
/// provisioned-by nor migrated-to, is not the driver's for upstream (it keeps the volume). Its
/// translation names our driver in `spec.csi`, yet whose PV it is is read on the PV as written:
/// never protected, never deleted.
#[test]
fn a_static_in_tree_pv_without_our_annotations_is_not_ours_though_its_translation_names_our_driver()
{
    let in_tree = || {
        pv("plain")
            .no_csi()
            .reclaim("Delete")
            .claim_ref("ns", "c", "uid-c")
    };
    let as_csi = pv("plain").reclaim("Delete").claim_ref("ns", "c", "uid-c");
    let translated = |phase: &str| ReclaimContext {
        translated: Some(Ok(as_csi.clone().phase(phase).build())),
        ..ctx()
    };
    assert_eq!(
        decide_with(&in_tree().phase("Bound").build(), &translated("Bound")),
        ReclaimAction::Skip(SkipReason::NotOurs),
        "no finalizer"
    );
    assert_eq!(
        decide_with(
            &in_tree().phase("Released").build(),
            &translated("Released")
        ),
        ReclaimAction::Skip(SkipReason::NotOurs),
        "no DeleteVolume"
    );
    // The same PV once the PV controller marks it migrated to our driver is ours, as upstream.
    let annotated = in_tree()
        .annotation(names::ANN_MIGRATED_TO, DRIVER)
        .phase("Bound")
        .build();
    assert_eq!(
        decide_with(&annotated, &translated("Bound")),
        ReclaimAction::AddFinalizer
    );
}
