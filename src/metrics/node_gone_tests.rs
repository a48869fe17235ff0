use super::*;
use prometheus_client::encoding::text::encode;

#[test]
fn the_exposed_names_and_values_are_the_documented_ones() {
    let mut registry = Registry::default();
    let metrics = NodeGoneMetrics::register(&mut registry);
    metrics.volume_answered();
    metrics.volume_answered();
    metrics.claim_deleted();
    metrics.set_waiting(4);
    let mut text = String::new();
    encode(&mut text, &registry).unwrap();
    for line in [
        "csi_provisioner_deleted_node_volumes_total 2",
        "csi_provisioner_deleted_node_claims_total 1",
        "csi_provisioner_volumes_waiting_for_missing_node 4",
    ] {
        assert!(
            text.lines().any(|l| l == line),
            "missing {line:?} in:\n{text}"
        );
    }
}
