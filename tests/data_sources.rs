//! Volume data sources end to end: a clone and a snapshot restore reach the driver as
//! CreateVolume content sources; a source that fails upstream's checks gets a `ProvisioningFailed`
//! event naming the problem, and no CreateVolume is sent.

mod common;

use common::*;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, TypedLocalObjectReference};
use kube::api::{ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use mock_csi_driver::store::ContentSource;
use serde_json::json;

const NS: &str = "default";

fn cloned_from(name: &str, source: &str, size: &str) -> PersistentVolumeClaim {
    let mut c = claim(NS, name, "fast", size);
    c.spec.as_mut().expect("spec").data_source = Some(TypedLocalObjectReference {
        api_group: None,
        kind: "PersistentVolumeClaim".into(),
        name: source.into(),
    });
    c
}

fn restored_from(name: &str, snapshot: &str) -> PersistentVolumeClaim {
    let mut c = claim(NS, name, "fast", "1Gi");
    c.spec.as_mut().expect("spec").data_source = Some(TypedLocalObjectReference {
        api_group: Some("snapshot.storage.k8s.io".into()),
        kind: "VolumeSnapshot".into(),
        name: snapshot.into(),
    });
    c
}

/// Takes a snapshot of `volume_id` on the driver and writes its VolumeSnapshot `name` and bound
/// content ([`make_snapshot`]). Returns the snapshot id.
async fn snapshot(
    cluster: &Cluster,
    driver: &Driver,
    volume_id: &str,
    name: &str,
    ready: bool,
) -> String {
    make_snapshot(cluster, driver, DRIVER, NS, volume_id, name, ready).await
}

fn handle(pv: &k8s_openapi::api::core::v1::PersistentVolume) -> String {
    pv.spec
        .as_ref()
        .and_then(|s| s.csi.as_ref())
        .expect("CSI PV")
        .volume_handle
        .clone()
}

/// The driver's volume behind `pv` was created from `want`.
async fn assert_content_source(
    driver: &Driver,
    pv: &k8s_openapi::api::core::v1::PersistentVolume,
    want: ContentSource,
) {
    let state = driver.state().await;
    let volume = state
        .volumes
        .iter()
        .find(|v| v.id == handle(pv))
        .expect("the PV's volume on the driver");
    assert_eq!(volume.content_source, Some(want));
}

#[tokio::test]
async fn a_clone_gets_the_source_volume_as_its_content_source() {
    let (cluster, driver, sidecar) = start_single_node(&[], &[]).await;
    let source_pv = cluster.claim_with_fast_class(NS, "src").await;
    let source_pv = cluster
        .wait_bound(NS, &source_pv.metadata.name.expect("name"))
        .await;
    // The claim's and the PV's watches are separate streams: the bound claim can arrive first,
    // and then a live GET of the source PV is right. Measure once the PV cache holds it bound.
    let source_name = source_pv.metadata.name.clone().expect("name");
    sidecar
        .wait_log(
            &[
                "nothing to do for PV",
                &format!("pv={source_name}"),
                "phase=Bound",
            ],
            1,
        )
        .await;

    let before = cluster.sim().counters();
    cluster
        .create(&cluster.pvcs(NS), &cloned_from("copy", "src", "2Gi"))
        .await;
    let pv = cluster.wait_bound(NS, "copy").await;
    // The cost of a clone: the source claim and its PV come from the caches (no GET); the writes
    // are the source's protection finalizer and the PV (plus the ledger's Lease and events).
    let spent = cluster
        .sim()
        .counters()
        .since(&before)
        .agent(|a| a.contains("csi-provisioner-rs"));
    let reads = |r| spent.count(Some("get"), Some(r), None);
    assert_eq!(
        reads("persistentvolumeclaims") + reads("persistentvolumes"),
        0,
        "{:#}",
        spent.to_json()
    );
    assert_eq!(
        spent.writes_to(Some("persistentvolumeclaims")),
        1,
        "{:#}",
        spent.to_json()
    );
    assert_eq!(
        spent.writes_to(Some("persistentvolumes")),
        1,
        "{:#}",
        spent.to_json()
    );

    assert_content_source(&driver, &pv, ContentSource::Volume(handle(&source_pv))).await;
}

#[tokio::test]
async fn a_restore_gets_the_snapshot_as_its_content_source() {
    let (cluster, driver, _sidecar) = start_single_node(&[], &[]).await;
    cluster.claim_with_fast_class(NS, "src").await;
    let source_pv = cluster.wait_bound(NS, "src").await;
    let id = snapshot(&cluster, &driver, &handle(&source_pv), "snap", true).await;

    cluster
        .create(&cluster.pvcs(NS), &restored_from("restored", "snap"))
        .await;
    let pv = cluster.wait_bound(NS, "restored").await;

    assert_content_source(&driver, &pv, ContentSource::Snapshot(id)).await;
}

/// Issue 33: a Block restore of a Filesystem snapshot is refused until the content carries
/// upstream's key, `snapshot.storage.kubernetes.io/allow-volume-mode-change: "true"` (ours looked
/// for `snapshot.storage.k8s.io/...` and refused it for ever, naming the wrong key).
#[tokio::test]
async fn a_restore_changing_the_volume_mode_binds_once_the_content_allows_it() {
    let (cluster, driver, _sidecar) = start_single_node(&[], &[]).await;
    cluster.claim_with_fast_class(NS, "src").await;
    let source_pv = cluster.wait_bound(NS, "src").await;
    let id = snapshot(&cluster, &driver, &handle(&source_pv), "snap", true).await;

    let mut block = restored_from("restored", "snap");
    block.spec.as_mut().expect("spec").volume_mode = Some("Block".into());
    cluster.create(&cluster.pvcs(NS), &block).await;
    cluster
        .wait_claim_event(
            NS,
            "restored",
            "ProvisioningFailed",
            "requested volume default/restored modifies the mode of the source volume but does not have permission to do so. snapshot.storage.kubernetes.io/allow-volume-mode-change annotation is not present on snapshotcontent content-snap",
        )
        .await;

    let contents: kube::Api<DynamicObject> = kube::Api::all_with(
        cluster.client.clone(),
        &snapshot_api("VolumeSnapshotContent", "volumesnapshotcontents"),
    );
    let allow = json!({"metadata": {"annotations": {
        "snapshot.storage.kubernetes.io/allow-volume-mode-change": "true"}}});
    contents
        .patch(
            "content-snap",
            &PatchParams::default(),
            &Patch::Merge(&allow),
        )
        .await
        .expect("annotate the content");
    let pv = cluster.wait_bound(NS, "restored").await;
    assert_eq!(
        pv.spec.as_ref().and_then(|s| s.volume_mode.as_deref()),
        Some("Block")
    );
    assert_content_source(&driver, &pv, ContentSource::Snapshot(id)).await;
}

#[tokio::test]
async fn a_snapshot_not_ready_is_refused_with_an_event_and_no_create_volume() {
    let (cluster, driver, _sidecar) = start_single_node(&[], &[]).await;
    cluster.claim_with_fast_class(NS, "src").await;
    let source_pv = cluster.wait_bound(NS, "src").await;
    snapshot(&cluster, &driver, &handle(&source_pv), "snap", false).await;

    cluster
        .create(&cluster.pvcs(NS), &restored_from("restored", "snap"))
        .await;
    cluster
        .wait_claim_event(
            NS,
            "restored",
            "ProvisioningFailed",
            "error getting handle for DataSource Type VolumeSnapshot by Name snap: snapshot snap is not Ready",
        )
        .await;
    assert_eq!(
        driver.state().await.calls("CreateVolume"),
        1,
        "only the source was created"
    );
}

#[tokio::test]
async fn a_clone_smaller_than_its_source_or_of_a_missing_claim_is_refused() {
    let (cluster, driver, _sidecar) = start_single_node(&[], &[]).await;
    cluster.claim_with_fast_class(NS, "src").await;
    cluster.wait_bound(NS, "src").await;

    cluster
        .create(&cluster.pvcs(NS), &cloned_from("small", "src", "512Mi"))
        .await;
    cluster
        .create(&cluster.pvcs(NS), &cloned_from("orphan", "nowhere", "1Gi"))
        .await;
    cluster
        .wait_claim_event(
            NS,
            "small",
            "ProvisioningFailed",
            "new PVC request must be greater than or equal in size to the specified PVC data source, requested 536870912 but source is 1073741824",
        )
        .await;
    cluster
        .wait_claim_event(
            NS,
            "orphan",
            "ProvisioningFailed",
            "error getting PVC nowhere (namespace \"default\") from api server: persistentvolumeclaim \"nowhere\" not found",
        )
        .await;
    assert_eq!(
        driver.state().await.calls("CreateVolume"),
        1,
        "only the source was created"
    );
}

/// The intent covers clones: a clone whose claim is deleted while its CreateVolume timed out (the
/// volume exists, its id unknown) is cleaned up by replaying the same request, content source
/// included, and deleting what it answers; the source is untouched.
#[tokio::test]
async fn a_clone_deleted_while_its_create_volume_timed_out_leaks_nothing() {
    let (cluster, driver, _sidecar) = start_single_node(&[], &[]).await;
    cluster.claim_with_fast_class(NS, "src").await;
    let source_pv = cluster.wait_bound(NS, "src").await;
    let control = driver.creates_then_times_out().await;
    cluster
        .create(&cluster.pvcs(NS), &cloned_from("copy", "src", "1Gi"))
        .await;
    driver.wait_volumes(2).await;

    cluster
        .pvcs(NS)
        .delete("copy", &kube::api::DeleteParams::default())
        .await
        .expect("delete the clone's claim");
    control.clear_faults().await.expect("clear faults");
    cluster.delete_pvc_and_wait(NS, "copy").await;
    wait_for("only the source's PV left", DEADLINE, || async {
        (cluster.pv_count().await == 1).then_some(())
    })
    .await;
    let state = driver.wait_volumes(1).await;
    assert_eq!(
        state.volumes[0].id,
        handle(&source_pv),
        "the source volume is kept"
    );
    assert!(state.ok_calls("DeleteVolume") >= 1);
}

fn finalizers_of(obj: &kube::api::ObjectMeta) -> Vec<String> {
    obj.finalizers.clone().unwrap_or_default()
}

/// Upstream's clone protection: the source claim carries the clone-protection finalizer from
/// before CreateVolume, so deleting it while the clone is being made leaves it Terminating; once
/// the clone is bound the finalizer comes off and the source goes.
#[tokio::test]
async fn a_clone_source_deleted_mid_clone_waits_for_the_clone_then_goes() {
    let (cluster, driver, _sidecar) = start_single_node(&[], &[]).await;
    cluster.claim_with_fast_class(NS, "src").await;
    let source_pv = cluster.wait_bound(NS, "src").await;
    let control = driver.control().await;
    control
        .set_latency("CreateVolume", std::time::Duration::from_secs(3))
        .await
        .expect("latency");
    cluster
        .create(&cluster.pvcs(NS), &cloned_from("copy", "src", "1Gi"))
        .await;
    let protection = "provisioner.storage.kubernetes.io/cloning-protection";
    wait_for(
        "the source to get the clone-protection finalizer",
        DEADLINE,
        || async {
            let src = cluster.pvcs(NS).get("src").await.ok()?;
            finalizers_of(&src.metadata)
                .iter()
                .any(|f| f == protection)
                .then_some(())
        },
    )
    .await;

    cluster
        .pvcs(NS)
        .delete("src", &kube::api::DeleteParams::default())
        .await
        .expect("delete the source");
    let copy = cluster.pvcs(NS).get("copy").await.expect("the clone");
    let copy_phase = copy.status.and_then(|s| s.phase).unwrap_or_default();
    let src = cluster
        .pvcs(NS)
        .get("src")
        .await
        .expect("the source is held back");
    assert!(src.metadata.deletion_timestamp.is_some());
    assert_eq!(copy_phase, "Pending", "the clone was still being made");

    let pv = cluster.wait_bound(NS, "copy").await;
    wait_for("the source claim to go", DEADLINE, || async {
        cluster
            .pvcs(NS)
            .get_opt("src")
            .await
            .ok()?
            .is_none()
            .then_some(())
    })
    .await;
    assert_content_source(&driver, &pv, ContentSource::Volume(handle(&source_pv))).await;
}

/// The snapshot-source finalizer is on the VolumeSnapshot while the volume is restored from it,
/// and off once the PV exists.
#[tokio::test]
async fn a_restored_snapshot_is_protected_until_the_pv_exists() {
    let (cluster, driver, _sidecar) = start_single_node(&[], &[]).await;
    cluster.claim_with_fast_class(NS, "src").await;
    let source_pv = cluster.wait_bound(NS, "src").await;
    snapshot(&cluster, &driver, &handle(&source_pv), "snap", true).await;
    let control = driver.control().await;
    control
        .set_latency("CreateVolume", std::time::Duration::from_secs(2))
        .await
        .expect("latency");
    let snapshots: kube::Api<DynamicObject> = kube::Api::namespaced_with(
        cluster.client.clone(),
        NS,
        &snapshot_api("VolumeSnapshot", "volumesnapshots"),
    );
    let protection = "provisioner.storage.kubernetes.io/volumesnapshot-as-source-protection";
    let protected = || async {
        let s = snapshots.get("snap").await.expect("snapshot");
        finalizers_of(&s.metadata).iter().any(|f| f == protection)
    };

    cluster
        .create(&cluster.pvcs(NS), &restored_from("restored", "snap"))
        .await;
    wait_for("the snapshot-source finalizer", DEADLINE, || async {
        protected().await.then_some(())
    })
    .await;
    cluster.wait_bound(NS, "restored").await;
    wait_for(
        "the snapshot-source finalizer to come off",
        DEADLINE,
        || async { (!protected().await).then_some(()) },
    )
    .await;
}

fn cloned_across(name: &str, namespace: &str, source: &str) -> PersistentVolumeClaim {
    let mut c = claim(NS, name, "fast", "1Gi");
    c.spec.as_mut().expect("spec").data_source_ref =
        Some(k8s_openapi::api::core::v1::TypedObjectReference {
            api_group: None,
            kind: "PersistentVolumeClaim".into(),
            name: source.into(),
            namespace: Some(namespace.into()),
        });
    c
}

/// CrossNamespaceVolumeDataSource: a clone of a claim in another namespace is refused with
/// upstream's message until a ReferenceGrant there allows it, then made from that claim's volume.
#[tokio::test]
async fn a_cross_namespace_clone_needs_a_reference_grant() {
    let cluster = Cluster::start().await;
    let driver = Driver::start(cluster.dir.path(), "node-1", &[]).await;
    let gate = "--feature-gates=CrossNamespaceVolumeDataSource=true";
    let _sidecar = Sidecar::start(&cluster, &driver, &[gate]).await;
    cluster.add_class(&storage_class("fast", &[])).await;
    cluster
        .claim_of_class("kube-public", "src", "fast", "1Gi")
        .await;
    let source_pv = cluster.wait_bound("kube-public", "src").await;

    cluster
        .create(
            &cluster.pvcs(NS),
            &cloned_across("copy", "kube-public", "src"),
        )
        .await;
    cluster
        .wait_claim_event(
            NS,
            "copy",
            "ProvisioningFailed",
            "accessing kube-public/src of PersistentVolumeClaim dataSource from default/copy isn't allowed",
        )
        .await;
    assert_eq!(
        driver.state().await.calls("CreateVolume"),
        1,
        "no CreateVolume without a grant"
    );

    let grants: kube::Api<DynamicObject> = kube::Api::namespaced_with(
        cluster.client.clone(),
        "kube-public",
        &ApiResource {
            group: "gateway.networking.k8s.io".into(),
            version: "v1beta1".into(),
            api_version: "gateway.networking.k8s.io/v1beta1".into(),
            kind: "ReferenceGrant".into(),
            plural: "referencegrants".into(),
        },
    );
    let grant: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "gateway.networking.k8s.io/v1beta1", "kind": "ReferenceGrant",
        "metadata": {"name": "clones-from-default", "namespace": "kube-public"},
        "spec": {"from": [{"group": "", "kind": "PersistentVolumeClaim", "namespace": NS}],
            "to": [{"group": "", "kind": "PersistentVolumeClaim"}]},
    }))
    .expect("grant");
    grants
        .create(&PostParams::default(), &grant)
        .await
        .expect("create the grant");

    let pv = cluster.wait_bound(NS, "copy").await;
    assert_content_source(&driver, &pv, ContentSource::Volume(handle(&source_pv))).await;
}

