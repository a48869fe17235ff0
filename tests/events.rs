//! Events under the client-side rate limit: at upstream's default `--kube-api-qps 5
//! --kube-api-burst 10` a burst of claims is provisioned first, and every claim still gets its
//! `Provisioning` and `ProvisioningSucceeded` events once the burst is over (upstream's recorder
//! loses most of them under the same pressure).

mod common;

use common::*;

const NS: &str = "default";
const CLAIMS: usize = 8;

#[tokio::test]
async fn every_claim_of_a_burst_gets_its_events_at_the_default_rate_limit() {
    let cluster = Cluster::start().await;
    let driver = Driver::start(cluster.dir.path(), "node-1", &[]).await;
    let sidecar = Sidecar::start(
        &cluster,
        &driver,
        &[
            "--kube-api-qps=5",
            "--kube-api-burst=10",
            "--http-endpoint=127.0.0.1:0",
        ],
    )
    .await;
    cluster.add_class(&storage_class("fast", &[])).await;
    for i in 0..CLAIMS {
        cluster
            .claim_of_class(NS, &format!("c{i}"), "fast", "1Gi")
            .await;
    }
    for i in 0..CLAIMS {
        let name = format!("c{i}");
        cluster
            .wait_claim_event(
                NS,
                &name,
                "ProvisioningSucceeded",
                "Successfully provisioned volume",
            )
            .await;
        cluster
            .wait_claim_event(
                NS,
                &name,
                "Provisioning",
                "External provisioner is provisioning volume",
            )
            .await;
    }
    // Nothing is left waiting and nothing was dropped.
    sidecar
        .wait_metric("csi_provisioner_events_queued", 0.0)
        .await;
    assert_eq!(
        sidecar.metric("csi_provisioner_events_dropped_total").await,
        Some(0.0)
    );
}

/// No false alarms: a claim that reaches the sidecar before its StorageClass (one file applied
/// with both) is provisioned without a `ProvisioningFailed` "not found" Warning.
#[tokio::test]
async fn a_claim_seen_before_its_class_gets_no_warning() {
    let cluster = Cluster::start().await;
    let driver = Driver::start(cluster.dir.path(), "node-1", &[]).await;
    let sidecar = Sidecar::start(&cluster, &driver, &[]).await;
    sidecar.wait_started().await;
    // The sidecar's StorageClass watch lags: once dropped, it takes 3 s to open again, while the
    // claim watch resumes at once.
    cluster.sim.faults().add(
        kube_sim::FaultRule::latency(std::time::Duration::from_secs(3))
            .verb("watch")
            .resource("storageclasses"),
    );
    cluster.sim.drop_watches();
    cluster.add_class(&storage_class("fast", &[])).await;
    cluster.claim_of_class(NS, "data", "fast", "1Gi").await;
    cluster
        .wait_claim_event(
            NS,
            "data",
            "ProvisioningSucceeded",
            "Successfully provisioned volume",
        )
        .await;
    // The race happened (the claim was looked at while the cache lacked its class)...
    assert!(
        sidecar.log_lines_with(&["StorageClass not in the cache yet but served"]) >= 1,
        "the claim was not examined before its class reached the cache; the test proves nothing"
    );
    // ...and no Warning was raised for it.
    let events = cluster
        .events_for("PersistentVolumeClaim", NS, "data")
        .await;
    assert!(
        events
            .iter()
            .all(|(reason, _)| reason != "ProvisioningFailed"),
        "{events:?}"
    );
}

/// No false alarms: a claim selected to a node that just joined, whose CSINode the sidecar's
/// cache has not seen yet, keeps its selected node (no `SelectedNodeCleared` Warning) and is
/// provisioned there.
#[tokio::test]
async fn a_claim_selected_to_a_node_the_cache_has_not_seen_keeps_its_node() {
    let cluster = Cluster::start().await;
    cluster.add_node("node-1").await;
    let driver = Driver::start(
        cluster.dir.path(),
        "node-1",
        &["--topology", "--topology-node=node-2"],
    )
    .await;
    let sidecar = Sidecar::start(&cluster, &driver, &["--feature-gates=Topology=true"]).await;
    sidecar.wait_started().await;
    cluster.add_class(&delayed_class("local")).await;
    // The CSINode watch lags by 3 s once dropped; node-2 joins meanwhile and is picked at once.
    cluster.sim.faults().add(
        kube_sim::FaultRule::latency(std::time::Duration::from_secs(3))
            .verb("watch")
            .resource("csinodes"),
    );
    cluster.sim.drop_watches();
    cluster.add_node("node-2").await;
    let mut pvc = claim(NS, "data", "local", "1Gi");
    pvc.metadata.annotations = Some(
        [(
            "volume.kubernetes.io/selected-node".to_string(),
            "node-2".to_string(),
        )]
        .into(),
    );
    cluster.create(&cluster.pvcs(NS), &pvc).await;
    cluster
        .wait_claim_event(
            NS,
            "data",
            "ProvisioningSucceeded",
            "Successfully provisioned volume",
        )
        .await;
    assert!(
        sidecar.log_lines_with(&["CSINode lists the driver but is not in the cache yet"]) >= 1,
        "the claim was not examined before the CSINode reached the cache; the test proves nothing"
    );
    let events = cluster
        .events_for("PersistentVolumeClaim", NS, "data")
        .await;
    assert!(
        events
            .iter()
            .all(|(reason, _)| reason != "SelectedNodeCleared"),
        "{events:?}"
    );
    assert_eq!(driver.state().await.volumes[0].node, "node-2");
}
