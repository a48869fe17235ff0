//! End to end: PVC -> CreateVolume -> PV on the API simulator with the mock driver as a separate
//! process, checked against both the API objects and the driver's own volume list.

mod common;

use std::collections::BTreeMap;

use common::*;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::ByteString;
use kube::api::{DeleteParams, ObjectMeta};
use mock_csi_driver::FaultRule;

const NS: &str = "default";

#[tokio::test]
async fn immediate_claim_gets_a_pv_exactly_like_upstream_builds_it() {
    let cluster = Cluster::start().await;
    let driver = Driver::start(cluster.dir.path(), "node-1", &[]).await;
    let _sidecar = Sidecar::start(&cluster, &driver, &[]).await;
    let mut class = storage_class("fast", &[("tier", "gold"), ("csi.storage.k8s.io/fstype", "xfs")]);
    class.mount_options = Some(vec!["noatime".into()]);
    cluster.create(&cluster.classes(), &class).await;
    let pvc = cluster.create(&cluster.pvcs(NS), &claim(NS, "data", "fast", "1Gi")).await;
    let uid = pvc.metadata.uid.clone().unwrap();

    let pv = cluster.wait_bound(NS, "data").await;
    assert_eq!(pv.metadata.name.as_deref(), Some(format!("pvc-{uid}").as_str()));
    let ann = pv.metadata.annotations.clone().unwrap_or_default();
    assert_eq!(ann.get("pv.kubernetes.io/provisioned-by").map(String::as_str), Some(DRIVER));
    assert_eq!(
        ann.get("volume.kubernetes.io/provisioner-deletion-secret-name").map(String::as_str),
        Some("")
    );
    let finalizers = pv.metadata.finalizers.clone().unwrap_or_default();
    assert!(finalizers.contains(&"external-provisioner.volume.kubernetes.io/finalizer".to_string()));
    let spec = pv.spec.clone().unwrap();
    let csi = spec.csi.clone().unwrap();
    assert_eq!(csi.driver, DRIVER);
    assert_eq!(csi.fs_type.as_deref(), Some("xfs"));
    assert!(csi.volume_attributes.unwrap_or_default().contains_key("storage.kubernetes.io/csiProvisionerIdentity"));
    assert_eq!(spec.persistent_volume_reclaim_policy.as_deref(), Some("Delete"));
    assert_eq!(spec.storage_class_name.as_deref(), Some("fast"));
    assert_eq!(spec.mount_options, Some(vec!["noatime".to_string()]));
    assert_eq!(spec.capacity.unwrap()["storage"].0, "1Gi");
    assert_eq!(spec.claim_ref.unwrap().uid.as_deref(), Some(uid.as_str()));

    // The driver holds exactly one volume, named after the claim, with the class parameters minus
    // the reserved keys.
    let state = driver.wait_volumes(1).await;
    let volume = &state.volumes[0];
    assert_eq!(volume.name, format!("pvc-{uid}"));
    assert_eq!(volume.id, csi.volume_handle);
    assert_eq!(volume.parameters, BTreeMap::from([("tier".to_string(), "gold".to_string())]));

    // Upstream's events, and the intent finalizer is gone from the bound claim.
    cluster
        .wait_event("PersistentVolumeClaim", NS, "data", "ProvisioningSucceeded", &format!("Successfully provisioned volume pvc-{uid}"))
        .await;
    cluster
        .wait_event("PersistentVolumeClaim", NS, "data", "Provisioning", "External provisioner is provisioning volume for claim \"default/data\"")
        .await;
    let pvc = cluster.pvcs(NS).get("data").await.unwrap();
    assert!(!pvc.metadata.finalizers.unwrap_or_default().iter().any(|f| f.starts_with("csi-provisioner.rs/")));
}

#[tokio::test]
async fn pvc_deleted_first_deletes_the_volume_and_the_pv() {
    let cluster = Cluster::start().await;
    let driver = Driver::start(cluster.dir.path(), "node-1", &[]).await;
    let _sidecar = Sidecar::start(&cluster, &driver, &[]).await;
    cluster.create(&cluster.classes(), &storage_class("fast", &[])).await;
    cluster.create(&cluster.pvcs(NS), &claim(NS, "data", "fast", "1Gi")).await;
    let pv = cluster.wait_bound(NS, "data").await;
    driver.wait_volumes(1).await;

    cluster.delete_pvc_and_wait(NS, "data").await;
    cluster.wait_pv_gone(pv.metadata.name.as_deref().unwrap()).await;
    let state = driver.wait_volumes(0).await;
    assert_eq!(state.calls("DeleteVolume"), 1, "DeleteVolume exactly once");
}

