//! Topology: delayed binding, the requisite/preferred table (strict, immediate), rescheduling
//! and the selected node going away. The mock driver with `--topology-node` places volumes on
//! several nodes by the accessibility requirements it receives (preferred first, then requisite),
//! so where a volume lands shows what was requested.

use super::*;
use k8s_openapi::api::core::v1::{TopologySelectorLabelRequirement, TopologySelectorTerm};
use mock_csi_driver::FaultRule;

/// A topology-aware driver placing volumes on node-1 (its own) and node-2.
async fn two_node_driver(cluster: &Cluster, extra: &[&str]) -> Driver {
    let mut args = vec!["--topology", "--topology-node=node-2"];
    args.extend_from_slice(extra);
    Driver::start(cluster.dir.path(), "node-1", &args).await
}

/// The node the driver put the claim's volume on.
async fn volume_node(driver: &Driver, pvc: &PersistentVolumeClaim) -> String {
    let state = driver.state().await;
    let volume = state
        .volume_by_name(&format!("pvc-{}", uid(pvc)))
        .expect("the claim's volume on the driver");
    volume.node.clone()
}

/// StorageClass `late` (WaitForFirstConsumer) and a 1Gi claim `data` of it, not yet scheduled.
async fn late_claim(cluster: &Cluster) -> PersistentVolumeClaim {
    cluster.add_class(&delayed_class("late")).await;
    cluster.claim_of_class(NS, "data", "late", "1Gi").await
}

fn allowed_on(node: &str) -> TopologySelectorTerm {
    TopologySelectorTerm {
        match_label_expressions: Some(vec![TopologySelectorLabelRequirement {
            key: TOPOLOGY_KEY.into(),
            values: vec![node.into()],
        }]),
    }
}

#[tokio::test]
async fn delayed_binding_waits_for_the_consumer_then_provisions_on_its_node() {
    let cluster = Cluster::start().await;
    let driver = two_node_driver(&cluster, &[]).await;
    cluster.add_nodes(&["node-1", "node-2"]).await;
    let sidecar = Sidecar::start(&cluster, &driver, &[]).await;
    let pvc = late_claim(&cluster).await;
    // The sidecar looked at the claim and left it alone (the PV controller does not even name a
    // provisioner before a node is selected).
    sidecar
        .wait_log(&["nothing to do for claim", "claim=default/data"], 1)
        .await;
    assert_eq!(driver.state().await.calls("CreateVolume"), 0);

    cluster.schedule(NS, "app", "data", "node-2").await;
    let pv = cluster.wait_bound(NS, "data").await;
    assert_eq!(affinity_nodes(&pv), vec!["node-2".to_string()]);
    driver.wait_volumes(1).await;
    assert_eq!(volume_node(&driver, &pvc).await, "node-2");
}

#[tokio::test]
async fn immediate_binding_requests_the_topology_of_the_cluster() {
    let cluster = Cluster::start().await;
    let driver = two_node_driver(&cluster, &[]).await;
    // Only node-2 is a node of the cluster: the aggregated requirement names it alone.
    cluster.add_node("node-2").await;
    let _sidecar = Sidecar::start(&cluster, &driver, &[]).await;
    let pvc = cluster.claim_with_fast_class(NS, "data").await;
    let pv = cluster.wait_bound(NS, "data").await;
    assert_eq!(affinity_nodes(&pv), vec!["node-2".to_string()]);
    driver.wait_volumes(1).await;
    assert_eq!(volume_node(&driver, &pvc).await, "node-2");
}

#[tokio::test]
async fn immediate_topology_off_sends_no_requirement_but_honours_allowed_topologies() {
    let cluster = Cluster::start().await;
    let driver = two_node_driver(&cluster, &[]).await;
    cluster.add_node("node-2").await;
    let _sidecar = Sidecar::start(&cluster, &driver, &["--immediate-topology=false"]).await;
    cluster.add_class(&storage_class("anywhere", &[])).await;
    let mut pinned = storage_class("pinned", &[]);
    pinned.allowed_topologies = Some(vec![allowed_on("node-2")]);
    cluster.add_class(&pinned).await;
    let free = cluster.claim_of_class(NS, "free", "anywhere", "1Gi").await;
    let placed = cluster.claim_of_class(NS, "placed", "pinned", "1Gi").await;

    // No requirement: the driver picks its own default, node-1, though only node-2 is a node.
    let free_pv = cluster.wait_bound(NS, "free").await;
    let placed_pv = cluster.wait_bound(NS, "placed").await;
    driver.wait_volumes(2).await;
    assert_eq!(volume_node(&driver, &free).await, "node-1");
    assert_eq!(affinity_nodes(&free_pv), vec!["node-1".to_string()]);
    // allowedTopologies are a requirement whatever --immediate-topology says.
    assert_eq!(volume_node(&driver, &placed).await, "node-2");
    assert_eq!(affinity_nodes(&placed_pv), vec!["node-2".to_string()]);
}

