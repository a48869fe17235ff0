//! Unit tests of the pure capacity decisions.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{
    CSIPersistentVolumeSource, Node, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm,
    PersistentVolume, PersistentVolumeSpec, PersistentVolumeStatus, VolumeNodeAffinity,
};
use k8s_openapi::api::storage::v1::{
    CSINode, CSINodeDriver, CSINodeSpec, CSIStorageCapacity, StorageClass,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    LabelSelector, LabelSelectorRequirement, ObjectMeta, OwnerReference, Time,
};

use super::*;
use crate::names::{LABEL_DRIVER_NAME, LABEL_MANAGED_BY};

const DRIVER: &str = "drv.example.com";
const ZONE: &str = "topology.example.com/zone";

fn identity() -> Identity {
    Identity {
        driver: DRIVER.into(),
        managed_by: MANAGED_BY_CENTRAL.into(),
    }
}

fn seg(pairs: &[(&str, &str)]) -> Segment {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn key(class: &str, zone: &str) -> Key {
    Key {
        class: class.into(),
        segment: seg(&[(ZONE, zone)]),
    }
}

fn class(name: &str, provisioner: &str, mode: Option<&str>) -> StorageClass {
    StorageClass {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        provisioner: provisioner.into(),
        volume_binding_mode: mode.map(Into::into),
        ..Default::default()
    }
}

fn object(name: &str, key: &Key, capacity: &str, labels: &[(&str, &str)]) -> CSIStorageCapacity {
    CSIStorageCapacity {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("kube-system".into()),
            resource_version: Some("7".into()),
            labels: Some(
                labels
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            ),
            ..Default::default()
        },
        storage_class_name: key.class.clone(),
        node_topology: Some(LabelSelector {
            match_labels: Some(key.segment.clone()),
            match_expressions: None,
        }),
        capacity: Some(Quantity(capacity.into())),
        maximum_volume_size: None,
    }
}

fn ours(name: &str, key: &Key, capacity: &str) -> CSIStorageCapacity {
    object(
        name,
        key,
        capacity,
        &[
            (LABEL_DRIVER_NAME, DRIVER),
            (LABEL_MANAGED_BY, MANAGED_BY_CENTRAL),
        ],
    )
}

fn owner(uid: &str) -> OwnerReference {
    OwnerReference {
        api_version: "apps/v1".into(),
        kind: "ReplicaSet".into(),
        name: "csi-provisioner-5d8f".into(),
        uid: uid.into(),
        controller: Some(true),
        block_owner_deletion: None,
    }
}

#[test]
fn managed_by_is_upstreams_id_including_the_shortening_of_long_node_names() {
    assert_eq!(managed_by_id(None), "external-provisioner");
    assert_eq!(managed_by_id(Some("node01")), "external-provisioner-node01");
    let a = |n: usize| format!("node{}", "a".repeat(n));
    // Exactly 63 characters stays as is.
    assert_eq!(
        managed_by_id(Some(&a(38))),
        format!("external-provisioner-{}", a(38))
    );
    // Values upstream's own tests expect for the same node names.
    assert_eq!(
        managed_by_id(Some(&a(39))),
        format!("external-p-53f40b57-{}", a(39))
    );
    assert_eq!(managed_by_id(Some(&a(48))), format!("e-53f40b57-{}", a(48)));
    assert_eq!(managed_by_id(Some(&a(49))), "external-provisioner-a3607ff1");
    assert_eq!(managed_by_id(Some(&a(63))), "external-provisioner-df38e37f");
    for n in 0..80 {
        assert!(managed_by_id(Some(&a(n))).len() <= 63);
    }
}

#[test]
fn only_our_delayed_classes_get_objects_unless_immediate_binding_is_asked_for() {
    let all = [
        class("wffc", DRIVER, Some("WaitForFirstConsumer")),
        class("immediate", DRIVER, Some("Immediate")),
        class("unset", DRIVER, None),
        class("other", "other.example.com", Some("WaitForFirstConsumer")),
    ];
    assert_eq!(
        classes(DRIVER, false, &all),
        BTreeSet::from(["wffc".to_owned()])
    );
    assert_eq!(
        classes(DRIVER, true, &all),
        BTreeSet::from(["wffc".into(), "immediate".into(), "unset".into()])
    );
}

