//! Bad input (a `ProvisioningFailed` event naming the problem and no CreateVolume call) and wrong
//! driver answers (the volume is deleted again, nothing leaks).

use super::*;
use kube::api::DeleteParams;
use kube_sim::SimConfig;
use mock_csi_driver::{FaultRule, Misbehaviour};

/// A claim already marked for our driver (the bare simulator has no PV controller to do it).
fn our_claim(name: &str, class: &str, size: &str) -> PersistentVolumeClaim {
    let mut pvc = claim(NS, name, class, size);
    pvc.metadata.annotations = Some(BTreeMap::from([(
        "volume.kubernetes.io/storage-provisioner".to_string(),
        DRIVER.to_string(),
    )]));
    pvc
}

#[tokio::test]
async fn every_bad_input_is_reported_by_name_and_never_reaches_the_driver() {
    // Bare: no PV controller, which would re-annotate a claim of another driver's class.
    let cluster = Cluster::start_with(SimConfig::bare()).await;
    let driver = Driver::start(cluster.dir.path(), "node-1", &[]).await;
    let _sidecar = Sidecar::start(&cluster, &driver, &[]).await;
    let classes: [(&str, &[(&str, &str)]); 4] = [
        ("good", &[]),
        ("reserved", &[("csi.storage.k8s.io/bogus", "x")]),
        (
            // `${pvc.name}` is allowed in secret names only, not in namespaces.
            "template",
            &[
                ("csi.storage.k8s.io/provisioner-secret-name", "creds"),
                (
                    "csi.storage.k8s.io/provisioner-secret-namespace",
                    "${pvc.name}",
                ),
            ],
        ),
        (
            "missing",
            &[
                ("csi.storage.k8s.io/provisioner-secret-name", "absent-creds"),
                (
                    "csi.storage.k8s.io/provisioner-secret-namespace",
                    "${pvc.namespace}",
                ),
            ],
        ),
    ];
    for (name, params) in classes {
        cluster.add_class(&storage_class(name, params)).await;
    }
    let mut other = storage_class("other", &[]);
    other.provisioner = "other.csi.example.com".into();
    cluster.add_class(&other).await;

    let mut selector = our_claim("selector", "good", "1Gi");
    selector.spec.as_mut().unwrap().selector = Some(Default::default());
    let cases = [
        (
            our_claim("reserved", "reserved", "1Gi"),
            "failed to strip CSI Parameters of prefixed keys: found unknown parameter key \"csi.storage.k8s.io/bogus\" with reserved namespace csi.storage.k8s.io/",
        ),
        (
            our_claim("template", "template", "1Gi"),
            "error resolving value \"${pvc.name}\": invalid tokens: [\"pvc.name\"]",
        ),
        (
            our_claim("missing", "missing", "1Gi"),
            "error getting secret absent-creds in namespace default",
        ),
        (
            our_claim("huge", "good", "20Ei"),
            "invalid size \"20Ei\" in spec.resources.requests.storage",
        ),
        (
            our_claim("foreign", "other", "1Gi"),
            "StorageClass \"other\" is provisioned by \"other.csi.example.com\", not by \"mock.csi.rs\"",
        ),
        (selector, "claim Selector is not supported"),
    ];
    for (pvc, _) in &cases {
        cluster.create(&cluster.pvcs(NS), pvc).await;
    }
    for (pvc, needle) in &cases {
        let name = pvc.metadata.name.as_deref().unwrap();
        cluster
            .wait_claim_event(NS, name, "ProvisioningFailed", needle)
            .await;
    }
    // A good claim after them goes through, so the driver was reachable all along.
    cluster
        .create(&cluster.pvcs(NS), &our_claim("control", "good", "1Gi"))
        .await;
    let state = driver.wait_volumes(1).await;
    assert_eq!(
        state.calls("CreateVolume"),
        1,
        "only the good claim reached the driver"
    );

    // Nothing was started for the bad claims, so they carry no intent and delete at once.
    for (pvc, _) in &cases {
        let name = pvc.metadata.name.as_deref().unwrap();
        let fresh = cluster.pvcs(NS).get(name).await.unwrap();
        assert!(!has_intent(&fresh), "{name} got an intent finalizer");
        cluster.delete_pvc_and_wait(NS, name).await;
    }
}

