use super::*;
use crate::testing::{node, pv};
use k8s_openapi::api::core::v1::{NodeSelector, NodeSelectorRequirement, NodeSelectorTerm};
use kube::core::Status;

fn api_error(code: u16) -> kube::Error {
    kube::Error::Api(Status::failure("boom", "").with_code(code).boxed())
}

#[test]
fn an_empty_label_list_is_absence_and_a_failed_list_is_not() {
    let found: Result<Vec<k8s_openapi::api::core::v1::Node>, kube::Error> =
        Ok(vec![node("n1").build()]);
    assert!(matches!(
        NodeLookup::from_list(&found),
        NodeLookup::Found { .. }
    ));
    let empty: Result<Vec<k8s_openapi::api::core::v1::Node>, kube::Error> = Ok(vec![]);
    assert_eq!(NodeLookup::from_list(&empty), NodeLookup::NotFound);
    let failed: Result<Vec<k8s_openapi::api::core::v1::Node>, kube::Error> = Err(api_error(503));
    assert!(matches!(
        NodeLookup::from_list(&failed),
        NodeLookup::Failed { .. }
    ));
}

#[test]
fn driver_topology_keys_count_as_per_node_only_when_their_value_names_the_node() {
    let segments: std::collections::BTreeMap<String, String> = [
        ("topology.hostpath.csi/node".to_owned(), "n1".to_owned()),
        ("topology.kubernetes.io/zone".to_owned(), "z1".to_owned()),
    ]
    .into();
    let keys = PerNodeKeys::from_node("n1", Some("n1.example"), &segments);
    assert!(keys.contains("topology.hostpath.csi/node"));
    assert!(keys.contains(HOSTNAME_LABEL));
    assert!(!keys.contains("topology.kubernetes.io/zone"));

    let by_topology = pv("pv-1")
        .node_affinity([
            ("topology.hostpath.csi/node", "n7"),
            ("topology.kubernetes.io/zone", "z1"),
        ])
        .build();
    let affinity = by_topology.spec.as_ref().unwrap().node_affinity.as_ref();
    assert_eq!(
        pin_of(affinity, &keys, None),
        Pin::Node(NodeQuery::ByLabel {
            key: "topology.hostpath.csi/node".into(),
            value: "n7".into()
        })
    );
    assert_eq!(pin_of(affinity, &PerNodeKeys::default(), None), Pin::Spread);
}

#[test]
fn controller_mode_takes_a_driver_key_as_per_node_only_if_every_node_agrees() {
    use crate::testing::csinode;
    let csinodes = [
        csinode("n1")
            .driver("d", "n1", ["topo/node", "topo/zone"])
            .build(),
        csinode("n2")
            .driver("d", "n2", ["topo/node", "topo/zone"])
            .driver("other", "n2", ["other/key"])
            .build(),
    ];
    let labels: BTreeMap<String, BTreeMap<String, String>> = [
        (
            "n1".to_owned(),
            [
                ("topo/node", "n1"),
                ("topo/zone", "z1"),
                ("other/key", "n1"),
            ]
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .into(),
        ),
        (
            "n2".to_owned(),
            [
                ("topo/node", "host-2"),
                ("topo/zone", "n2"),
                (HOSTNAME_LABEL, "host-2"),
                ("other/key", "n2"),
            ]
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .into(),
        ),
    ]
    .into();
    let keys = PerNodeKeys::from_cluster("d", &csinodes, |n| labels.get(n));
    assert!(keys.contains("topo/node"), "name on n1, host name on n2");
    assert!(!keys.contains("topo/zone"), "shared on n1 rules it out");
    assert!(!keys.contains("other/key"), "another driver's key");
    assert!(keys.contains(HOSTNAME_LABEL));
}

#[test]
fn affinities_with_several_nodes_or_match_fields_pin_accordingly() {
    let keys = PerNodeKeys::default();
    let two = pv("pv")
        .node_affinity([(HOSTNAME_LABEL, "a")])
        .node_affinity([(HOSTNAME_LABEL, "b")])
        .build();
    assert_eq!(
        pin_of(
            two.spec.as_ref().unwrap().node_affinity.as_ref(),
            &keys,
            None
        ),
        Pin::Spread
    );
    let same = pv("pv")
        .node_affinity([(HOSTNAME_LABEL, "a")])
        .node_affinity([(HOSTNAME_LABEL, "a"), ("zone", "z")])
        .build();
    assert!(matches!(
        pin_of(
            same.spec.as_ref().unwrap().node_affinity.as_ref(),
            &keys,
            None
        ),
        Pin::Node(_)
    ));
    let fields = VolumeNodeAffinity {
        required: Some(NodeSelector {
            node_selector_terms: vec![NodeSelectorTerm {
                match_expressions: None,
                match_fields: Some(vec![NodeSelectorRequirement {
                    key: "metadata.name".into(),
                    operator: "In".into(),
                    values: Some(vec!["n3".into()]),
                }]),
            }],
        }),
    };
    assert_eq!(
        pin_of(Some(&fields), &keys, None),
        Pin::Node(NodeQuery::ByName {
            name: "n3".into(),
            uid: None
        })
    );
    let multi_value = pv("pv").build();
    assert_eq!(
        pin_of(
            multi_value.spec.as_ref().unwrap().node_affinity.as_ref(),
            &keys,
            None
        ),
        Pin::NoAffinity
    );
}

/// Issue 28: a claim selected for node-2 whose volume the driver placed on node-1. The
/// recorded node-2 must not decide: node-1 existing keeps the volume from being answered.
#[test]
fn the_affinity_wins_over_a_recorded_node_it_does_not_pin() {
    let keys = PerNodeKeys::new(["topo/node"]);
    let placed_elsewhere = pv("pv")
        .annotation(names::ANN_NODE_NAME, "node-2")
        .annotation(names::ANN_NODE_UID, "uid-2")
        .node_affinity([("topo/node", "node-1")])
        .build();
    for mode in [Mode::Controller, Mode::Node] {
        assert_eq!(
            node_query(&placed_elsewhere, mode, &keys),
            Ok(NodeQuery::ByLabel {
                key: "topo/node".into(),
                value: "node-1".into()
            })
        );
    }
    let placed_there = pv("pv")
        .annotation(names::ANN_NODE_NAME, "node-1")
        .annotation(names::ANN_NODE_UID, "uid-1")
        .node_affinity([("topo/node", "node-1")])
        .build();
    assert_eq!(
        node_query(&placed_there, Mode::Controller, &keys),
        Ok(NodeQuery::ByName {
            name: "node-1".into(),
            uid: Some("uid-1".into())
        })
    );
}
