//! The plugin table and upstream's top-level translation tests (restated).

use super::*;
use crate::migration::topology::{BETA_REGION, BETA_ZONE, GA_REGION, GA_ZONE};
use k8s_openapi::api::core::v1::{
    GCEPersistentDiskVolumeSource, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm,
    VolumeNodeAffinity,
};

/// Node-affinity terms as (key, values) requirements.
type Terms = Vec<Vec<(String, Vec<String>)>>;

#[test]
fn names_map_both_ways_for_the_seven_plugins() {
    for p in PLUGINS {
        assert_eq!(Plugin::of_driver(p.csi_name()), Some(p));
        assert_eq!(
            PLUGINS
                .into_iter()
                .find(|q| q.in_tree_name() == p.in_tree_name()),
            Some(p)
        );
    }
    assert_eq!(Plugin::of_driver("kubernetes.io/gce-pd"), None);
    assert_eq!(Plugin::GcePd.csi_name(), "pd.csi.storage.gke.io");
    assert_eq!(Plugin::AwsEbs.in_tree_name(), "kubernetes.io/aws-ebs");
}

#[test]
fn only_a_pv_of_the_drivers_own_plugin_is_translated() {
    let mut pv = PersistentVolume::default();
    assert_eq!(Plugin::of_in_tree_pv(&pv), None);
    assert!(
        as_csi("pd.csi.storage.gke.io", &pv).is_none(),
        "no in-tree source"
    );
    pv.spec.get_or_insert_default().gce_persistent_disk = Some(GCEPersistentDiskVolumeSource {
        pd_name: "d".into(),
        ..Default::default()
    });
    assert_eq!(Plugin::of_in_tree_pv(&pv), Some(Plugin::GcePd));
    assert!(
        as_csi("ebs.csi.aws.com", &pv).is_none(),
        "another plugin's volume"
    );
    assert!(
        as_csi("mock.csi.rs", &pv).is_none(),
        "a driver without migration"
    );
    let csi = as_csi("pd.csi.storage.gke.io", &pv).unwrap().unwrap();
    assert_eq!(
        csi.spec.unwrap().csi.unwrap().driver,
        "pd.csi.storage.gke.io"
    );
}

fn gce(labels: &[(&str, &str)], terms: Vec<Vec<(&str, &[&str])>>) -> PersistentVolume {
    let mut pv = PersistentVolume::default();
    if !labels.is_empty() {
        pv.metadata.labels = Some(
            labels
                .iter()
                .map(|(k, v)| ((*k).into(), (*v).into()))
                .collect(),
        );
    }
    let spec = pv.spec.get_or_insert_default();
    spec.gce_persistent_disk = Some(GCEPersistentDiskVolumeSource {
        pd_name: "test-disk".into(),
        ..Default::default()
    });
    if !terms.is_empty() {
        spec.node_affinity = Some(VolumeNodeAffinity {
            required: Some(NodeSelector {
                node_selector_terms: terms
                    .into_iter()
                    .map(|t| NodeSelectorTerm {
                        match_expressions: Some(
                            t.into_iter()
                                .map(|(k, v)| NodeSelectorRequirement {
                                    key: k.into(),
                                    operator: "In".into(),
                                    values: Some(v.iter().map(|s| (*s).into()).collect()),
                                })
                                .collect(),
                        ),
                        match_fields: None,
                    })
                    .collect(),
            }),
        });
    }
    pv
}

fn affinity(pv: &PersistentVolume) -> Vec<Vec<(String, Vec<String>)>> {
    pv.spec
        .as_ref()
        .and_then(|s| s.node_affinity.as_ref())
        .and_then(|a| a.required.as_ref())
        .map(|r| {
            r.node_selector_terms
                .iter()
                .map(|t| {
                    t.match_expressions
                        .iter()
                        .flatten()
                        .map(|e| (e.key.clone(), e.values.clone().unwrap_or_default()))
                        .collect()
                })
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn in_tree_topology_moves_to_the_driver_key_and_back() {
    let gke = crate::migration::gce_pd::ZONE_KEY;
    let one = |v: &[&str]| {
        vec![vec![(
            gke.to_owned(),
            v.iter().map(|s| (*s).to_owned()).collect(),
        )]]
    };
    let beta = [(BETA_ZONE, "us-east-1a"), (BETA_REGION, "us-east-1")];
    let ga = [(GA_ZONE, "us-east-1a"), (GA_REGION, "us-east-1")];
    let cases: Vec<(PersistentVolume, Terms)> = vec![
        (gce(&beta, vec![]), one(&["us-east-1a"])),
        (gce(&ga, vec![]), one(&["us-east-1a"])),
        (
            gce(&[], vec![vec![(BETA_ZONE, &["us-east-2a"])]]),
            one(&["us-east-2a"]),
        ),
        (
            gce(&[], vec![vec![(gke, &["us-east-2a"])]]),
            one(&["us-east-2a"]),
        ),
        (
            gce(&beta, vec![vec![(BETA_ZONE, &["us-east-2a"])]]),
            one(&["us-east-2a"]),
        ),
        (
            gce(&[(BETA_ZONE, "europe-west1-b__europe-west1-c")], vec![]),
            one(&["europe-west1-b", "europe-west1-c"]),
        ),
        (
            gce(
                &[],
                vec![vec![(GA_ZONE, &["europe-west1-b", "europe-west1-c"])]],
            ),
            one(&["europe-west1-b", "europe-west1-c"]),
        ),
        (
            gce(
                &[(BETA_ZONE, "europe-west1-b__europe-west1-c")],
                vec![vec![(BETA_ZONE, &["europe-west1-f", "europe-west1-g"])]],
            ),
            one(&["europe-west1-f", "europe-west1-g"]),
        ),
    ];
    for (pv, want) in cases {
        let csi = Plugin::GcePd.in_tree_to_csi(&pv).unwrap();
        assert_eq!(affinity(&csi), want, "{:?}", pv.metadata.labels);
        // And back: no CSI key left, a beta or GA zone key instead.
        let back = Plugin::GcePd.csi_to_in_tree(&csi).unwrap();
        let keys: Vec<String> = affinity(&back)
            .into_iter()
            .flatten()
            .map(|(k, _)| k)
            .collect();
        assert!(!keys.iter().any(|k| k == gke), "{keys:?}");
        assert!(
            keys.iter().any(|k| k == GA_ZONE || k == BETA_ZONE),
            "{keys:?}"
        );
    }
    let two = gce(
        &[],
        vec![
            vec![(GA_ZONE, &["europe-west1-f"])],
            vec![(GA_ZONE, &["europe-west1-g"])],
        ],
    );
    assert_eq!(
        affinity(&Plugin::GcePd.in_tree_to_csi(&two).unwrap()),
        vec![
            vec![(gke.to_owned(), vec!["europe-west1-f".to_owned()])],
            vec![(gke.to_owned(), vec!["europe-west1-g".to_owned()])]
        ]
    );
}