#[tokio::test]
async fn an_undersized_volume_is_deleted_again_and_reported() {
    let cluster = Cluster::start().await;
    let driver = Driver::start(cluster.dir.path(), "node-1", &[]).await;
    let control = driver.control().await;
    control
        .set_misbehaviour(Misbehaviour::UndersizedVolumes, true)
        .await
        .unwrap();
    let _sidecar = Sidecar::start(&cluster, &driver, &[]).await;
    let pvc = cluster.claim_with_fast_class(NS, "data").await;
    cluster
        .wait_claim_event(
            NS,
            "data",
            "ProvisioningFailed",
            "created volume capacity 536870912 less than requested capacity 1073741824",
        )
        .await;
    assert!(
        driver.state().await.ok_calls("DeleteVolume") >= 1,
        "the undersized volume was not deleted"
    );
    assert_eq!(cluster.pv_count().await, 0, "no PV exists");

    // Once the driver behaves, the claim is bound to one volume; every undersized one is gone.
    control
        .set_misbehaviour(Misbehaviour::UndersizedVolumes, false)
        .await
        .unwrap();
    let pv = cluster.wait_bound(NS, "data").await;
    let state = driver.wait_volumes(1).await;
    assert_eq!(state.volumes[0].name, format!("pvc-{}", uid(&pvc)));
    assert_eq!(state.volumes[0].capacity_bytes, 1 << 30);
    assert_eq!(
        state.volumes[0].id,
        pv.spec.unwrap().csi.unwrap().volume_handle
    );
    assert_eq!(
        state.ok_calls("DeleteVolume") + 1,
        state.ok_calls("CreateVolume"),
        "every volume but the last was deleted again"
    );
}

#[tokio::test]
async fn a_pv_the_api_server_rejects_has_its_volume_deleted_again_with_the_provisioner_secret() {
    let cluster = Cluster::start().await;
    let driver = driver_requiring_a_secret(&cluster).await;
    let faults = cluster.sim().faults();
    let invalid = faults.add(
        kube_sim::FaultRule::error(422)
            .verb("create")
            .resource("persistentvolumes"),
    );
    let _sidecar = Sidecar::start(&cluster, &driver, &[]).await;
    cluster.claim_of_class(NS, "data", "secret", "1Gi").await;

    cluster
        .wait_claim_event(
            NS,
            "data",
            "ProvisioningFailed",
            "the volume was deleted again",
        )
        .await;
    assert!(
        driver.state().await.ok_calls("DeleteVolume") >= 1,
        "deleted with the secret"
    );

    // Once the API server accepts the PV, the claim is bound to one volume; none leaked before.
    faults.remove(invalid);
    cluster.wait_bound(NS, "data").await;
    let state = driver.wait_volumes(1).await;
    assert_eq!(
        state.ok_calls("DeleteVolume") + 1,
        state.ok_calls("CreateVolume"),
        "every volume but the last was deleted again"
    );
}

#[tokio::test]
async fn an_answer_without_a_volume_id_is_reported_and_the_retry_binds_the_same_volume() {
    let cluster = Cluster::start().await;
    let driver = Driver::start(cluster.dir.path(), "node-1", &[]).await;
    let control = driver.control().await;
    control
        .set_misbehaviour(Misbehaviour::EmptyVolumeId, true)
        .await
        .unwrap();
    let _sidecar = Sidecar::start(&cluster, &driver, &[]).await;
    let pvc = cluster.claim_with_fast_class(NS, "data").await;
    cluster
        .wait_claim_event(
            NS,
            "data",
            "ProvisioningFailed",
            "returned an empty volume_id, which violates the CSI spec",
        )
        .await;
    assert_eq!(cluster.pv_count().await, 0, "no PV without a volume id");

    // The volume the driver did create is found again by name once it answers properly: one
    // volume, no leak.
    control
        .set_misbehaviour(Misbehaviour::EmptyVolumeId, false)
        .await
        .unwrap();
    let pv = cluster.wait_bound(NS, "data").await;
    let state = driver.wait_volumes(1).await;
    assert_eq!(state.volumes[0].name, format!("pvc-{}", uid(&pvc)));
    assert_eq!(
        state.volumes[0].id,
        pv.spec.unwrap().csi.unwrap().volume_handle
    );
}

