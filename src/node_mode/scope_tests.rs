//! Tests of [`super`].

use std::collections::HashMap;

use super::*;
use crate::model::locate::HOSTNAME_LABEL;
use crate::model::topology::live_instances;
use crate::testing::{DRIVER, csinode, node, pv, pvc};

#[test]
fn node_names_are_label_values_and_overlong_names_are_hashed() {
    assert_eq!(
        label_value("ip-10-0-0-1.ec2.internal"),
        "ip-10-0-0-1.ec2.internal"
    );
    let long = format!("{}.example.com", "a".repeat(60));
    let hashed = label_value(&long);
    assert!(
        hashed.starts_with("hash_") && hashed.len() == 21,
        "{hashed}"
    );
    assert!(is_valid_label_value(&hashed));
    assert_eq!(hashed, label_value(&long), "stable");
    assert!(!is_valid_label_value("-x") && !is_valid_label_value("x/y"));
    assert!(is_valid_label_value(names::LABEL_VALUE_ANY_NODE));
}

#[test]
fn an_instance_watches_its_node_its_host_name_and_unpinned_pvs() {
    let values = instance_label_values("n1", Some("n1.internal"));
    assert_eq!(values, vec!["n1", "n1.internal", "any_node"]);
    assert_eq!(
        instance_label_values("n1", Some("n1")),
        vec!["n1", "any_node"]
    );
    assert_eq!(
        own_pv_selector(DRIVER, &values),
        "csi-provisioner.rs/driver=mock.csi.test,csi-provisioner.rs/node in (any_node,n1,n1.internal)"
    );
    assert_eq!(
        node_pv_selector(DRIVER, ["dead-1"]),
        "csi-provisioner.rs/driver=mock.csi.test,csi-provisioner.rs/node in (dead-1)"
    );
    assert_eq!(
        driver_pv_selector(DRIVER),
        "csi-provisioner.rs/driver=mock.csi.test"
    );
    assert_eq!(unlabelled_pv_selector(), "!csi-provisioner.rs/driver");
    let config = own_pv_watch(DRIVER, "n1", None);
    assert_eq!(config.page_size, Some(PAGE_SIZE));
    assert_eq!(
        config.label_selector.as_deref(),
        Some("csi-provisioner.rs/driver=mock.csi.test,csi-provisioner.rs/node in (any_node,n1)")
    );
}

#[test]
fn a_nodes_label_values_are_its_name_and_its_per_node_label_values() {
    let keys = PerNodeKeys::new(["topology.hostpath.csi/node"]);
    let n = node("n1")
        .labels([
            (HOSTNAME_LABEL, "n1.internal"),
            ("topology.hostpath.csi/node", "n1"),
            ("topology.kubernetes.io/zone", "z1"),
        ])
        .build();
    let values: Vec<String> = node_label_values(&n.metadata, &keys).into_iter().collect();
    assert_eq!(values, vec!["n1", "n1.internal"]);
}

#[test]
fn new_pvs_are_labelled_with_our_node_only_when_pinned_to_it() {
    let keys = PerNodeKeys::new(["topology.hostpath.csi/node"]);
    let pinned = pv("p")
        .node_affinity([("topology.hostpath.csi/node", "n1")])
        .build();
    let labels = new_pv_labels(
        DRIVER,
        "n1",
        pinned.spec.as_ref().unwrap().node_affinity.as_ref(),
        &keys,
    );
    assert_eq!(labels[names::LABEL_PV_NODE], "n1");
    assert_eq!(labels[names::LABEL_PV_DRIVER], DRIVER);
    let zonal = pv("p")
        .node_affinity([("topology.kubernetes.io/zone", "z")])
        .build();
    let labels = new_pv_labels(
        DRIVER,
        "n1",
        zonal.spec.as_ref().unwrap().node_affinity.as_ref(),
        &keys,
    );
    assert_eq!(labels[names::LABEL_PV_NODE], "any_node");
    assert_eq!(
        new_pv_labels(DRIVER, "n1", None, &keys)[names::LABEL_PV_NODE],
        "any_node"
    );
}

