//! Upstream's csi-translation-lib vectors for Azure File (restated), and where we differ.

use super::*;
use crate::migration::params::test_support::map;
use crate::names;

#[test]
fn storage_account_names_from_secret_names() {
    assert_eq!(
        storage_account_name("azure-storage-account-accountname-secret").as_deref(),
        Some("accountname")
    );
    assert_eq!(
        storage_account_name("azure-storage-account-accountname-dup-secret").as_deref(),
        Some("accountname-dup")
    );
    assert_eq!(storage_account_name("invalid"), None);
}

fn file_pv(namespace: Option<&str>, secret: &str) -> PersistentVolume {
    let mut pv = PersistentVolume::default();
    pv.metadata.name = Some("uuid".into());
    pv.spec.get_or_insert_default().azure_file = Some(AzureFilePersistentVolumeSource {
        share_name: "sharename".into(),
        secret_name: secret.into(),
        secret_namespace: namespace.map(str::to_owned),
        read_only: Some(true),
    });
    pv
}

fn csi_of(pv: &PersistentVolume) -> CSIPersistentVolumeSource {
    Plugin::AzureFile
        .in_tree_to_csi(pv)
        .unwrap()
        .spec
        .unwrap()
        .csi
        .unwrap()
}

/// Upstream's vectors, with a secret named after its account (see below for one that is not).
#[test]
fn the_handle_joins_resource_group_account_share_pv_and_namespace() {
    const SECRET: &str = "azure-storage-account-st-secret";
    let mut rg_only = file_pv(None, SECRET);
    rg_only.metadata.annotations = Some(map(&[(RESOURCE_GROUP_ANNOTATION, "rg")]));
    assert_eq!(
        Plugin::AzureFile.in_tree_to_csi(&rg_only).unwrap_err(),
        "could not find a secret namespace in PersistentVolumeSource or ClaimRef"
    );
    let csi = csi_of(&file_pv(Some("secretnamespace"), SECRET));
    assert_eq!(csi.volume_handle, "#st#sharename#uuid#secretnamespace");
    assert_eq!(
        csi.volume_attributes.unwrap(),
        map(&[("sharename", "sharename")])
    );
    let r = csi.node_stage_secret_ref.unwrap();
    assert_eq!(
        (r.name.as_deref(), r.namespace.as_deref()),
        (Some(SECRET), Some("secretnamespace"))
    );
    let mut with_rg = file_pv(Some("secretnamespace"), SECRET);
    with_rg.metadata.annotations = Some(map(&[(RESOURCE_GROUP_ANNOTATION, "rg")]));
    assert_eq!(
        csi_of(&with_rg).volume_handle,
        "rg#st#sharename#uuid#secretnamespace"
    );
    let mut from_claim = file_pv(None, SECRET);
    from_claim.metadata.annotations = Some(map(&[(RESOURCE_GROUP_ANNOTATION, "rg")]));
    from_claim.spec.as_mut().unwrap().claim_ref =
        Some(k8s_openapi::api::core::v1::ObjectReference {
            namespace: Some("secretnamespace".into()),
            ..Default::default()
        });
    assert_eq!(
        csi_of(&from_claim).volume_handle,
        "rg#st#sharename#uuid#secretnamespace"
    );
}

/// Issue 41: upstream takes a secret name that does not tell the account for the account
/// (`#secretname#sharename#uuid#secretnamespace`); the driver answers that no such share exists
/// and the share leaks. Here the translation fails, so the deletion is reported, not done.
#[test]
fn an_account_the_secret_name_does_not_tell_fails_the_translation() {
    assert_eq!(
        Plugin::AzureFile
            .in_tree_to_csi(&file_pv(Some("secretnamespace"), "secretname"))
            .unwrap_err(),
        "cannot tell the storage account of Azure File share \"sharename\": secretName \"secretname\" \
         is not azure-storage-account-<storage account>-secret; the share is kept: to delete it, \
         annotate the PV with csi-provisioner.rs/volume-id=<resource group>#<storage account>#<share> \
         (an empty resource group is the cluster's)"
    );
}

#[test]
fn the_drivers_id_kept_on_the_pv_is_sent_as_it_is_for_its_share_only() {
    let id = "rg#acct#sharename###secretnamespace#sub";
    let mut kept = file_pv(Some("secretnamespace"), "secretname");
    kept.metadata.annotations = Some(map(&[
        (names::ANN_PV_VOLUME_ID, id),
        (RESOURCE_GROUP_ANNOTATION, "other"),
    ]));
    assert_eq!(csi_of(&kept).volume_handle, id);
    let mut other_share = file_pv(Some("secretnamespace"), "azure-storage-account-st-secret");
    other_share.metadata.annotations = Some(map(&[(names::ANN_PV_VOLUME_ID, "rg#acct#other")]));
    assert_eq!(
        Plugin::AzureFile.in_tree_to_csi(&other_share).unwrap_err(),
        "annotation csi-provisioner.rs/volume-id \"rg#acct#other\" does not name the PV's Azure \
         File share \"sharename\"; the share is kept: to delete it, set the annotation to \
         <resource group>#<storage account>#<share>"
    );
    // An empty annotation is none.
    let mut empty = file_pv(Some("ns"), "azure-storage-account-st-secret");
    empty.metadata.annotations = Some(map(&[(names::ANN_PV_VOLUME_ID, "")]));
    assert_eq!(csi_of(&empty).volume_handle, "#st#sharename#uuid#ns");
}