fn csinode(name: &str, driver: &str, keys: Option<&[&str]>) -> CSINode {
    CSINode {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        spec: CSINodeSpec {
            drivers: vec![CSINodeDriver {
                name: driver.into(),
                node_id: name.into(),
                topology_keys: keys.map(|k| k.iter().map(|s| s.to_string()).collect()),
                ..Default::default()
            }],
        },
    }
}

fn node(name: &str, labels: &[(&str, &str)]) -> Arc<Node> {
    Arc::new(Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some(
                labels
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            ),
            ..Default::default()
        },
        ..Default::default()
    })
}

#[test]
fn segments_come_from_csinodes_of_our_driver_and_their_nodes_labels_deduplicated() {
    const HOST: &str = "kubernetes.io/hostname";
    let csinodes = [
        csinode("n1", DRIVER, Some(&[ZONE, HOST])),
        csinode("n2", DRIVER, Some(&[ZONE])),
        csinode("n3", DRIVER, Some(&[ZONE])), // same zone as n2: one segment
        csinode("n4", DRIVER, Some(&[ZONE])), // label not written yet: skipped
        csinode("n5", DRIVER, Some(&[ZONE])), // no Node object: skipped
        csinode("n6", "other.example.com", Some(&[ZONE])),
    ];
    let nodes: BTreeMap<&str, Arc<Node>> = BTreeMap::from([
        ("n1", node("n1", &[(ZONE, "a"), (HOST, "n1")])),
        ("n2", node("n2", &[(ZONE, "b")])),
        ("n3", node("n3", &[(ZONE, "b")])),
        ("n4", node("n4", &[])),
        ("n6", node("n6", &[(ZONE, "c")])),
    ]);
    let got = segments(DRIVER, &csinodes, |n| nodes.get(n).cloned());
    assert_eq!(
        got,
        BTreeSet::from([seg(&[(ZONE, "a"), (HOST, "n1")]), seg(&[(ZONE, "b")])])
    );
    // A driver without topology keys: one empty segment, matching every node.
    let flat = [csinode("n1", DRIVER, None)];
    assert_eq!(
        segments(DRIVER, &flat, |n| nodes.get(n).cloned()),
        BTreeSet::from([Segment::new()])
    );
}

#[test]
fn desired_is_every_class_in_every_segment() {
    let classes = BTreeSet::from(["a".to_owned(), "b".to_owned()]);
    let segments = BTreeSet::from([seg(&[(ZONE, "1")]), seg(&[(ZONE, "2")])]);
    let want: BTreeSet<Key> = [key("a", "1"), key("a", "2"), key("b", "1"), key("b", "2")].into();
    assert_eq!(desired(&classes, &segments), want);
    assert!(desired(&BTreeSet::new(), &segments).is_empty());
}

#[test]
fn diff_adopts_matching_objects_creates_missing_and_deletes_obsolete_and_duplicates() {
    let want: BTreeSet<Key> = [key("fast", "1"), key("fast", "2"), key("slow", "1")].into();
    let mut old = ours("csisc-old", &key("fast", "1"), "1Gi");
    old.metadata.creation_timestamp = Some(Time("2025-01-01T00:00:00Z".parse().unwrap()));
    let mut young = ours("csisc-aaa", &key("fast", "1"), "1Gi");
    young.metadata.creation_timestamp = Some(Time("2025-06-01T00:00:00Z".parse().unwrap()));
    let actual = [
        young,
        old,
        ours("csisc-gone-class", &key("removed", "1"), "1Gi"),
        ours("csisc-gone-zone", &key("slow", "9"), "1Gi"),
        // Another driver's, another instance's and an unlabelled object: never touched.
        object(
            "theirs",
            &key("slow", "1"),
            "1Gi",
            &[
                (LABEL_DRIVER_NAME, "x"),
                (LABEL_MANAGED_BY, MANAGED_BY_CENTRAL),
            ],
        ),
        object(
            "node-a",
            &key("slow", "1"),
            "1Gi",
            &[
                (LABEL_DRIVER_NAME, DRIVER),
                (LABEL_MANAGED_BY, "external-provisioner-a"),
            ],
        ),
        object("bare", &key("slow", "1"), "1Gi", &[]),
    ]
    .map(Arc::new);
    let d = diff(&identity(), &want, &actual);
    assert_eq!(
        d.existing,
        BTreeMap::from([(key("fast", "1"), "csisc-old".to_owned())]),
        "the oldest of two objects for one key is kept"
    );
    assert_eq!(
        d.missing,
        BTreeSet::from([key("fast", "2"), key("slow", "1")])
    );
    assert_eq!(
        d.obsolete,
        ["csisc-aaa", "csisc-gone-class", "csisc-gone-zone"]
    );
}

