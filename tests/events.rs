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
    // The operator metrics saw the burst: each claim's latency once, no backlog, no call in flight.
    sidecar
        .wait_metric(
            "csi_provisioner_claim_to_bound_seconds_count",
            CLAIMS as f64,
        )
        .await;
    assert_eq!(
        sidecar.metric("csi_provisioner_claims_pending").await,
        Some(0.0)
    );
    let text = sidecar.try_metrics().await.unwrap_or_default();
    assert!(
        text.contains(
            "csi_provisioner_csi_calls_in_flight{method_name=\"/csi.v1.Controller/CreateVolume\"} 0"
        ),
        "{text}"
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
    cluster.sim().faults().add(
        kube_sim::FaultRule::latency(std::time::Duration::from_secs(3))
            .verb("watch")
            .resource("storageclasses"),
    );
    cluster.sim().drop_watches();
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
/// cache has not seen yet, keeps its selected node (no "failed to get selected CSINode" Warning)
/// and is provisioned there.
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
    cluster.sim().faults().add(
        kube_sim::FaultRule::latency(std::time::Duration::from_secs(3))
            .verb("watch")
            .resource("csinodes"),
    );
    cluster.sim().drop_watches();
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
            .all(|(_, message)| !message.contains("failed to get selected CSINode")),
        "{events:?}"
    );
    assert_eq!(driver.state().await.volumes[0].node, "node-2");
}

/// Issue 33: a claim whose name has 237 characters or more would get events named
/// `<claim>.<16 hex>`, over 253 characters. As client-go, such events get a generated
/// `<uuid>.<hex>` name, and arrive. (A core/v1 Event's name is not validated, so the API server
/// would take the long one too, as it takes kube-controller-manager's; events.k8s.io/v1 would
/// not. Only the sidecar's own events are checked.)
#[tokio::test]
async fn a_claim_with_a_very_long_name_gets_its_events() {
    let (cluster, _driver, _sidecar) = start_single_node(&[], &[]).await;
    let name = format!("c{}", "x".repeat(238));
    cluster.claim_with_fast_class(NS, &name).await;
    cluster.wait_bound(NS, &name).await;
    let started = format!("External provisioner is provisioning volume for claim \"{NS}/{name}\"");
    cluster
        .wait_claim_event(NS, &name, "Provisioning", &started)
        .await;
    cluster
        .wait_claim_event(
            NS,
            &name,
            "ProvisioningSucceeded",
            "Successfully provisioned volume",
        )
        .await;
    let events = cluster.events_on("PersistentVolumeClaim", NS, &name).await;
    let from_controller_manager = |e: &k8s_openapi::api::core::v1::Event| {
        e.source.as_ref().and_then(|s| s.component.as_deref())
            == Some("persistentvolume-controller")
    };
    assert!(
        events
            .iter()
            .filter(|e| !from_controller_manager(e))
            .all(|e| e.metadata.name.as_deref().is_some_and(|n| n.len() <= 253)),
        "{events:?}"
    );
}

/// Issue 33: a claim left to an external populator gets upstream's two events: the library's
/// Normal `Provisioning` (component `<driver>_<host>_<uuid>`), then "Assuming an external populator
/// will provision the volume" from the component `external-provisioner`; no CreateVolume.
#[tokio::test]
async fn a_claim_for_an_external_populator_gets_upstreams_two_events() {
    let (cluster, driver, _sidecar) = start_single_node(&[], &[]).await;
    cluster.add_class(&storage_class("fast", &[])).await;
    let mut pvc = claim(NS, "populated", "fast", "1Gi");
    pvc.spec.as_mut().unwrap().data_source_ref =
        Some(k8s_openapi::api::core::v1::TypedObjectReference {
            api_group: Some("hello.example.com".into()),
            kind: "Hello".into(),
            name: "h1".into(),
            namespace: None,
        });
    cluster.create(&cluster.pvcs(NS), &pvc).await;
    cluster
        .wait_claim_event(
            NS,
            "populated",
            "Provisioning",
            "Assuming an external populator will provision the volume",
        )
        .await;
    cluster
        .wait_claim_event(
            NS,
            "populated",
            "Provisioning",
            "External provisioner is provisioning",
        )
        .await;
    let events = cluster
        .events_on("PersistentVolumeClaim", NS, "populated")
        .await;
    let component_of = |needle: &str| {
        events
            .iter()
            .find(|e| e.message.as_deref().is_some_and(|m| m.contains(needle)))
            .and_then(|e| e.source.as_ref()?.component.clone())
            .unwrap_or_default()
    };
    assert_eq!(component_of("external populator"), "external-provisioner");
    assert!(
        component_of("External provisioner").starts_with("mock.csi.rs_"),
        "{events:?}"
    );
    assert_eq!(driver.state().await.calls("CreateVolume"), 0);
}
