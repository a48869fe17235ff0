//! Tests of [`super`].

use super::*;
use crate::testing::{csinode, pv, pvc, sc};
use k8s_openapi::api::core::v1::TopologySelectorTerm;

#[test]
fn exactly_one_live_instance_checks_a_selected_node_and_controller_mode_always_does() {
    use std::sync::Arc;
    let driver = "d.example.com";
    let csinodes: Vec<Arc<CSINode>> = ["n1", "n2", "n3"]
        .iter()
        .map(|n| Arc::new(csinode(n).driver(driver, n, ["k"]).build()))
        .chain([Arc::new(csinode("n4").driver("other", "n4", ["k"]).build())])
        .collect();
    for uid in ["uid-a", "uid-b", "uid-c", "uid-d"] {
        let checkers: Vec<&str> = ["n1", "n2", "n3", "n4"]
            .into_iter()
            .filter(|me| checks_selected_node(me, uid, &csinodes, driver))
            .collect();
        assert_eq!(checkers.len(), 1, "{uid}: {checkers:?}");
        assert_ne!(
            checkers[0], "n4",
            "an instance without our driver never checks"
        );
    }
}

fn me() -> NodeIdentity {
    NodeIdentity {
        name: "n1".to_owned(),
        segments: [
            ("topology.example.com/node".to_owned(), "n1".to_owned()),
            ("topology.example.com/zone".to_owned(), "z1".to_owned()),
        ]
        .into(),
    }
}

fn decide(
    claim: &PersistentVolumeClaim,
    class: Option<&StorageClass>,
    immediate: bool,
) -> ClaimOwnership {
    let me = me();
    check_node(
        claim,
        &OwnershipInputs {
            me: &me,
            driver: "d.example.com",
            topology_supported: true,
            immediate_binding: immediate,
            storage_class: class,
            selected_node_driver: CsiNodeLookup::Unknown,
        },
    )
}

#[test]
fn a_claim_selected_to_our_node_is_owned() {
    let claim = pvc("ns", "c").class("fast").selected_node("n1").build();
    assert_eq!(decide(&claim, None, true), ClaimOwnership::Owned);
}

#[test]
fn a_claim_selected_to_another_node_is_silently_not_owned() {
    let claim = pvc("ns", "c").class("fast").selected_node("n2").build();
    let class = sc("fast").binding_immediate().build();
    assert_eq!(
        decide(&claim, Some(&class), true),
        ClaimOwnership::NotOwned(NotOwned::SelectedOtherNode("n2".to_owned()))
    );
}

#[test]
fn an_unselected_claim_of_an_immediate_class_is_competed_for() {
    let claim = pvc("ns", "c").class("fast").build();
    let class = sc("fast").binding_immediate().build();
    assert_eq!(decide(&claim, Some(&class), true), ClaimOwnership::Compete);
}

#[test]
fn an_unselected_claim_is_not_competed_for_when_immediate_binding_is_off() {
    let claim = pvc("ns", "c").class("fast").build();
    let class = sc("fast").binding_immediate().build();
    assert_eq!(
        decide(&claim, Some(&class), false),
        ClaimOwnership::NotOwned(NotOwned::ImmediateBindingDisabled)
    );
}

#[test]
fn an_unselected_claim_of_a_wait_for_first_consumer_class_waits_for_the_scheduler() {
    let claim = pvc("ns", "c").class("fast").build();
    let wffc = sc("fast").binding_wffc().build();
    assert_eq!(
        decide(&claim, Some(&wffc), true),
        ClaimOwnership::NotOwned(NotOwned::NotImmediateBinding)
    );
    let unset = sc("fast").build();
    assert_eq!(
        decide(&claim, Some(&unset), true),
        ClaimOwnership::NotOwned(NotOwned::NotImmediateBinding),
        "an unset binding mode is not Immediate upstream"
    );
}

#[test]
fn a_missing_class_is_retried_and_a_missing_class_name_is_not_owned() {
    let claim = pvc("ns", "c").class("fast").build();
    let decision = decide(&claim, None, true);
    assert_eq!(
        decision,
        ClaimOwnership::NotOwned(NotOwned::StorageClassNotFound("fast".to_owned()))
    );
    assert!(matches!(decision, ClaimOwnership::NotOwned(r) if r.should_retry()));

    let classless = pvc("ns", "c").build();
    assert_eq!(
        decide(&classless, None, true),
        ClaimOwnership::NotOwned(NotOwned::NoStorageClassName)
    );
}

