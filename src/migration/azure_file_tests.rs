//! Upstream's csi-translation-lib vectors for Azure File (restated).

use super::*;
use crate::migration::params::test_support::map;

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

fn file_pv(namespace: Option<&str>) -> PersistentVolume {
    let mut pv = PersistentVolume::default();
    pv.metadata.name = Some("uuid".into());
    pv.spec.get_or_insert_default().azure_file = Some(AzureFilePersistentVolumeSource {
        share_name: "sharename".into(),
        secret_name: "secretname".into(),
        secret_namespace: namespace.map(str::to_owned),
        read_only: Some(true),
    });
    pv
}

#[test]
fn the_handle_joins_resource_group_account_share_pv_and_namespace() {
    let mut rg_only = file_pv(None);
    rg_only.metadata.annotations = Some(map(&[(RESOURCE_GROUP_ANNOTATION, "rg")]));
    assert_eq!(
        Plugin::AzureFile.in_tree_to_csi(&rg_only).unwrap_err(),
        "could not find a secret namespace in PersistentVolumeSource or ClaimRef"
    );
    let csi = Plugin::AzureFile
        .in_tree_to_csi(&file_pv(Some("secretnamespace")))
        .unwrap()
        .spec
        .unwrap()
        .csi
        .unwrap();
    assert_eq!(
        csi.volume_handle,
        "#secretname#sharename#uuid#secretnamespace"
    );
    assert_eq!(
        csi.volume_attributes.unwrap(),
        map(&[("sharename", "sharename")])
    );
    let r = csi.node_stage_secret_ref.unwrap();
    assert_eq!(
        (r.name.as_deref(), r.namespace.as_deref()),
        (Some("secretname"), Some("secretnamespace"))
    );
    let mut with_rg = file_pv(Some("secretnamespace"));
    with_rg.metadata.annotations = Some(map(&[(RESOURCE_GROUP_ANNOTATION, "rg")]));
    let csi = Plugin::AzureFile
        .in_tree_to_csi(&with_rg)
        .unwrap()
        .spec
        .unwrap()
        .csi
        .unwrap();
    assert_eq!(
        csi.volume_handle,
        "rg#secretname#sharename#uuid#secretnamespace"
    );
    let mut from_claim = file_pv(None);
    from_claim.metadata.annotations = Some(map(&[(RESOURCE_GROUP_ANNOTATION, "rg")]));
    from_claim.spec.as_mut().unwrap().claim_ref =
        Some(k8s_openapi::api::core::v1::ObjectReference {
            namespace: Some("secretnamespace".into()),
            ..Default::default()
        });
    let csi = Plugin::AzureFile
        .in_tree_to_csi(&from_claim)
        .unwrap()
        .spec
        .unwrap()
        .csi
        .unwrap();
    assert_eq!(
        csi.volume_handle,
        "rg#secretname#sharename#uuid#secretnamespace"
    );
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
            map(&[(RESOURCE_GROUP_ANNOTATION, "rg")]),
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