#[test]
fn a_new_pv_gets_our_labels_next_to_its_own() {
    let segments: HashMap<String, String> =
        [("topology.hostpath.csi/node".to_owned(), "n1".to_owned())].into();
    let mut new = pv("p")
        .node_affinity([("topology.hostpath.csi/node", "n1")])
        .label("team", "a")
        .build();
    label_new_pv(&mut new, DRIVER, "n1", &segments);
    let labels = new.metadata.labels.unwrap();
    assert_eq!(labels["team"], "a");
    assert_eq!(labels[names::LABEL_PV_NODE], "n1");
    assert_eq!(labels[names::LABEL_PV_DRIVER], DRIVER);
}

#[test]
fn the_upgrade_sweep_labels_only_our_unlabelled_pvs() {
    let keys = PerNodeKeys::default();
    let legacy = pv("p").node_affinity([(HOSTNAME_LABEL, "host-3")]).build();
    let labels = existing_pv_labels(&legacy, DRIVER, &keys).unwrap();
    assert_eq!(labels[names::LABEL_PV_NODE], "host-3");
    assert_eq!(
        label_patch(&labels),
        json!({"metadata": {"labels": {
            "csi-provisioner.rs/driver": DRIVER,
            "csi-provisioner.rs/node": "host-3"}}})
    );
    let recorded = pv("p")
        .annotation(names::ANN_NODE_NAME, "n5")
        .node_affinity([(HOSTNAME_LABEL, "host-5")])
        .build();
    assert_eq!(
        existing_pv_labels(&recorded, DRIVER, &keys).unwrap()[names::LABEL_PV_NODE],
        "n5"
    );
    let done = pv("p")
        .node_affinity([(HOSTNAME_LABEL, "host-3")])
        .label(names::LABEL_PV_DRIVER, DRIVER)
        .label(names::LABEL_PV_NODE, "host-3")
        .build();
    assert_eq!(existing_pv_labels(&done, DRIVER, &keys), None);
    let foreign = pv("p").driver("other.csi").build();
    assert_eq!(existing_pv_labels(&foreign, DRIVER, &keys), None);
    let shared = pv("p").build();
    assert_eq!(
        existing_pv_labels(&shared, DRIVER, &keys).unwrap()[names::LABEL_PV_NODE],
        "any_node"
    );
}

#[test]
fn an_unlabelled_pv_is_labelled_by_its_nodes_instance_or_by_one_ranked_instance_when_unpinned() {
    let keys = PerNodeKeys::default();
    let fleet = ["n1", "n2", "n3"];
    let own = |me: &str, host: &str| -> Vec<String> {
        instance_label_values(me, Some(host))
            .into_iter()
            .filter(|v| v != names::LABEL_VALUE_ANY_NODE)
            .collect()
    };
    let writers = |pv: &PersistentVolume, live: &[&str]| -> Vec<String> {
        fleet
            .iter()
            .filter(|me| {
                let own = own(me, &format!("host-{me}"));
                labels_written_here(pv, DRIVER, &keys, &own, me, || {
                    live.iter().map(|s| (*s).to_owned()).collect()
                })
                .is_some()
            })
            .map(|me| (*me).to_owned())
            .collect()
    };
    // Pinned by host name or by name: that node's instance only, whoever ranks first.
    let by_host = pv("p").node_affinity([(HOSTNAME_LABEL, "host-n2")]).build();
    assert_eq!(writers(&by_host, &fleet), vec!["n2"]);
    let recorded = pv("p").annotation(names::ANN_NODE_NAME, "n3").build();
    assert_eq!(writers(&recorded, &fleet), vec!["n3"]);
    // A node without an instance: nobody (the sweep does).
    let gone = pv("p").node_affinity([(HOSTNAME_LABEL, "host-n9")]).build();
    assert!(writers(&gone, &fleet).is_empty());
    // Of no single node: exactly one live instance, the first in rendezvous order of its name.
    for name in ["shared-1", "shared-2", "shared-3", "shared-4"] {
        let shared = pv(name).build();
        let first = crate::rendezvous::rendezvous_order(name, fleet)[0];
        assert_eq!(writers(&shared, &fleet), vec![first]);
        // An instance whose driver is not registered is not live and never writes.
        let without: Vec<&str> = fleet.iter().copied().filter(|n| *n != first).collect();
        let w = writers(&shared, &without);
        assert_eq!(w.len(), 1);
        assert_ne!(w[0], first);
    }
    // Not ours, or labelled already: nobody.
    let foreign = pv("p").driver("other.csi").build();
    assert!(writers(&foreign, &fleet).is_empty());
    let done = pv("p")
        .label(names::LABEL_PV_DRIVER, DRIVER)
        .label(names::LABEL_PV_NODE, names::LABEL_VALUE_ANY_NODE)
        .build();
    assert!(writers(&done, &fleet).is_empty());
    let labels = labels_written_here(&by_host, DRIVER, &keys, &own("n2", "host-n2"), "n2", || {
        fleet.iter().map(|s| (*s).to_owned()).collect()
    })
    .unwrap();
    assert_eq!(labels[names::LABEL_PV_NODE], "host-n2");
    assert_eq!(labels[names::LABEL_PV_DRIVER], DRIVER);
}