#[test]
fn the_beta_class_annotation_names_the_class_of_an_unselected_claim() {
    let claim = pvc("ns", "c").beta_class("old").build();
    assert_eq!(claim_class_name(&claim), Some("old"));
    assert_eq!(
        decide(&claim, None, true),
        ClaimOwnership::NotOwned(NotOwned::StorageClassNotFound("old".to_owned()))
    );
}

#[test]
fn allowed_topologies_that_exclude_our_node_mean_not_owned() {
    let claim = pvc("ns", "c").class("fast").build();
    let elsewhere = sc("fast")
        .binding_immediate()
        .allowed_topology([("topology.example.com/zone", vec!["z2", "z3"])])
        .build();
    assert_eq!(
        decide(&claim, Some(&elsewhere), true),
        ClaimOwnership::NotOwned(NotOwned::AllowedTopologiesIncompatible)
    );
    let here = sc("fast")
        .binding_immediate()
        .allowed_topology([("topology.example.com/zone", vec!["z2", "z3"])])
        .allowed_topology([
            ("topology.example.com/zone", vec!["z1"]),
            ("topology.example.com/node", vec!["n0", "n1"]),
        ])
        .build();
    assert_eq!(decide(&claim, Some(&here), true), ClaimOwnership::Compete);
}

#[test]
fn allowed_topologies_are_ignored_without_topology_support() {
    let claim = pvc("ns", "c").class("fast").build();
    let elsewhere = sc("fast")
        .binding_immediate()
        .allowed_topology([("topology.example.com/zone", vec!["z2"])])
        .build();
    let me = me();
    let decision = check_node(
        &claim,
        &OwnershipInputs {
            me: &me,
            driver: "d",
            topology_supported: false,
            immediate_binding: true,
            storage_class: Some(&elsewhere),
            selected_node_driver: CsiNodeLookup::Unknown,
        },
    );
    assert_eq!(decision, ClaimOwnership::Compete);
}

#[test]
fn allowed_topology_terms_without_values_impose_no_requirement() {
    let segments = me().segments;
    let empty = TopologySelectorTerm {
        match_label_expressions: None,
    };
    assert!(allowed_topologies_admit(
        std::slice::from_ref(&empty),
        &segments
    ));
    assert!(allowed_topologies_admit(&[], &segments));
    let other = sc("x")
        .allowed_topology([("topology.example.com/zone", vec!["z9"])])
        .build()
        .allowed_topologies
        .unwrap();
    let mixed = vec![empty, other[0].clone()];
    assert!(
        !allowed_topologies_admit(&mixed, &segments),
        "an empty term contributes nothing; the other term still excludes us"
    );
}

fn clear_inputs<'a>(me: &'a NodeIdentity, lookup: CsiNodeLookup) -> OwnershipInputs<'a> {
    OwnershipInputs {
        me,
        driver: "d.example.com",
        topology_supported: true,
        immediate_binding: true,
        storage_class: None,
        selected_node_driver: lookup,
    }
}

#[test]
fn a_selected_node_without_our_driver_is_cleared_with_an_event_naming_it() {
    let claim = pvc("ns", "c").class("fast").selected_node("gpu-7").build();
    let me = me();
    let no_driver = csinode("gpu-7").driver("other.csi", "x", ["k"]).build();
    let lookup = CsiNodeLookup::of(Some(&no_driver), "d.example.com");
    assert_eq!(lookup, CsiNodeLookup::LacksDriver);
    let ClaimOwnership::ClearSelectedNode(clear) = check_node(&claim, &clear_inputs(&me, lookup))
    else {
        panic!("expected the selected node to be cleared");
    };
    assert_eq!(clear.node, "gpu-7");
    assert_eq!(clear.reason, "SelectedNodeCleared");
    assert!(clear.message.contains("\"gpu-7\""), "{}", clear.message);
    assert!(clear.message.contains("does not list the driver"));

    let missing = CsiNodeLookup::of(None, "d.example.com");
    let decision = check_node(&claim, &clear_inputs(&me, missing));
    // No CSINode: upstream's reschedule, in its words.
    let ClaimOwnership::ClearSelectedNode(missing) = decision else {
        panic!("expected the selected node to be cleared, got {decision:?}");
    };
    assert_eq!(missing.reason, "ProvisioningFailed");
    assert_eq!(
        missing.message,
        "failed to get selected CSINode gpu-7: csinode.storage.k8s.io \"gpu-7\" not found"
    );
}