#[test]
fn an_object_with_match_expressions_or_being_deleted_is_not_adopted() {
    let want: BTreeSet<Key> = [key("fast", "1")].into();
    let mut expr = ours("expr", &key("fast", "1"), "1Gi");
    expr.node_topology.as_mut().unwrap().match_expressions = Some(vec![LabelSelectorRequirement {
        key: ZONE.into(),
        operator: "Exists".into(),
        values: None,
    }]);
    let mut deleting = ours("deleting", &key("fast", "1"), "1Gi");
    deleting.metadata.deletion_timestamp = Some(Time("2025-01-01T00:00:00Z".parse().unwrap()));
    let d = diff(&identity(), &want, &[Arc::new(expr), Arc::new(deleting)]);
    assert!(d.existing.is_empty());
    assert_eq!(d.obsolete, ["expr"]);
    assert_eq!(d.missing, want);
}

#[test]
fn a_missing_object_is_created_with_upstreams_labels_name_prefix_and_owner() {
    let k = key("fast", "1");
    let reported = Reported {
        available: 10 << 30,
        maximum_volume_size: Some(1 << 30),
    };
    let Write::Create(obj) = decide(
        &identity(),
        "kube-system",
        Some(&owner("u1")),
        &k,
        reported,
        None,
    ) else {
        panic!("expected a create");
    };
    assert_eq!(obj.metadata.generate_name.as_deref(), Some("csisc-"));
    assert_eq!(obj.metadata.namespace.as_deref(), Some("kube-system"));
    assert!(identity().manages(&obj));
    assert_eq!(obj.metadata.owner_references, Some(vec![owner("u1")]));
    assert_eq!(obj.storage_class_name, "fast");
    assert_eq!(key_of(&obj), Some(k.clone()));
    assert_eq!(obj.capacity, Some(Quantity("10Gi".into())));
    assert_eq!(obj.maximum_volume_size, Some(Quantity("1Gi".into())));
    // Zero capacity is still published, and no owner with level -1.
    let Write::Create(obj) = decide(
        &identity(),
        "ns",
        None,
        &k,
        Reported {
            available: 0,
            maximum_volume_size: None,
        },
        None,
    ) else {
        panic!("expected a create");
    };
    assert_eq!(obj.capacity, Some(Quantity("0".into())));
    assert_eq!(obj.maximum_volume_size, None);
    assert_eq!(obj.metadata.owner_references, None);
}

#[test]
fn an_unchanged_capacity_writes_nothing_whatever_the_quantity_spelling() {
    let k = key("fast", "1");
    let mut existing = ours("csisc-1", &k, "1073741824"); // written by someone as plain bytes
    existing.maximum_volume_size = Some(Quantity("512Mi".into()));
    existing.metadata.owner_references = Some(vec![owner("u1")]);
    let reported = Reported {
        available: 1 << 30,
        maximum_volume_size: Some(512 << 20),
    };
    assert_eq!(
        decide(
            &identity(),
            "ns",
            Some(&owner("u1")),
            &k,
            reported,
            Some(&existing)
        ),
        Write::Nothing
    );
    assert_eq!(
        decide(&identity(), "ns", None, &k, reported, Some(&existing)),
        Write::Nothing,
        "without an owner the references are left alone"
    );
}

