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