#[test]
fn a_selected_node_running_our_driver_or_an_unknown_one_is_left_alone() {
    let claim = pvc("ns", "c").class("fast").selected_node("n2").build();
    let me = me();
    let with_driver = csinode("n2").driver("d.example.com", "n2", ["k"]).build();
    for lookup in [
        CsiNodeLookup::of(Some(&with_driver), "d.example.com"),
        CsiNodeLookup::Unknown,
    ] {
        assert_eq!(
            check_node(&claim, &clear_inputs(&me, lookup)),
            ClaimOwnership::NotOwned(NotOwned::SelectedOtherNode("n2".to_owned()))
        );
    }
}

#[test]
fn our_own_node_is_never_cleared_even_before_our_driver_registers() {
    let claim = pvc("ns", "c").selected_node("n1").build();
    let me = me();
    assert_eq!(
        check_node(&claim, &clear_inputs(&me, CsiNodeLookup::NotFound)),
        ClaimOwnership::Owned
    );
}

#[test]
fn controller_mode_uses_the_same_clear_check() {
    let claim = pvc("ns", "c").selected_node("n9").build();
    assert!(selected_node_check(&claim, "d", CsiNodeLookup::NotFound).is_some());
    let unselected = pvc("ns", "c").build();
    assert!(selected_node_check(&unselected, "d", CsiNodeLookup::NotFound).is_none());
}

#[test]
fn the_claiming_patch_carries_the_resource_version_precondition() {
    assert_eq!(
        become_owner_patch("n1", "7"),
        json!({"metadata": {"resourceVersion": "7",
            "annotations": {"volume.kubernetes.io/selected-node": "n1"}}})
    );
}

#[test]
fn the_competition_delay_doubles_up_to_the_maximum_minus_jitter() {
    let base = Duration::from_secs(20);
    let max = Duration::from_secs(60);
    assert_eq!(compete_delay(0, base, max, 0.0), Duration::from_secs(20));
    assert_eq!(compete_delay(1, base, max, 0.0), Duration::from_secs(40));
    assert_eq!(compete_delay(2, base, max, 0.0), Duration::from_secs(60));
    assert_eq!(compete_delay(30, base, max, 0.0), Duration::from_secs(60));
    assert_eq!(compete_delay(u32::MAX, base, max, 0.0), max);
    assert_eq!(compete_delay(0, base, max, 0.5), Duration::from_secs(10));
    assert_eq!(compete_delay(2, base, max, 0.5), Duration::from_secs(50));
    // The first attempt never waits longer than base, and never a negative time.
    assert!(compete_delay(0, base, max, 0.999_999) < Duration::from_millis(1));
    let tight = Duration::from_secs(5);
    assert_eq!(compete_delay(3, base, tight, 0.9), Duration::ZERO);
    assert_eq!(compete_delay(0, base, max, f64::NAN), base);
}

#[test]
fn competition_attempts_count_per_claim_and_are_forgotten() {
    let mut c = Competition::new(Duration::from_secs(1), Duration::from_secs(8));
    assert_eq!(c.next_delay("a", 0.0), Duration::from_secs(1));
    assert_eq!(
        c.next_delay("a", 0.0),
        Duration::from_secs(2),
        "a lost race waits longer"
    );
    assert_eq!(
        c.next_delay("b", 0.0),
        Duration::from_secs(1),
        "other claims are independent"
    );
    assert_eq!(c.attempts("a"), 2);
    c.forget("a");
    assert_eq!(c.attempts("a"), 0);
    assert_eq!(c.next_delay("a", 0.0), Duration::from_secs(1));
    assert_eq!(c.len(), 2);
}