/// node-2 full (1Gi pools, a 1Gi volume there already), then a 1Gi claim whose pod runs on node-2.
async fn claim_for_a_full_node(cluster: &Cluster) -> PersistentVolumeClaim {
    cluster.add_nodes(&["node-1", "node-2"]).await;
    cluster.add_class(&delayed_class("late")).await;
    cluster.claim_of_class(NS, "filler", "late", "1Gi").await;
    cluster.schedule(NS, "filler", "filler", "node-2").await;
    cluster.wait_bound(NS, "filler").await;
    let pvc = cluster.claim_of_class(NS, "data", "late", "1Gi").await;
    cluster.schedule(NS, "app", "data", "node-2").await;
    pvc
}

#[tokio::test]
async fn without_strict_topology_a_full_selected_node_falls_back_to_another() {
    let cluster = Cluster::start().await;
    let driver = two_node_driver(&cluster, &["--capacity-total=1Gi"]).await;
    let _sidecar = Sidecar::start(&cluster, &driver, &[]).await;
    let pvc = claim_for_a_full_node(&cluster).await;
    // The requisite holds every node, node-2 preferred: the driver falls back to node-1.
    let pv = cluster.wait_bound(NS, "data").await;
    driver.wait_volumes(2).await;
    assert_eq!(volume_node(&driver, &pvc).await, "node-1");
    assert_eq!(affinity_nodes(&pv), vec!["node-1".to_string()]);
}

#[tokio::test]
async fn strict_topology_on_a_full_node_clears_the_selected_node_for_rescheduling() {
    let cluster = Cluster::start().await;
    let driver = two_node_driver(&cluster, &["--capacity-total=1Gi"]).await;
    let _sidecar = Sidecar::start(&cluster, &driver, &["--strict-topology"]).await;
    let history = ClaimHistory::start(&cluster, "data");
    claim_for_a_full_node(&cluster).await;
    // Only node-2 is requested: RESOURCE_EXHAUSTED, reported, and the scheduler may pick again.
    cluster
        .wait_claim_event(NS, "data", "ProvisioningFailed", "code = ResourceExhausted")
        .await;
    history.wait_selected_node_cleared("node-2").await;
    let state = driver.state().await;
    assert_eq!(state.volumes.len(), 1, "only the filler's volume exists");
    assert_eq!(state.volumes[0].node, "node-2");
}

/// Nodes node-1 and node-2, a sidecar, and claim `data` (WaitForFirstConsumer) scheduled to
/// node-2, whose first CreateVolume the driver answers with `code`.
async fn claim_on_node_2_failing_once(
    cluster: &Cluster,
    code: tonic::Code,
) -> (Driver, Sidecar, ClaimHistory, PersistentVolumeClaim) {
    let driver = two_node_driver(cluster, &[]).await;
    driver
        .control()
        .await
        .set_fault("CreateVolume", FaultRule::times(code, 1))
        .await
        .unwrap();
    cluster.add_nodes(&["node-1", "node-2"]).await;
    let sidecar = Sidecar::start(cluster, &driver, &[]).await;
    let history = ClaimHistory::start(cluster, "data");
    let pvc = late_claim(cluster).await;
    cluster.schedule(NS, "app", "data", "node-2").await;
    (driver, sidecar, history, pvc)
}

#[tokio::test]
async fn resource_exhausted_on_the_selected_node_reschedules_and_then_provisions() {
    let cluster = Cluster::start().await;
    let (driver, _sidecar, history, pvc) =
        claim_on_node_2_failing_once(&cluster, tonic::Code::ResourceExhausted).await;
    history.wait_selected_node_cleared("node-2").await;
    cluster
        .wait_claim_event(NS, "data", "ProvisioningFailed", "code = ResourceExhausted")
        .await;
    // The scheduler (the simulator) selects the pod's node again; the retry succeeds.
    cluster.wait_bound(NS, "data").await;
    let state = driver.wait_volumes(1).await;
    assert_eq!(state.calls("CreateVolume"), 2);
    assert_eq!(volume_node(&driver, &pvc).await, "node-2");
}

