use super::*;

#[test]
fn pvc_builder_sets_what_the_scenario_says() {
    let claim = pvc("ns", "c")
        .uid("u1")
        .class("fast")
        .request("2Gi")
        .access_modes(["ReadWriteMany"])
        .selected_node("n1")
        .volume_mode_block()
        .deleting()
        .build();
    let spec = claim.spec.as_ref().unwrap();
    assert_eq!(claim.metadata.uid.as_deref(), Some("u1"));
    assert_eq!(spec.storage_class_name.as_deref(), Some("fast"));
    assert_eq!(
        spec.resources.as_ref().unwrap().requests.as_ref().unwrap()["storage"].0,
        "2Gi"
    );
    assert_eq!(
        spec.access_modes.as_deref(),
        Some(&["ReadWriteMany".to_owned()][..])
    );
    assert_eq!(spec.volume_mode.as_deref(), Some("Block"));
    assert_eq!(
        claim.metadata.annotations.as_ref().unwrap()[names::ANN_SELECTED_NODE],
        "n1"
    );
    assert!(claim.metadata.deletion_timestamp.is_some());
}

#[test]
fn pv_claim_ref_points_at_the_claim() {
    let claim = pvc("ns", "c").uid("u1").build();
    let volume = pv("pv-1")
        .claim(&claim)
        .phase("Bound")
        .reclaim("Delete")
        .build();
    let claim_ref = volume.spec.unwrap().claim_ref.unwrap();
    assert_eq!(claim_ref.uid.as_deref(), Some("u1"));
    assert_eq!(claim_ref.namespace.as_deref(), Some("ns"));
    assert_eq!(volume.status.unwrap().phase.as_deref(), Some("Bound"));
}

#[test]
fn csinode_with_no_keys_reports_no_topology() {
    let node = csinode("n1")
        .driver(DRIVER, "id-1", Vec::<String>::new())
        .build();
    assert_eq!(node.spec.drivers[0].topology_keys, None);
}