#[test]
fn a_changed_value_or_a_missing_owner_updates_the_existing_object_in_place() {
    let k = key("fast", "1");
    let mut existing = ours("csisc-1", &k, "1Gi");
    existing.metadata.owner_references = Some(vec![owner("u1")]);
    let shrunk = Reported {
        available: 512 << 20,
        maximum_volume_size: None,
    };
    let Write::Update(obj) = decide(
        &identity(),
        "ns",
        Some(&owner("u1")),
        &k,
        shrunk,
        Some(&existing),
    ) else {
        panic!("expected an update");
    };
    assert_eq!(obj.metadata.name.as_deref(), Some("csisc-1"));
    assert_eq!(obj.metadata.resource_version.as_deref(), Some("7"));
    assert_eq!(obj.capacity, Some(Quantity("512Mi".into())));
    assert_eq!(obj.metadata.owner_references, Some(vec![owner("u1")]));

    // Maximum volume size newly reported.
    let same = Reported {
        available: 1 << 30,
        maximum_volume_size: Some(1 << 20),
    };
    assert!(matches!(
        decide(&identity(), "ns", Some(&owner("u1")), &k, same, Some(&existing)),
        Write::Update(o) if o.maximum_volume_size == Some(Quantity("1Mi".into()))
    ));

    // An object adopted from another owner (e.g. an earlier ReplicaSet) gets ours appended.
    let unchanged = Reported {
        available: 1 << 30,
        maximum_volume_size: None,
    };
    let Write::Update(obj) = decide(
        &identity(),
        "ns",
        Some(&owner("u2")),
        &k,
        unchanged,
        Some(&existing),
    ) else {
        panic!("expected an update");
    };
    assert_eq!(
        obj.metadata.owner_references,
        Some(vec![owner("u1"), owner("u2")])
    );
}