#[tokio::test]
async fn a_deleted_selected_node_is_cleared_so_the_pod_can_go_elsewhere() {
    let cluster = Cluster::start().await;
    let driver = two_node_driver(&cluster, &[]).await;
    cluster.add_nodes(&["node-1", "node-2"]).await;
    let pvc = late_claim(&cluster).await;
    // Scheduled to node-2 while no provisioner runs; then node-2 and its pod go away.
    cluster.schedule(NS, "app", "data", "node-2").await;
    wait_claim(&cluster, "data", "node-2 selected", |p| {
        (annotation(p, SELECTED_NODE) == Some("node-2")).then_some(())
    })
    .await;
    cluster
        .pods(NS)
        .delete("app", &Default::default())
        .await
        .unwrap();
    cluster.delete_node("node-2").await;

    let _sidecar = Sidecar::start(&cluster, &driver, &[]).await;
    cluster
        .wait_claim_event(
            NS,
            "data",
            "ProvisioningFailed",
            "failed to get selected CSINode node-2: csinode.storage.k8s.io \"node-2\" not found",
        )
        .await;
    wait_claim(&cluster, "data", "selected node cleared", |p| {
        annotation(p, SELECTED_NODE).is_none().then_some(())
    })
    .await;
    assert_eq!(driver.state().await.calls("CreateVolume"), 0);

    // The pod is scheduled anew, to node-1, and the volume follows it.
    cluster.schedule(NS, "app-2", "data", "node-1").await;
    let pv = cluster.wait_bound(NS, "data").await;
    assert_eq!(affinity_nodes(&pv), vec!["node-1".to_string()]);
    driver.wait_volumes(1).await;
    assert_eq!(volume_node(&driver, &pvc).await, "node-1");
}

#[tokio::test]
async fn a_retry_after_a_timeout_keeps_its_topology_when_the_node_vanishes() {
    let cluster = Cluster::start().await;
    let driver = two_node_driver(&cluster, &[]).await;
    // CreateVolume creates the volume on node-2 but answers DEADLINE_EXCEEDED: maybe in progress.
    let control = driver.creates_then_times_out().await;
    cluster.add_nodes(&["node-1", "node-2"]).await;
    let _sidecar = Sidecar::start(&cluster, &driver, &[]).await;
    let pvc = late_claim(&cluster).await;
    cluster.schedule(NS, "app", "data", "node-2").await;
    driver.wait_volumes(1).await;

    // node-2 disappears while the claim is retried; the retries still ask for node-2.
    cluster.delete_node("node-2").await;
    let calls = driver.state().await.calls("CreateVolume");
    wait_for("two more CreateVolume retries", DEADLINE, || async {
        (driver.state().await.calls("CreateVolume") >= calls + 2).then_some(())
    })
    .await;
    control.clear_faults().await.unwrap();
    let pv = cluster.wait_bound(NS, "data").await;
    assert_eq!(affinity_nodes(&pv), vec!["node-2".to_string()]);
    let state = driver.wait_volumes(1).await;
    assert_eq!(state.volumes[0].node, "node-2");
    assert_eq!(volume_node(&driver, &pvc).await, "node-2");
    assert_eq!(
        cluster
            .events_for("PersistentVolumeClaim", NS, "data")
            .await
            .iter()
            .filter(|(_, message)| message.starts_with("failed to get selected CSINode"))
            .count(),
        0
    );
}

#[tokio::test]
async fn a_selected_node_deleted_while_its_claim_is_held_back_is_cleared_within_seconds() {
    let cluster = Cluster::start().await;
    // INVALID_ARGUMENT: the claim is held back for 5 minutes; nothing about it changes meanwhile.
    let (_driver, _sidecar, history, _) =
        claim_on_node_2_failing_once(&cluster, tonic::Code::InvalidArgument).await;
    cluster
        .wait_claim_event(NS, "data", "ProvisioningFailed", "infeasible")
        .await;

    // The node goes away: the claim is looked at again at once, not after the hold-back or the
    // 10-minute resync, and the scheduler may pick another node.
    cluster
        .pods(NS)
        .delete("app", &Default::default())
        .await
        .unwrap();
    cluster.delete_node("node-2").await;
    history.wait_selected_node_cleared("node-2").await;
    cluster
        .wait_claim_event(
            NS,
            "data",
            "ProvisioningFailed",
            "failed to get selected CSINode node-2",
        )
        .await;
}