#[test]
fn the_sweep_fetches_only_pvs_whose_node_is_not_in_the_cache() {
    let exists = |n: &str, uid: Option<&str>| n == "alive" && uid.is_none_or(|u| u == "uid-1");
    let recorded = |n: &str| pv("p").annotation(names::ANN_NODE_NAME, n).build().metadata;
    let reused = pv("p")
        .annotation(names::ANN_NODE_NAME, "alive")
        .annotation(names::ANN_NODE_UID, "uid-0")
        .build()
        .metadata;
    assert!(sweep_suspect(&reused, exists), "same name, another machine");
    let labelled = |v: &str| pv("p").label(names::LABEL_PV_NODE, v).build().metadata;
    assert!(sweep_suspect(&recorded("dead"), exists));
    assert!(!sweep_suspect(&recorded("alive"), exists));
    assert!(sweep_suspect(&labelled("dead"), exists));
    assert!(!sweep_suspect(&labelled("alive"), exists));
    assert!(!sweep_suspect(
        &labelled(names::LABEL_VALUE_ANY_NODE),
        exists
    ));
    assert!(sweep_suspect(&labelled("hash_0123456789abcdef"), exists));
    assert!(!sweep_suspect(&pv("p").build().metadata, exists));
}

#[test]
fn live_instances_are_the_nodes_whose_csinode_lists_our_driver() {
    let nodes = [
        csinode("b").driver(DRIVER, "b", ["k"]).build(),
        csinode("a").driver(DRIVER, "a", ["k"]).build(),
        csinode("c").driver("other.csi", "c", ["k"]).build(),
        csinode("d").build(),
    ];
    assert_eq!(live_instances(&nodes, DRIVER), vec!["a", "b"]);
}

#[test]
fn a_claim_with_our_intent_and_no_selected_node_is_kept_by_every_instance_even_when_deleting() {
    let rescheduled = pvc("ns", "r")
        .provisioner(DRIVER)
        .finalizer(names::FINALIZER_PROVISIONING_INTENT)
        .deleting()
        .build();
    for me in ["n1", "n2"] {
        assert!(cached_claim(&rescheduled.metadata, DRIVER, me));
    }
    // Selected to another node: kept too, in case that node is gone for good.
    let elsewhere = pvc("ns", "s")
        .provisioner(DRIVER)
        .selected_node("n2")
        .finalizer(names::FINALIZER_PROVISIONING_INTENT)
        .deleting()
        .build();
    assert!(cached_claim(&elsewhere.metadata, DRIVER, "n1"));
    assert!(cached_claim(&elsewhere.metadata, DRIVER, "n2"));
    // Another driver's intent (the finalizer name is shared by every driver running this
    // sidecar) is none of our business.
    let foreign = pvc("ns", "t")
        .provisioner("other.csi")
        .finalizer(names::FINALIZER_PROVISIONING_INTENT)
        .deleting()
        .build();
    assert!(!cached_claim(&foreign.metadata, DRIVER, "n1"));
}