/// `--snapshot-orphan-sweep-interval`: our snapshot-source finalizer left on a snapshot no pending
/// claim restores from (a restore abandoned mid-way) is removed; one a pending claim still needs
/// stays.
#[tokio::test]
async fn the_orphan_sweep_lifts_only_finalizers_no_pending_claim_needs() {
    let cluster = Cluster::start().await;
    let driver = Driver::start(cluster.dir.path(), "node-1", &[]).await;
    let flags = ["--snapshot-orphan-sweep-interval=1s"];
    let _sidecar = Sidecar::start(&cluster, &driver, &flags).await;
    // First a claim restoring from "busy", which stays Pending (the snapshot never becomes
    // ready); its event proves the sidecar's cache has it before any snapshot has the finalizer.
    cluster.add_class(&storage_class("fast", &[])).await;
    cluster
        .create(&cluster.pvcs(NS), &restored_from("waiting", "busy"))
        .await;
    cluster
        .wait_claim_event(
            NS,
            "waiting",
            "ProvisioningFailed",
            "error getting snapshot busy",
        )
        .await;
    only_the_orphan_is_released(&cluster).await;
}

/// Node mode sweeps too (as upstream), and a pending claim its scoped cache does not hold (here
/// one of a class no instance serves) still keeps its snapshot's finalizer.
#[tokio::test]
async fn in_node_mode_the_sweep_keeps_the_finalizer_of_a_claim_no_instance_caches() {
    let cluster = Cluster::start().await;
    let mut fleet = Vec::new();
    for node in ["node-1", "node-2"] {
        cluster.add_node(node).await;
        let driver = Driver::start(cluster.dir.path(), node, &[]).await;
        let flags = ["--node-deployment", "--snapshot-orphan-sweep-interval=1s"];
        let sidecar = Sidecar::start_env(&cluster, &driver, &flags, &[("NODE_NAME", node)]).await;
        sidecar.wait_started().await;
        fleet.push((driver, sidecar));
    }
    let mut waiting = restored_from("waiting", "busy");
    waiting.spec.as_mut().expect("spec").storage_class_name = Some("elsewhere".into());
    cluster.create(&cluster.pvcs(NS), &waiting).await;
    only_the_orphan_is_released(&cluster).await;
}