#[tokio::test]
async fn secrets_from_templates_reach_the_driver_and_are_recorded_for_deletion() {
    let cluster = Cluster::start().await;
    let driver = Driver::start(cluster.dir.path(), "node-1", &["--require-secret=password=s3cr3t-value"]).await;
    let sidecar = Sidecar::start(&cluster, &driver, &[]).await;
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some("data-creds".into()),
            namespace: Some(NS.into()),
            ..Default::default()
        },
        data: Some(BTreeMap::from([("password".to_string(), ByteString(b"s3cr3t-value".to_vec()))])),
        ..Default::default()
    };
    cluster.create(&cluster.secrets(NS), &secret).await;
    cluster
        .create(
            &cluster.classes(),
            &storage_class(
                "secret",
                &[
                    ("csi.storage.k8s.io/provisioner-secret-name", "${pvc.name}-creds"),
                    ("csi.storage.k8s.io/provisioner-secret-namespace", "${pvc.namespace}"),
                ],
            ),
        )
        .await;
    cluster.create(&cluster.pvcs(NS), &claim(NS, "data", "secret", "1Gi")).await;
    let pv = cluster.wait_bound(NS, "data").await;
    let ann = pv.metadata.annotations.clone().unwrap_or_default();
    assert_eq!(ann["volume.kubernetes.io/provisioner-deletion-secret-name"], "data-creds");
    assert_eq!(ann["volume.kubernetes.io/provisioner-deletion-secret-namespace"], NS);
    let state = driver.wait_volumes(1).await;
    assert_eq!(state.volumes[0].secret_keys, vec!["password".to_string()]);

    // Deletion sends the same secret (the driver refuses DeleteVolume without it).
    cluster.delete_pvc_and_wait(NS, "data").await;
    driver.wait_volumes(0).await;
    assert!(!sidecar.log().contains("s3cr3t-value"), "a secret value reached the sidecar's log");
}

#[tokio::test]
async fn unknown_reserved_parameter_fails_with_upstreams_event_and_no_create_call() {
    let cluster = Cluster::start().await;
    let driver = Driver::start(cluster.dir.path(), "node-1", &[]).await;
    let _sidecar = Sidecar::start(&cluster, &driver, &[]).await;
    cluster
        .create(&cluster.classes(), &storage_class("bad", &[("csi.storage.k8s.io/bogus", "x")]))
        .await;
    cluster.create(&cluster.pvcs(NS), &claim(NS, "data", "bad", "1Gi")).await;
    let message = cluster
        .wait_event("PersistentVolumeClaim", NS, "data", "ProvisioningFailed", "csi.storage.k8s.io/bogus")
        .await;
    assert!(message.contains("found unknown parameter key \"csi.storage.k8s.io/bogus\" with reserved namespace csi.storage.k8s.io/"), "{message}");
    assert_eq!(driver.state().await.calls("CreateVolume"), 0);
}

#[tokio::test]
async fn driver_timeouts_are_retried_until_the_volume_exists_once() {
    let cluster = Cluster::start().await;
    let driver = Driver::start(cluster.dir.path(), "node-1", &[]).await;
    // The first two CreateVolume calls create the volume but answer DEADLINE_EXCEEDED.
    driver
        .control()
        .await
        .set_fault("CreateVolume", FaultRule::times(tonic::Code::DeadlineExceeded, 2).after_effect())
        .await
        .unwrap();
    let _sidecar = Sidecar::start(&cluster, &driver, &[]).await;
    cluster.create(&cluster.classes(), &storage_class("fast", &[])).await;
    cluster.create(&cluster.pvcs(NS), &claim(NS, "data", "fast", "1Gi")).await;
    let pv = cluster.wait_bound(NS, "data").await;
    let state = driver.wait_volumes(1).await;
    assert!(state.calls("CreateVolume") >= 3);
    assert_eq!(state.volumes[0].id, pv.spec.unwrap().csi.unwrap().volume_handle);
}

#[tokio::test]
async fn pvc_deleted_while_create_volume_hangs_leaves_no_volume() {
    let cluster = Cluster::start().await;
    let driver = Driver::start(cluster.dir.path(), "node-1", &[]).await;
    let control = driver.control().await;
    // Every CreateVolume creates the volume and then times out: the sidecar never learns the id.
    control
        .set_fault("CreateVolume", FaultRule::always(tonic::Code::DeadlineExceeded).after_effect())
        .await
        .unwrap();
    let _sidecar = Sidecar::start(&cluster, &driver, &[]).await;
    cluster.create(&cluster.classes(), &storage_class("fast", &[])).await;
    cluster.create(&cluster.pvcs(NS), &claim(NS, "data", "fast", "1Gi")).await;
    driver.wait_volumes(1).await;

    // The claim is deleted while provisioning is "in progress"; the driver recovers meanwhile.
    cluster.pvcs(NS).delete("data", &DeleteParams::default()).await.unwrap();
    control.clear_faults().await.unwrap();
    cluster.delete_pvc_and_wait(NS, "data").await;
    let state = driver.wait_volumes(0).await;
    assert!(state.calls("DeleteVolume") >= 1);
    assert!(cluster.pvs().list(&Default::default()).await.unwrap().items.is_empty(), "no PV without a volume");
}
