//! Upstream's csi-translation-lib vectors for Portworx (restated).

use super::*;
use crate::migration::params::test_support::{class, map};

#[test]
fn the_auth_secret_becomes_every_csi_secret_and_the_provisioner_the_drivers() {
    let mut sc = class(
        &[
            ("repl", "1"),
            ("fs", "ext4"),
            ("shared", "true"),
            ("priority_io", "high"),
        ],
        None,
    );
    sc.provisioner = "kubernetes.io/portworx-volume".into();
    let out = translate_class(&sc).unwrap();
    assert_eq!(out.provisioner, "pxd.portworx.com");
    assert_eq!(out.parameters, sc.parameters);
    let empty = StorageClass::default();
    let out = translate_class(&empty).unwrap();
    assert_eq!(
        (out.provisioner.as_str(), out.parameters),
        ("pxd.portworx.com", None)
    );
    let out = translate_class(&class(
        &[
            ("repl", "1"),
            (AUTH_SECRET_NAME, "test-secret"),
            (AUTH_SECRET_NAMESPACE, "test-namespace"),
        ],
        None,
    ))
    .unwrap();
    let params = out.parameters.unwrap();
    assert_eq!(params.len(), 13);
    assert_eq!(params["repl"], "1");
    for kind in SECRET_KINDS {
        assert_eq!(
            params[&format!("csi.storage.k8s.io/{kind}-secret-name")],
            "test-secret"
        );
        assert_eq!(
            params[&format!("csi.storage.k8s.io/{kind}-secret-namespace")],
            "test-namespace"
        );
    }
}

#[test]
fn a_volume_round_trips_and_its_annotations_give_every_secret_but_the_provisioners() {
    let mut pv = PersistentVolume::default();
    pv.spec.get_or_insert_default().portworx_volume = Some(PortworxVolumeSource {
        volume_id: "ID1111".into(),
        fs_type: Some("type".into()),
        read_only: None,
    });
    let csi = Plugin::Portworx.in_tree_to_csi(&pv).unwrap();
    let source = csi.spec.as_ref().unwrap().csi.clone().unwrap();
    assert_eq!(
        (source.volume_handle.as_str(), source.fs_type.as_deref()),
        ("ID1111", Some("type"))
    );
    assert_eq!(source.node_stage_secret_ref, None);
    assert_eq!(Plugin::Portworx.csi_to_in_tree(&csi).unwrap(), pv);
    pv.metadata.annotations = Some(map(&[
        (AUTH_SECRET_NAME, "test-secret"),
        (AUTH_SECRET_NAMESPACE, "test-namespace"),
    ]));
    let source = Plugin::Portworx
        .in_tree_to_csi(&pv)
        .unwrap()
        .spec
        .unwrap()
        .csi
        .unwrap();
    let want = Some(SecretReference {
        name: Some("test-secret".into()),
        namespace: Some("test-namespace".into()),
    });
    for r in [
        &source.controller_publish_secret_ref,
        &source.node_stage_secret_ref,
        &source.node_publish_secret_ref,
        &source.controller_expand_secret_ref,
        &source.node_expand_secret_ref,
    ] {
        assert_eq!(r, &want);
    }
}