#[tokio::test]
async fn an_infeasible_claim_is_held_back_until_its_class_changes() {
    let cluster = Cluster::start().await;
    let driver = Driver::start(cluster.dir.path(), "node-1", &[]).await;
    let control = driver.control().await;
    control
        .set_fault(
            "CreateVolume",
            FaultRule::always(tonic::Code::InvalidArgument),
        )
        .await
        .unwrap();
    let sidecar = Sidecar::start(&cluster, &driver, &[]).await;
    let pvc = cluster.claim_with_fast_class(NS, "data").await;
    cluster
        .wait_claim_event(NS,
            "data",
            "ProvisioningFailed",
            "Volume provisioning failed with infeasible error. Retries will be delayed. rpc error: code = InvalidArgument",
        )
        .await;
    // The retry (100ms later) is held back with upstream's message instead of calling again.
    sidecar
        .wait_log(
            &[&format!(
                "skipping volume provisioning for pvc {}, because provisioning previously failed with infeasible error",
                uid(&pvc)
            )],
            1,
        )
    .await;
    assert_eq!(driver.state().await.calls("CreateVolume"), 1);

    // A fixed class (deleted and created again: a new UID) is tried at once.
    control.clear_faults().await.unwrap();
    cluster
        .classes()
        .delete("fast", &DeleteParams::default())
        .await
        .unwrap();
    wait_for("class fast to be gone", DEADLINE, || async {
        matches!(cluster.classes().get_opt("fast").await, Ok(None)).then_some(())
    })
    .await;
    cluster.add_class(&storage_class("fast", &[])).await;
    cluster.wait_bound(NS, "data").await;
    let state = driver.wait_volumes(1).await;
    assert_eq!(state.calls("CreateVolume"), 2);
}

/// Ours: a class limiting failed attempts stops the claim after that many final failures, says so
/// once (event and claim annotation), and retries when the annotation is removed.
#[tokio::test]
async fn a_class_retry_limit_stops_a_failing_claim_and_removing_the_stop_retries() {
    const STOPPED: &str = "csi-provisioner.rs/provisioning-stopped";
    let cluster = Cluster::start().await;
    let driver = Driver::start(cluster.dir.path(), "node-1", &[]).await;
    let control = driver.control().await;
    control
        .set_fault(
            "CreateVolume",
            FaultRule::always(tonic::Code::ResourceExhausted),
        )
        .await
        .unwrap();
    let _sidecar = Sidecar::start(&cluster, &driver, &[]).await;
    let mut class = storage_class("quota", &[]);
    class.metadata.annotations = Some(BTreeMap::from([(
        "csi-provisioner.rs/max-provisioning-failures".to_owned(),
        "3".to_owned(),
    )]));
    cluster.add_class(&class).await;
    cluster.claim_of_class(NS, "data", "quota", "1Gi").await;
    let message = cluster
        .wait_claim_event(
            NS,
            "data",
            "ProvisioningFailed",
            "provisioning stopped after 3 failed attempts (StorageClass quota sets csi-provisioner.rs/max-provisioning-failures=3)",
        )
        .await;
    assert!(message.contains("ResourceExhausted"), "{message}");
    let claim = cluster.pvcs(NS).get("data").await.unwrap();
    let stopped = annotation(&claim, STOPPED).expect("the stop is on the claim");
    assert!(
        stopped.starts_with("stopped after 3 failed attempts"),
        "{stopped}"
    );
    assert_eq!(driver.state().await.calls("CreateVolume"), 3);
    // Retries would have come within 100 ms, 200 ms, 400 ms: none comes. A claim of the same
    // class created now is attempted (and stopped) on its own, proving the sidecar is alive.
    cluster.claim_of_class(NS, "other", "quota", "1Gi").await;
    cluster
        .wait_claim_event(
            NS,
            "other",
            "ProvisioningFailed",
            "provisioning stopped after 3",
        )
        .await;
    assert_eq!(driver.state().await.calls("CreateVolume"), 6);

    // The backend is fixed and the operator removes the stop: provisioned.
    control.clear_faults().await.unwrap();
    cluster
        .pvcs(NS)
        .patch(
            "data",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(
                serde_json::json!({"metadata": {"annotations": {STOPPED: null}}}),
            ),
        )
        .await
        .unwrap();
    cluster.wait_bound(NS, "data").await;
    assert_eq!(driver.state().await.calls("CreateVolume"), 7);
}