/// Creates the snapshots "orphan" and "busy" with our finalizer (a pending claim restores from
/// "busy"), waits for the sweep to release "orphan" and checks "busy" kept it.
async fn only_the_orphan_is_released(cluster: &Cluster) {
    let protection = "provisioner.storage.kubernetes.io/volumesnapshot-as-source-protection";
    let snapshots: kube::Api<DynamicObject> = kube::Api::namespaced_with(
        cluster.client.clone(),
        NS,
        &snapshot_api("VolumeSnapshot", "volumesnapshots"),
    );
    for name in ["orphan", "busy"] {
        let obj: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshot",
            "metadata": {"name": name, "namespace": NS, "finalizers": [protection]},
            "spec": {"source": {"persistentVolumeClaimName": "src"}},
        }))
        .expect("snapshot object");
        snapshots
            .create(&PostParams::default(), &obj)
            .await
            .expect("create snapshot");
    }

    let has = |s: &DynamicObject| finalizers_of(&s.metadata).iter().any(|f| f == protection);
    wait_for(
        "the orphaned snapshot's finalizer to go",
        DEADLINE,
        || async {
            let orphan = snapshots.get("orphan").await.ok()?;
            (!has(&orphan)).then_some(())
        },
    )
    .await;
    let busy = snapshots.get("busy").await.expect("busy snapshot");
    assert!(has(&busy), "a pending claim still restores from it");
}

