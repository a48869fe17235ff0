//! Tests for `reclaim::plan`: the provisioner secret sent with DeleteVolume (upstream
//! `handleSecretsForDeletion`, reference §5.5 step 4, and the secret cases of TestDelete).

use k8s_openapi::api::core::v1::PersistentVolume;

use super::tests::{class_with, ctx, decide_with, delete_volume, dynamic, old_dynamic, released};
use super::*;
use crate::names::FINALIZER_PV_DELETION_PROTECTION as OURS;
use crate::testing::PvBuilder;

// === Deletion secrets (TestDelete secret cases, §5.5 step 4) ===

fn secrets_of(volume: PersistentVolume, class: StorageClassLookup) -> ReclaimAction {
    decide_with(
        &volume,
        &ReclaimContext {
            storage_class: class,
            ..ctx()
        },
    )
}

#[test]
fn an_empty_annotated_secret_means_no_secret_whether_or_not_the_class_exists() {
    // "Empty provisioner secret is set as PV annotation and StorageClass exists / doesn't exist".
    let class = class_with(&[
        (names::PARAM_PROVISIONER_SECRET_NAME, "s"),
        (names::PARAM_PROVISIONER_SECRET_NAMESPACE, "ns"),
    ]);
    for lookup in [
        StorageClassLookup::Found(Arc::new(class.clone())),
        StorageClassLookup::Missing,
    ] {
        assert_eq!(
            secrets_of(released().build(), lookup),
            delete_volume(DeletionSecrets::None)
        );
    }
}

#[test]
fn an_annotated_secret_wins_over_the_class_and_survives_its_deletion() {
    // "Non-empty provisioner secret is set as PV annotation and StorageClass exists / doesn't
    // exist / modified StorageClass exists", "Non-existent provisioner secret is set as PV
    // annotation" (the fetch fails in the shell, which then deletes without secrets).
    let volume = released().deletion_secret("sec", "sec-ns").build();
    let modified = class_with(&[
        (names::PARAM_PROVISIONER_SECRET_NAME, "changed"),
        (names::PARAM_PROVISIONER_SECRET_NAMESPACE, "changed-ns"),
    ]);
    let want = delete_volume(DeletionSecrets::Fetch(SecretRef::new("sec", "sec-ns")));
    for lookup in [
        StorageClassLookup::Found(Arc::new(modified.clone())),
        StorageClassLookup::Missing,
    ] {
        assert_eq!(secrets_of(volume.clone(), lookup), want);
    }
}

#[test]
fn a_half_empty_annotated_pair_means_no_secret() {
    let volume = released().deletion_secret("sec", "").build();
    assert_eq!(
        secrets_of(volume, StorageClassLookup::Missing),
        delete_volume(DeletionSecrets::None)
    );
}

fn without_secret_annotations() -> PvBuilder {
    old_dynamic().phase("Released").finalizer(OURS)
}

#[test]
fn without_annotations_the_secret_comes_from_the_class_templates() {
    // "Provisioner secret isn't set as PV annotation": old PVs; pseudo-claim from claimRef.
    let class = class_with(&[
        (
            names::PARAM_PROVISIONER_SECRET_NAME,
            "${pvc.name}-${pv.name}",
        ),
        (
            names::PARAM_PROVISIONER_SECRET_NAMESPACE,
            "${pvc.namespace}",
        ),
    ]);
    let volume = without_secret_annotations().build();
    assert_eq!(
        secrets_of(volume, StorageClassLookup::Found(Arc::new(class.clone()))),
        delete_volume(DeletionSecrets::Fetch(SecretRef::new("c-pv-1", "ns")))
    );
    let plain = class_with(&[]);
    assert_eq!(
        secrets_of(
            without_secret_annotations().build(),
            StorageClassLookup::Found(Arc::new(plain.clone()))
        ),
        delete_volume(DeletionSecrets::None)
    );
}

#[test]
fn a_class_deleted_meanwhile_means_deleting_without_secrets_and_a_warning() {
    let action = secrets_of(
        without_secret_annotations().build(),
        StorageClassLookup::Missing,
    );
    let want = SecretWarning::StorageClassMissing {
        class: "fast".to_owned(),
    };
    assert_eq!(
        action,
        delete_volume(DeletionSecrets::NoneWithWarning(want.clone()))
    );
    assert!(want.to_string().contains("fast"));
}

#[test]
fn claim_annotation_templates_cannot_be_resolved_at_deletion() {
    // "fail - pvc.annotations not supported for Create/Delete Volume Secret".
    let class = class_with(&[
        (
            names::PARAM_PROVISIONER_SECRET_NAME,
            "${pvc.annotations['team.example.com/key']}",
        ),
        (names::PARAM_PROVISIONER_SECRET_NAMESPACE, "ns"),
    ]);
    let ReclaimAction::Fail(err) = secrets_of(
        without_secret_annotations().build(),
        StorageClassLookup::Found(Arc::new(class.clone())),
    ) else {
        panic!("expected a failure");
    };
    assert!(
        err.to_string()
            .starts_with("failed to get secretreference for volume pv-1: "),
        "{err}"
    );
}

#[test]
fn a_pv_without_claim_ref_or_class_is_deleted_without_secrets() {
    let class = class_with(&[
        (names::PARAM_PROVISIONER_SECRET_NAME, "s"),
        (names::PARAM_PROVISIONER_SECRET_NAMESPACE, "ns"),
    ]);
    let mut no_claim_ref = without_secret_annotations().build();
    if let Some(spec) = no_claim_ref.spec.as_mut() {
        spec.claim_ref = None;
    }
    assert_eq!(
        deletion_secrets(
            &no_claim_ref,
            &StorageClassLookup::Found(Arc::new(class.clone()))
        ),
        Ok(DeletionSecrets::NoneWithWarning(SecretWarning::NoClaimRef))
    );
    let mut no_class = without_secret_annotations().build();
    if let Some(spec) = no_class.spec.as_mut() {
        spec.storage_class_name = None;
    }
    assert_eq!(
        deletion_secrets(&no_class, &StorageClassLookup::Missing),
        Ok(DeletionSecrets::None)
    );
}

#[test]
fn the_beta_class_annotation_wins_over_the_spec_field() {
    let volume = dynamic()
        .annotation(names::ANN_BETA_STORAGE_CLASS, "beta")
        .build();
    assert_eq!(storage_class_name(&volume), Some("beta"));
    assert_eq!(storage_class_name(&dynamic().build()), Some("fast"));
}