fn pv_with(affinity: Option<Vec<NodeSelectorTerm>>, class: Option<&str>) -> PersistentVolume {
    PersistentVolume {
        spec: Some(PersistentVolumeSpec {
            csi: Some(CSIPersistentVolumeSource {
                driver: DRIVER.into(),
                volume_handle: "vol-1".into(),
                ..Default::default()
            }),
            storage_class_name: class.map(Into::into),
            persistent_volume_reclaim_policy: Some("Delete".into()),
            node_affinity: affinity.map(|terms| VolumeNodeAffinity {
                required: Some(NodeSelector {
                    node_selector_terms: terms,
                }),
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn term(pairs: &[(&str, &[&str])], op: &str) -> NodeSelectorTerm {
    NodeSelectorTerm {
        match_expressions: Some(
            pairs
                .iter()
                .map(|(k, v)| NodeSelectorRequirement {
                    key: k.to_string(),
                    operator: op.into(),
                    values: Some(v.iter().map(|s| s.to_string()).collect()),
                })
                .collect(),
        ),
        match_fields: None,
    }
}

/// What a newly created PV of `driver` refreshes (`None`: nothing).
fn created(driver: &str, pv: &PersistentVolume) -> Option<Affected> {
    match volume_change(driver, pv) {
        VolumeChange::Created(affected) => Some(affected),
        VolumeChange::Unchanged => None,
        other => panic!("a new PV read as {other:?}"),
    }
}

#[test]
fn a_volume_refreshes_its_affinity_segments_or_without_affinity_its_class() {
    let pv = pv_with(
        Some(vec![
            term(&[(ZONE, &["1"])], "In"),
            term(&[(ZONE, &["2", "3"])], "In"), // not a segment
            term(&[(ZONE, &["4"])], "NotIn"),   // not a segment
        ]),
        Some("fast"),
    );
    let affected = created(DRIVER, &pv).unwrap();
    assert_eq!(affected, Affected::Segments(vec![seg(&[(ZONE, "1")])]));
    assert!(affected.covers(&key("fast", "1")));
    assert!(affected.covers(&key("slow", "1")));
    assert!(!affected.covers(&key("fast", "2")));

    let flat = created(DRIVER, &pv_with(None, Some("fast"))).unwrap();
    assert!(flat.covers(&key("fast", "1")) && flat.covers(&key("fast", "2")));
    assert!(!flat.covers(&key("slow", "1")));
    assert_eq!(created(DRIVER, &pv_with(None, None)), None);
}

#[test]
fn a_new_pv_refreshes_at_once_a_deleted_volume_once_its_pv_is_gone_and_others_never() {
    let with_phase = |phase: Option<&str>| {
        let mut pv = pv_with(None, Some("fast"));
        pv.status = phase.map(|p| PersistentVolumeStatus {
            phase: Some(p.into()),
            ..Default::default()
        });
        pv
    };
    let fast = Affected::Class("fast".into());
    for phase in [None, Some("Pending")] {
        assert_eq!(
            volume_change(DRIVER, &with_phase(phase)),
            VolumeChange::Created(fast.clone()),
            "{phase:?}"
        );
    }
    for phase in ["Released", "Failed"] {
        assert_eq!(
            volume_change(DRIVER, &with_phase(Some(phase))),
            VolumeChange::Ending(fast.clone()),
            "{phase}"
        );
    }
    for phase in ["Available", "Bound"] {
        assert_eq!(
            volume_change(DRIVER, &with_phase(Some(phase))),
            VolumeChange::Unchanged,
            "{phase}"
        );
    }
    let mut deleting = with_phase(Some("Bound"));
    deleting.metadata.deletion_timestamp = Some(Time("2025-01-01T00:00:00Z".parse().unwrap()));
    assert_eq!(volume_change(DRIVER, &deleting), VolumeChange::Ending(fast));
    // A kept volume's space never comes back: its PV's going refreshes nothing.
    for mut kept in [with_phase(Some("Released")), deleting] {
        kept.spec.as_mut().unwrap().persistent_volume_reclaim_policy = Some("Retain".into());
        assert_eq!(volume_change(DRIVER, &kept), VolumeChange::Unchanged);
    }
    // Another driver's volumes take nothing from our pools.
    assert_eq!(
        volume_change("other.csi.example", &with_phase(None)),
        VolumeChange::Unchanged
    );
}

#[test]
fn a_migrated_in_tree_volume_refreshes_the_driver_segment_of_its_zone() {
    use k8s_openapi::api::core::v1::AWSElasticBlockStoreVolumeSource;
    let mut pv = pv_with(
        Some(vec![term(
            &[("topology.kubernetes.io/zone", &["us-east-1a"])],
            "In",
        )]),
        Some("gp2"),
    );
    let spec = pv.spec.as_mut().unwrap();
    spec.csi = None;
    spec.aws_elastic_block_store = Some(AWSElasticBlockStoreVolumeSource {
        volume_id: "aws://us-east-1a/vol-0123456789abcdef0".into(),
        ..Default::default()
    });
    let zone = |z: &str| Key {
        class: "gp2".into(),
        segment: seg(&[("topology.ebs.csi.aws.com/zone", z)]),
    };
    let migrated = created("ebs.csi.aws.com", &pv).unwrap();
    assert!(migrated.covers(&zone("us-east-1a")), "{migrated:?}");
    assert!(!migrated.covers(&zone("us-east-1b")));
    // Another driver did not take the plugin over: the PV is not its volume.
    assert_eq!(created(DRIVER, &pv), None);
}

#[test]
fn the_owner_chain_follows_only_the_controlling_reference() {
    let mut other = owner("x");
    other.controller = None;
    let refs = [other, owner("c")];
    assert_eq!(controller_of(&refs).map(|r| r.uid.as_str()), Some("c"));
    assert_eq!(controller_of(&refs[..1]), None);
}

#[test]
fn orphaned_objects_are_those_of_node_mode_ids_without_a_node() {
    let node_object = |name: &str, id: &str| {
        object(
            name,
            &key("fast", "1"),
            "1Gi",
            &[(LABEL_DRIVER_NAME, DRIVER), (LABEL_MANAGED_BY, id)],
        )
    };
    let long = format!("node{}", "a".repeat(60));
    let objects = [
        node_object("a1", "external-provisioner-node-a"),
        node_object("gone2", "external-provisioner-node-gone"),
        node_object("gone1", "external-provisioner-node-gone"),
        node_object("long", &managed_by_id(Some(&long))),
        node_object("central", MANAGED_BY_CENTRAL),
        object(
            "other",
            &key("fast", "1"),
            "1Gi",
            &[
                (LABEL_DRIVER_NAME, "x"),
                (LABEL_MANAGED_BY, "external-provisioner-node-gone"),
            ],
        ),
        object(
            "unlabelled",
            &key("fast", "1"),
            "1Gi",
            &[(LABEL_DRIVER_NAME, DRIVER)],
        ),
    ];
    let got = orphaned(DRIVER, &objects, ["node-a", long.as_str()]);
    assert_eq!(
        got,
        BTreeMap::from([(
            "external-provisioner-node-gone".to_owned(),
            vec!["gone1".to_owned(), "gone2".to_owned()]
        )])
    );
    assert!(orphaned(DRIVER, &objects, ["node-a", "node-gone", long.as_str()]).is_empty());
}