/// A sidecar killed while a clone is being made, its source deleted meanwhile: the restarted
/// sidecar finishes the clone and then releases the source (the protection is level-triggered,
/// nothing is left behind by the crash).
#[tokio::test]
async fn a_clone_source_protected_before_a_sidecar_kill_is_released_after_the_restart() {
    let (cluster, driver, mut sidecar) = start_single_node(&[], &[]).await;
    cluster.claim_with_fast_class(NS, "src").await;
    cluster.wait_bound(NS, "src").await;
    let control = driver.control().await;
    control
        .set_latency("CreateVolume", std::time::Duration::from_secs(30))
        .await
        .expect("latency");
    cluster
        .create(&cluster.pvcs(NS), &cloned_from("copy", "src", "1Gi"))
        .await;
    let protection = "provisioner.storage.kubernetes.io/cloning-protection";
    wait_for("the clone-protection finalizer", DEADLINE, || async {
        let src = cluster.pvcs(NS).get("src").await.ok()?;
        finalizers_of(&src.metadata)
            .iter()
            .any(|f| f == protection)
            .then_some(())
    })
    .await;

    sidecar.kill().await;
    cluster
        .pvcs(NS)
        .delete("src", &kube::api::DeleteParams::default())
        .await
        .expect("delete the source");
    control
        .set_latency("CreateVolume", std::time::Duration::ZERO)
        .await
        .expect("no latency");
    let src = cluster
        .pvcs(NS)
        .get("src")
        .await
        .expect("held by the finalizer");
    assert!(src.metadata.deletion_timestamp.is_some());

    sidecar.restart().await;
    cluster.wait_bound(NS, "copy").await;
    wait_for("the source claim to go", DEADLINE, || async {
        cluster
            .pvcs(NS)
            .get_opt("src")
            .await
            .ok()?
            .is_none()
            .then_some(())
    })
    .await;
}