#[test]
fn the_claim_cache_follows_the_selected_node_and_the_provisioner() {
    let me = "n1";
    let mine = pvc("ns", "a")
        .selected_node("n1")
        .provisioner(DRIVER)
        .build();
    assert!(cached_claim(&mine.metadata, DRIVER, me));
    let unselected = pvc("ns", "b").provisioner(DRIVER).build();
    assert!(cached_claim(&unselected.metadata, DRIVER, me));
    let beta = pvc("ns", "b").beta_provisioner(DRIVER).build();
    assert!(cached_claim(&beta.metadata, DRIVER, me));
    let elsewhere = pvc("ns", "c")
        .selected_node("n2")
        .provisioner(DRIVER)
        .build();
    assert!(cached_claim(&elsewhere.metadata, DRIVER, me));
    let foreign = pvc("ns", "d").provisioner("other.csi").build();
    assert!(!cached_claim(&foreign.metadata, DRIVER, me));
    let waiting_for_consumer = pvc("ns", "e").build();
    assert!(!cached_claim(&waiting_for_consumer.metadata, DRIVER, me));
    let bound = pvc("ns", "f")
        .provisioner(DRIVER)
        .selected_node("n1")
        .annotation(names::ANN_BIND_COMPLETED, "yes")
        .build();
    assert!(!cached_claim(&bound.metadata, DRIVER, "n2"));
    let bound_with_intent = pvc("ns", "f")
        .selected_node("n1")
        .annotation(names::ANN_BIND_COMPLETED, "yes")
        .finalizer(names::FINALIZER_PROVISIONING_INTENT)
        .build();
    assert!(cached_claim(&bound_with_intent.metadata, DRIVER, me));
}

#[test]
fn the_node_mode_cache_keeps_this_nodes_bound_claims_but_not_other_nodes() {
    let bound_here = pvc("ns", "a")
        .selected_node("n1")
        .provisioner(DRIVER)
        .annotation(names::ANN_BIND_COMPLETED, "yes")
        .build();
    assert!(cached_claim(&bound_here.metadata, DRIVER, "n1"));
    assert!(!cached_claim(&bound_here.metadata, DRIVER, "n2"));
    let pending_elsewhere = pvc("ns", "b")
        .selected_node("n2")
        .provisioner(DRIVER)
        .build();
    assert!(cached_claim(&pending_elsewhere.metadata, DRIVER, "n1"));
    let foreign = pvc("ns", "c").provisioner("other.csi").build();
    assert!(!cached_claim(&foreign.metadata, DRIVER, "n1"));
}

/// Node mode with CSI migration: an in-tree PV of the plugin our driver took over, made by others
/// (before migration, say), is labelled as the CSI PV it translates to, so that its instance
/// protects and deletes it; one that does not translate is every instance's, so that its deletion
/// fails in the open; another plugin's is not ours.
#[test]
fn in_tree_pvs_of_our_plugin_made_by_others_are_labelled_as_their_translation() {
    const GCE: &str = "pd.csi.storage.gke.io";
    let in_tree = |source: serde_json::Value| -> PersistentVolume {
        serde_json::from_value(json!({
            "metadata": {"name": "old-pd",
                "annotations": {"pv.kubernetes.io/provisioned-by": "kubernetes.io/gce-pd"}},
            "spec": source,
        }))
        .unwrap()
    };
    let pinned_to_host = in_tree(json!({
        "gcePersistentDisk": {"pdName": "disk-1"},
        "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
            {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["us-central1-b"]},
            {"key": HOSTNAME_LABEL, "operator": "In", "values": ["host-7"]}]}]}},
    }));
    let labels = existing_pv_labels(&pinned_to_host, GCE, &PerNodeKeys::default()).unwrap();
    assert_eq!(labels[names::LABEL_PV_DRIVER], GCE);
    assert_eq!(labels[names::LABEL_PV_NODE], "host-7");
    let zonal = in_tree(json!({
        "gcePersistentDisk": {"pdName": "disk-1"},
        "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
            {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["us-central1-b"]}]}]}},
    }));
    assert_eq!(
        existing_pv_labels(&zonal, GCE, &PerNodeKeys::default()).unwrap()[names::LABEL_PV_NODE],
        names::LABEL_VALUE_ANY_NODE
    );
    // Zones that name no region: the translation fails.
    let mut untranslatable = in_tree(json!({"gcePersistentDisk": {"pdName": "disk-1"}}));
    untranslatable.metadata.labels =
        Some([("topology.kubernetes.io/zone".to_owned(), "a__b".to_owned())].into());
    assert!(crate::migration::as_csi(GCE, &untranslatable).is_some_and(|t| t.is_err()));
    assert_eq!(
        existing_pv_labels(&untranslatable, GCE, &PerNodeKeys::default()).unwrap()
            [names::LABEL_PV_NODE],
        names::LABEL_VALUE_ANY_NODE
    );
    assert_eq!(
        existing_pv_labels(&zonal, "ebs.csi.aws.com", &PerNodeKeys::default()),
        None,
        "another plugin's in-tree PV"
    );
    assert_eq!(
        existing_pv_labels(&zonal, DRIVER, &PerNodeKeys::default()),
        None
    );
}
