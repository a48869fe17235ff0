//! Upstream's csi-translation-lib vectors for vSphere (restated).

use super::*;
use crate::migration::params::test_support::{class, map, topo};
use crate::migration::topology::{BETA_REGION, BETA_ZONE, GA_REGION, GA_ZONE};
use k8s_openapi::api::core::v1::{
    NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, VolumeNodeAffinity,
};

/// A parameter list built per case.
type PairVec<'a> = Vec<(&'a str, &'a str)>;

const PATH: &str = "[vsanDatastore] 6785a85e-268e-6352-a2e8-02008b7afadd/kubernetes-dynamic-pvc-68734c9f-a679-42e6-a694-39632c51e31f.vmdk";

#[test]
fn only_the_known_parameters_carry_over_renamed_with_csimigration() {
    let cm = ("csimigration", "true");
    let cases: Vec<(PairVec, PairVec)> = vec![
        (vec![], vec![cm]),
        (vec![("unknownparam", "value")], vec![cm]),
        (
            vec![
                ("storagepolicyname", "test-policy-name"),
                ("datastore", "vsanDatastore"),
            ],
            vec![
                ("storagepolicyname", "test-policy-name"),
                ("datastore-migrationparam", "vsanDatastore"),
                cm,
            ],
        ),
        (
            vec![("fstype", "ext4")],
            vec![("csi.storage.k8s.io/fstype", "ext4"), cm],
        ),
        (
            vec![
                ("StoragePolicyName", "p"),
                ("datastore", "d"),
                ("fstype", "ext4"),
                ("diskformat", "thin"),
                ("hostfailurestotolerate", "1"),
                ("forceprovisioning", "yes"),
                ("cachereservation", "25"),
                ("diskstripes", "4"),
                ("objectspacereservation", "10"),
                ("iopslimit", "32"),
                ("zone", "dropped"),
                ("csi.storage.k8s.io/provisioner-secret-name", "dropped"),
            ],
            vec![
                ("storagepolicyname", "p"),
                ("datastore-migrationparam", "d"),
                ("csi.storage.k8s.io/fstype", "ext4"),
                ("diskformat-migrationparam", "thin"),
                ("hostfailurestotolerate-migrationparam", "1"),
                ("forceprovisioning-migrationparam", "yes"),
                ("cachereservation-migrationparam", "25"),
                ("diskstripes-migrationparam", "4"),
                ("objectspacereservation-migrationparam", "10"),
                ("iopslimit-migrationparam", "32"),
                cm,
            ],
        ),
    ];
    for (input, want) in cases {
        let out = translate_class(&class(&input, None)).unwrap();
        assert_eq!(out.parameters.unwrap(), map(&want), "{input:?}");
    }
    for key in [GA_ZONE, BETA_ZONE] {
        let out = translate_class(&class(&[], Some(topo(key, &["zone-a"])))).unwrap();
        assert_eq!(out.allowed_topologies, Some(topo(ZONE_KEY, &["zone-a"])));
    }
}

fn csi_pv(terms: Option<Vec<NodeSelectorRequirement>>) -> PersistentVolume {
    let mut pv = PersistentVolume::default();
    let spec = pv.spec.get_or_insert_default();
    spec.csi = Some(CSIPersistentVolumeSource {
        driver: "csi.vsphere.vmware.com".into(),
        volume_handle: "e4073a6d-642e-4dff-8f4a-b4e3a47c4bbd".into(),
        fs_type: Some("ext4".into()),
        volume_attributes: Some(map(&[
            ("storagepolicyname", "vSAN Default Storage Policy"),
            ("initialvolumefilepath", PATH),
        ])),
        ..Default::default()
    });
    spec.node_affinity = terms.map(|t| VolumeNodeAffinity {
        required: Some(NodeSelector {
            node_selector_terms: vec![NodeSelectorTerm {
                match_expressions: Some(t),
                match_fields: None,
            }],
        }),
    });
    pv
}

fn req(key: &str, v: &str) -> NodeSelectorRequirement {
    NodeSelectorRequirement {
        key: key.into(),
        operator: "In".into(),
        values: Some(vec![v.into()]),
    }
}

#[test]
fn a_csi_volume_is_written_back_with_its_path_and_ga_topology() {
    let out = Plugin::Vsphere.csi_to_in_tree(&csi_pv(None)).unwrap();
    assert_eq!(
        out.spec.as_ref().unwrap().vsphere_volume,
        Some(VsphereVirtualDiskVolumeSource {
            volume_path: PATH.into(),
            fs_type: Some("ext4".into()),
            ..Default::default()
        })
    );
    assert_eq!(out.metadata.labels, None);
    let out = Plugin::Vsphere
        .csi_to_in_tree(&csi_pv(Some(vec![
            req(ZONE_KEY, "z1"),
            req(REGION_KEY, "r1"),
        ])))
        .unwrap();
    assert_eq!(
        out.metadata.labels.unwrap(),
        map(&[(GA_ZONE, "z1"), (GA_REGION, "r1")])
    );
    let term = &out
        .spec
        .unwrap()
        .node_affinity
        .unwrap()
        .required
        .unwrap()
        .node_selector_terms[0];
    let keys: Vec<&str> = term
        .match_expressions
        .iter()
        .flatten()
        .map(|e| e.key.as_str())
        .collect();
    assert_eq!(keys, [GA_ZONE, GA_REGION]);
}

#[test]
fn an_in_tree_volume_becomes_csi_with_its_labels_as_topology() {
    for (zone, region) in [(BETA_ZONE, BETA_REGION), (GA_ZONE, GA_REGION)] {
        let mut pv = PersistentVolume::default();
        pv.metadata.labels = Some(map(&[(zone, "z1"), (region, "r1")]));
        pv.spec.get_or_insert_default().vsphere_volume = Some(VsphereVirtualDiskVolumeSource {
            volume_path: PATH.into(),
            fs_type: Some("ext4".into()),
            storage_policy_name: Some("vSAN Default Storage Policy".into()),
            ..Default::default()
        });
        let out = Plugin::Vsphere.in_tree_to_csi(&pv).unwrap();
        let spec = out.spec.unwrap();
        let csi = spec.csi.unwrap();
        assert_eq!(csi.volume_handle, PATH);
        assert_eq!(
            csi.volume_attributes.unwrap(),
            map(&[("storagepolicyname", "vSAN Default Storage Policy")])
        );
        let term = &spec
            .node_affinity
            .unwrap()
            .required
            .unwrap()
            .node_selector_terms[0];
        let keys: Vec<&str> = term
            .match_expressions
            .iter()
            .flatten()
            .map(|e| e.key.as_str())
            .collect();
        assert_eq!(keys, [ZONE_KEY, REGION_KEY]);
        assert_eq!(out.metadata.labels.unwrap().len(), 2, "labels kept");
    }
}