#[test]
fn the_recheck_claims_only_a_still_pending_unselected_claim_with_the_same_uid() {
    let claim = pvc("ns", "c").class("fast").resource_version("9").build();
    let uid = claim.metadata.uid.clone().unwrap();
    assert_eq!(
        recheck_before_claiming(Some(&claim), &uid, "n1"),
        Recheck::Claim {
            resource_version: "9".to_owned()
        }
    );
    assert_eq!(
        recheck_before_claiming(None, &uid, "n1"),
        Recheck::Abandon(Abandon::ClaimGone)
    );
    assert_eq!(
        recheck_before_claiming(Some(&claim), "other-uid", "n1"),
        Recheck::Abandon(Abandon::ClaimReplaced)
    );
    let won = pvc("ns", "c").selected_node("n2").build();
    assert_eq!(
        recheck_before_claiming(Some(&won), &uid, "n1"),
        Recheck::Abandon(Abandon::TakenBy("n2".to_owned()))
    );
    let ours = pvc("ns", "c").selected_node("n1").build();
    assert_eq!(
        recheck_before_claiming(Some(&ours), &uid, "n1"),
        Recheck::AlreadyOurs
    );
    let bound = pvc("ns", "c").volume_name("pv-1").build();
    assert_eq!(
        recheck_before_claiming(Some(&bound), &uid, "n1"),
        Recheck::Abandon(Abandon::NoLongerPending)
    );
    let deleting = pvc("ns", "c").deleting().build();
    assert_eq!(
        recheck_before_claiming(Some(&deleting), &uid, "n1"),
        Recheck::Abandon(Abandon::NoLongerPending)
    );
}

#[test]
fn a_node_mode_instance_deletes_only_volumes_its_segments_satisfy() {
    let segments = me().segments;
    let here = pv("pv-1")
        .node_affinity([("topology.example.com/node", "n1")])
        .build();
    let there = pv("pv-2")
        .node_affinity([("topology.example.com/node", "n2")])
        .build();
    let anywhere = pv("pv-3").build();
    assert_eq!(may_delete_here(&here, &segments, false), Ok(true));
    assert_eq!(may_delete_here(&there, &segments, false), Ok(false));
    assert_eq!(
        may_delete_here(&anywhere, &segments, false),
        Ok(true),
        "no affinity: every instance may ask"
    );
    assert_eq!(
        may_delete_here(&there, &HashMap::new(), false),
        Ok(true),
        "a driver without topology: accessible everywhere"
    );
}

#[test]
fn a_migrated_pv_is_judged_on_its_zone_where_the_zone_names_the_region() {
    let segments: HashMap<String, String> = [(
        "topology.gke.io/zone".to_owned(),
        "us-central1-b".to_owned(),
    )]
    .into();
    let zone = |z| ("topology.gke.io/zone", z);
    let region = |r| ("topology.kubernetes.io/region", r);
    let here = pv("pv-1")
        .node_affinity([zone("us-central1-b"), region("us-central1")])
        .build();
    let there = pv("pv-2")
        .node_affinity([zone("us-central1-a"), region("us-central1")])
        .build();
    assert_eq!(may_delete_here(&here, &segments, true), Ok(true));
    assert_eq!(may_delete_here(&there, &segments, true), Ok(false));
    // Upstream's answer wherever the zone does not tell the region, or there is no zone.
    let elsewhere = pv("pv-3")
        .node_affinity([zone("us-central1-b"), region("europe-west1")])
        .build();
    let region_only = pv("pv-4").node_affinity([region("us-central1")]).build();
    for pv in [&elsewhere, &region_only] {
        assert_eq!(may_delete_here(pv, &segments, true), Ok(false));
    }
    // Cinder's `nova` exists in every region: this node's may be another region's.
    let nova: HashMap<String, String> =
        [("topology.gke.io/zone".to_owned(), "nova".to_owned())].into();
    let in_r1 = pv("pv-5")
        .node_affinity([zone("nova"), region("r1")])
        .build();
    assert_eq!(may_delete_here(&in_r1, &nova, true), Ok(false));
    // A PV of our driver's own is judged on every key, as upstream does.
    assert_eq!(may_delete_here(&here, &segments, false), Ok(false));
}