/// Issue 41, the leak itself: a class with a node-stage secret. The driver's context names the
/// share, so upstream writes back neither the account nor the resource group.
#[test]
fn a_share_with_a_node_stage_secret_comes_back_with_the_drivers_id() {
    let id = "rg1#acct1#pvc-1###default";
    let mut pv = csi_pv(
        id,
        &[("sharename", "pvc-1")],
        Some(("azure-secret", "default")),
    );
    pv.metadata.name = Some("pvc-1".into());
    let in_tree = Plugin::AzureFile.csi_to_in_tree(&pv).unwrap();
    let file = in_tree.spec.as_ref().unwrap().azure_file.clone().unwrap();
    assert_eq!(file.secret_name, "azure-secret");
    assert_eq!(
        in_tree.metadata.annotations.clone().unwrap(),
        map(&[(names::ANN_PV_VOLUME_ID, id)]),
        "no resource group annotation, as upstream; the driver's id"
    );
    assert_eq!(csi_of(&in_tree).volume_handle, id);
}

fn csi_pv(handle: &str, attrs: &[(&str, &str)], secret: Option<(&str, &str)>) -> PersistentVolume {
    let mut pv = PersistentVolume::default();
    pv.spec.get_or_insert_default().csi = Some(CSIPersistentVolumeSource {
        driver: "file.csi.azure.com".into(),
        volume_handle: handle.into(),
        read_only: Some(true),
        volume_attributes: Some(map(attrs)),
        node_stage_secret_ref: secret.map(|(n, ns)| SecretReference {
            name: Some(n.into()),
            namespace: Some(ns.into()),
        }),
        ..Default::default()
    });
    pv
}

fn written_back(
    pv: &PersistentVolume,
) -> (BTreeMap<String, String>, AzureFilePersistentVolumeSource) {
    let out = Plugin::AzureFile.csi_to_in_tree(pv).unwrap();
    (
        out.metadata.annotations.unwrap_or_default(),
        out.spec.unwrap().azure_file.unwrap(),
    )
}

#[test]
fn a_csi_share_is_written_back_from_attributes_secret_or_handle() {
    let file = |secret: &str, ns: &str, share: &str| AzureFilePersistentVolumeSource {
        read_only: Some(true),
        secret_name: secret.into(),
        secret_namespace: Some(ns.into()),
        share_name: share.into(),
    };
    let share = [("shareName", "sharename")];
    assert_eq!(
        written_back(&csi_pv("", &share, Some(("ut", "secretnamespace")))),
        (map(&[]), file("ut", "secretnamespace", "sharename"))
    );
    assert_eq!(
        Plugin::AzureFile
            .csi_to_in_tree(&csi_pv("sharename", &share, None))
            .unwrap_err(),
        "error parsing volume id: \"sharename\", should at least contain two #"
    );
    let handle = "rg#st#pvc-file-dynamic#diskname.vhd";
    assert_eq!(
        written_back(&csi_pv(handle, &share, None)),
        (
            map(&[(RESOURCE_GROUP_ANNOTATION, "rg")]),
            file("azure-storage-account-st-secret", "default", "sharename")
        )
    );
    let all = [
        ("shareName", "sharename"),
        ("secretName", "secretname"),
        ("secretNamespace", "secretnamespace"),
    ];
    assert_eq!(
        written_back(&csi_pv(handle, &all, None)),
        (map(&[]), file("secretname", "secretnamespace", "sharename"))
    );
    assert_eq!(
        written_back(&csi_pv(
            handle,
            &share,
            Some(("secretname", "secretnamespace"))
        )),
        (map(&[]), file("secretname", "secretnamespace", "sharename"))
    );
    assert_eq!(
        written_back(&csi_pv(handle, &[], None)),
        (
            map(&[
                (RESOURCE_GROUP_ANNOTATION, "rg"),
                (names::ANN_PV_VOLUME_ID, handle)
            ]),
            file(
                "azure-storage-account-st-secret",
                "default",
                "pvc-file-dynamic"
            )
        )
    );
}

/// Found by `disk_uris_and_account_secrets_read_as_upstreams_patterns`: upstream's
/// `azure-storage-account-(.+)-secret` does not match across a newline; string search did.
#[test]
fn an_account_name_does_not_span_a_newline() {
    assert_eq!(
        storage_account_name("azure-storage-account-\n-secret"),
        None
    );
    assert_eq!(
        storage_account_name("azure-storage-account-a\nazure-storage-account-b-secret").as_deref(),
        Some("b")
    );
}
