//! End to end: deletion and the deletion-protection finalizer (KEP-2644) in every deletion order,
//! with failures on each side (driver down, sidecar killed, API writes failing, a concurrent
//! writer), checked against both the API objects and the mock driver's own volume list.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::*;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{
    CSIPersistentVolumeSource, ObjectReference, PersistentVolume, PersistentVolumeClaim,
    PersistentVolumeSpec,
};
use k8s_openapi::api::storage::v1::{
    VolumeAttachment, VolumeAttachmentSource, VolumeAttachmentSpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::{DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::json;

const NS: &str = "default";
const FINALIZER: &str = "external-provisioner.volume.kubernetes.io/finalizer";
/// The finalizer csi-attacher puts on PVs of attached volumes.
const ATTACHER_FINALIZER: &str = "external-attacher/mock-csi-rs";

// === Helpers ===

fn has_finalizer(pv: &PersistentVolume) -> bool {
    pv.finalizers().iter().any(|f| f == FINALIZER)
}

fn volume_id(pv: &PersistentVolume) -> String {
    pv.spec
        .as_ref()
        .and_then(|s| s.csi.as_ref())
        .map(|c| c.volume_handle.clone())
        .expect("a CSI PV")
}

fn phase(pv: &PersistentVolume) -> &str {
    pv.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or_default()
}

impl Cluster {
    /// Waits until PV `name` exists and `check` holds for it; returns it.
    async fn wait_pv(
        &self,
        name: &str,
        what: &str,
        check: impl Fn(&PersistentVolume) -> bool,
    ) -> PersistentVolume {
        let pvs = self.pvs();
        wait_for(&format!("PV {name}: {what}"), DEADLINE, || async {
            pvs.get_opt(name).await.ok()?.filter(|pv| check(pv))
        })
        .await
    }

    async fn pv(&self, name: &str) -> PersistentVolume {
        self.pvs().get(name).await.expect("PV exists")
    }

    /// Creates a claim of `class` and waits for its PV to be Bound and protected.
    async fn provision(&self, name: &str, class: &str) -> PersistentVolume {
        self.create(&self.pvcs(NS), &claim(NS, name, class, "1Gi"))
            .await;
        let pv = self.wait_bound(NS, name).await;
        let pv_name = pv.name_any();
        self.wait_pv(&pv_name, "bound with our finalizer", |pv| {
            has_finalizer(pv) && phase(pv) == "Bound"
        })
        .await
    }

    async fn delete_pv(&self, name: &str) {
        self.pvs()
            .delete(name, &DeleteParams::default())
            .await
            .unwrap_or_else(|e| panic!("delete PV {name}: {e}"));
    }

    async fn delete_pvc(&self, name: &str) {
        self.pvcs(NS)
            .delete(name, &DeleteParams::default())
            .await
            .unwrap_or_else(|e| panic!("delete PVC {name}: {e}"));
    }
}

impl Driver {
    async fn has_volume(&self, id: &str) -> bool {
        self.state().await.volume(id).is_some()
    }
}

impl Sidecar {
    /// Waits until the reclaim controller logged that it looked at PV `pv` and left it alone for
    /// `reason` (the `Debug` form of `SkipReason`), in phase `phase`.
    async fn wait_skipped(&self, pv: &str, phase: &str, reason: &str) {
        let pv = format!("pv={pv} ");
        let phase = format!("phase={phase} ");
        let reason = format!("reason={reason}");
        self.wait_log(&["nothing to do for PV", &pv, &phase, &reason], 1)
            .await;
    }
}

/// A PVC that asks for PV `volume` by name (static provisioning; class "" so no provisioner acts).
fn static_claim(name: &str, volume: &str) -> PersistentVolumeClaim {
    let mut pvc = claim(NS, name, "", "1Gi");
    let spec = pvc.spec.as_mut().expect("claim spec");
    spec.volume_name = Some(volume.into());
    pvc
}

/// A PV of our driver for backend volume `handle`, as an administrator writes it; bound to
/// `claim` (namespace/name, plus its UID when known) if given.
fn csi_pv(
    name: &str,
    handle: &str,
    policy: &str,
    class: &str,
    claim: Option<(&str, Option<&str>)>,
) -> PersistentVolume {
    PersistentVolume {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        spec: Some(PersistentVolumeSpec {
            access_modes: Some(vec!["ReadWriteOnce".into()]),
            capacity: Some(BTreeMap::from([(
                "storage".to_string(),
                Quantity("1Gi".into()),
            )])),
            csi: Some(CSIPersistentVolumeSource {
                driver: DRIVER.into(),
                volume_handle: handle.into(),
                ..Default::default()
            }),
            persistent_volume_reclaim_policy: Some(policy.into()),
            storage_class_name: Some(class.into()),
            claim_ref: claim.map(|(name, uid)| ObjectReference {
                kind: Some("PersistentVolumeClaim".into()),
                api_version: Some("v1".into()),
                namespace: Some(NS.into()),
                name: Some(name.into()),
                uid: uid.map(Into::into),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn attachment(name: &str, pv: &str, node: &str) -> VolumeAttachment {
    VolumeAttachment {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        spec: VolumeAttachmentSpec {
            attacher: DRIVER.into(),
            node_name: node.into(),
            source: VolumeAttachmentSource {
                persistent_volume_name: Some(pv.into()),
                ..Default::default()
            },
        },
        status: None,
    }
}

async fn start(driver_flags: &[&str], sidecar_flags: &[&str]) -> (Cluster, Driver, Sidecar) {
    let (cluster, driver, sidecar) = start_single_node(driver_flags, sidecar_flags).await;
    cluster.add_class(&storage_class("fast", &[])).await;
    (cluster, driver, sidecar)
}

// === 1, 2: dynamic PVs in both deletion orders ===

#[tokio::test]
async fn pvc_deleted_first_deletes_the_backend_volume_and_the_pv() {
    let (cluster, driver, _sidecar) = start(&[], &[]).await;
    let pv = cluster.provision("data", "fast").await;
    let id = volume_id(&pv);
    assert!(driver.has_volume(&id).await, "volume {id} on the driver");

    cluster.delete_pvc_and_wait(NS, "data").await;
    cluster.wait_pv_gone(&pv.name_any()).await;
    let state = driver.wait_volumes(0).await;
    assert_eq!(state.calls("DeleteVolume"), 1, "DeleteVolume exactly once");
    assert_eq!(state.ok_calls("DeleteVolume"), 1);
}

#[tokio::test]
async fn pv_deleted_before_its_pvc_stays_terminating_then_its_volume_is_deleted() {
    let (cluster, driver, sidecar) = start(&[], &[]).await;
    let pv = cluster.provision("data", "fast").await;
    let (name, id) = (pv.name_any(), volume_id(&pv));

    // The admin deletes the PV while its claim still uses it: the sidecar sees the deletion and
    // waits (PV protection), the PV stays Terminating with our finalizer, the volume stays.
    cluster.delete_pv(&name).await;
    sidecar
        .wait_skipped(&name, "Bound", "ClaimInUse { deleting: true }")
        .await;
    let pv = cluster.pv(&name).await;
    assert!(
        pv.metadata.deletion_timestamp.is_some(),
        "PV is Terminating"
    );
    assert!(has_finalizer(&pv), "our finalizer holds the PV");
    let state = driver.state().await;
    assert!(
        state.volume(&id).is_some(),
        "volume kept while the claim exists"
    );
    assert_eq!(state.calls("DeleteVolume"), 0);

    // Once the claim is gone, the reclaim policy applies: the volume is deleted, then the PV.
    cluster.delete_pvc_and_wait(NS, "data").await;
    cluster.wait_pv_gone(&name).await;
    let state = driver.wait_volumes(0).await;
    assert_eq!(state.calls("DeleteVolume"), 1, "DeleteVolume exactly once");
}

// === 3: static PVs ===

#[tokio::test]
async fn static_pv_of_our_driver_is_protected_once_bound_in_both_deletion_orders() {
    let (cluster, driver, sidecar) = start(&[], &[]).await;
    let mut ids = BTreeMap::new();
    for (pv, pvc) in [("static-a", "claim-a"), ("static-b", "claim-b")] {
        let id = driver.create_volume(pv).await;
        cluster
            .create(&cluster.pvcs(NS), &static_claim(pvc, pv))
            .await;
        let spec = csi_pv(pv, &id, "Delete", "", Some((pvc, None)));
        cluster.create(&cluster.pvs(), &spec).await;
        ids.insert(pv, id);
    }
    // Never bound (no claim): not ours to protect (KEP-2644).
    let loose = driver.create_volume("static-loose").await;
    let spec = csi_pv("static-loose", &loose, "Delete", "", None);
    cluster.create(&cluster.pvs(), &spec).await;

    for pv in ["static-a", "static-b"] {
        cluster
            .wait_pv(pv, "Bound with our finalizer", |pv| {
                phase(pv) == "Bound" && has_finalizer(pv)
            })
            .await;
    }
    sidecar
        .wait_skipped("static-loose", "Available", "NeverBound")
        .await;
    assert!(!has_finalizer(&cluster.pv("static-loose").await));

    // Order 1: claim first.
    cluster.delete_pvc_and_wait(NS, "claim-a").await;
    cluster.wait_pv_gone("static-a").await;
    assert!(!driver.has_volume(&ids["static-a"]).await);

    // Order 2: PV first; it waits for its claim.
    cluster.delete_pv("static-b").await;
    sidecar
        .wait_skipped("static-b", "Bound", "ClaimInUse { deleting: true }")
        .await;
    let pv = cluster.pv("static-b").await;
    assert!(pv.metadata.deletion_timestamp.is_some() && has_finalizer(&pv));
    assert!(
        driver.has_volume(&ids["static-b"]).await,
        "volume kept while bound"
    );
    cluster.delete_pvc_and_wait(NS, "claim-b").await;
    cluster.wait_pv_gone("static-b").await;

    let state = driver.wait_volumes(1).await;
    assert_eq!(
        state.volumes[0].id, loose,
        "only the never-bound volume is left"
    );
    assert_eq!(state.calls("DeleteVolume"), 2);
}

// === 4: Retain ===

#[tokio::test]
async fn retain_policy_keeps_the_backend_volume_and_lets_the_pv_go() {
    let (cluster, driver, sidecar) = start(&[], &[]).await;
    let mut retain = storage_class("keep", &[]);
    retain.reclaim_policy = Some("Retain".into());
    cluster.add_class(&retain).await;

    // A class that retains, and an admin switching a Delete PV to Retain (kubectl patch pv).
    cluster.claim_of_class(NS, "kept", "keep", "1Gi").await;
    let kept = cluster.wait_bound(NS, "kept").await.name_any();
    let switched = cluster.provision("switched", "fast").await.name_any();
    cluster
        .pvs()
        .patch(
            &switched,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"persistentVolumeReclaimPolicy": "Retain"}})),
        )
        .await
        .expect("switch the PV to Retain");

    let mut ids = Vec::new();
    for (pv, pvc) in [(&kept, "kept"), (&switched, "switched")] {
        let found = cluster
            .wait_pv(pv, "Bound without our finalizer", |pv| {
                phase(pv) == "Bound" && !has_finalizer(pv)
            })
            .await;
        ids.push(volume_id(&found));
        cluster.delete_pvc_and_wait(NS, pvc).await;
        sidecar
            .wait_skipped(pv, "Released", "NotDeletePolicy")
            .await;
    }
    let state = driver.state().await;
    assert_eq!(
        state.calls("DeleteVolume"),
        0,
        "a retained volume is never deleted"
    );

    // Nothing of ours holds the Released PVs: the admin can delete them.
    for pv in [&kept, &switched] {
        cluster.delete_pv(pv).await;
        cluster.wait_pv_gone(pv).await;
    }
    let state = driver.wait_volumes(2).await;
    for id in &ids {
        assert!(state.volume(id).is_some(), "volume {id} kept");
    }
    assert_eq!(state.calls("DeleteVolume"), 0);
}

// === 5: upgrade from a sidecar without the finalizer ===

#[tokio::test]
async fn pvs_left_without_the_finalizer_get_it_at_start_up() {
    let cluster = Cluster::start().await;
    let driver = Driver::start(cluster.dir.path(), "node-1", &[]).await;
    cluster.add_class(&storage_class("fast", &[])).await;
    // What the upstream sidecar (before KEP-2644) leaves behind: bound dynamic PVs with
    // provisioned-by and the deletion-secret annotations, and no finalizer.
    let mut pvs = Vec::new();
    for (name, policy) in [
        ("old-1", "Delete"),
        ("old-2", "Delete"),
        ("old-3", "Retain"),
    ] {
        let pv_name = format!("pvc-{name}");
        let id = driver.create_volume(&pv_name).await;
        let pvc = cluster.claim_of_class(NS, name, "fast", "1Gi").await;
        let mut pv = csi_pv(
            &pv_name,
            &id,
            policy,
            "fast",
            Some((name, pvc.uid().as_deref())),
        );
        pv.metadata.annotations = Some(BTreeMap::from([
            (
                "pv.kubernetes.io/provisioned-by".to_string(),
                DRIVER.to_string(),
            ),
            (
                "volume.kubernetes.io/provisioner-deletion-secret-name".to_string(),
                String::new(),
            ),
            (
                "volume.kubernetes.io/provisioner-deletion-secret-namespace".to_string(),
                String::new(),
            ),
        ]));
        cluster.create(&cluster.pvs(), &pv).await;
        pvs.push((pv_name, id));
    }
    for (pv, _) in &pvs {
        let pv = cluster
            .wait_pv(pv, "Bound", |pv| phase(pv) == "Bound")
            .await;
        assert!(!has_finalizer(&pv));
    }

    let sidecar = Sidecar::start(&cluster, &driver, &[]).await;
    for (pv, _) in &pvs[..2] {
        cluster
            .wait_pv(pv, "our finalizer added", has_finalizer)
            .await;
    }
    sidecar
        .wait_skipped(&pvs[2].0, "Bound", "NotDeletePolicy")
        .await;
    assert!(
        !has_finalizer(&cluster.pv(&pvs[2].0).await),
        "no finalizer on a Retain PV"
    );

    // The protection works: the PV deleted before its claim keeps the volume until the claim goes.
    cluster.delete_pv(&pvs[0].0).await;
    sidecar
        .wait_skipped(&pvs[0].0, "Bound", "ClaimInUse { deleting: true }")
        .await;
    assert!(driver.has_volume(&pvs[0].1).await);
    cluster.delete_pvc_and_wait(NS, "old-1").await;
    cluster.wait_pv_gone(&pvs[0].0).await;
    let state = driver.wait_volumes(2).await;
    assert!(state.volume(&pvs[0].1).is_none());
    assert_eq!(state.calls("DeleteVolume"), 1);
}

// === 6: driver down ===

#[tokio::test]
async fn driver_down_during_deletion_is_retried_until_it_is_back() {
    let (cluster, mut driver, sidecar) = start(&[], &[]).await;
    let pv = cluster.provision("data", "fast").await;
    let (name, id) = (pv.name_any(), volume_id(&pv));

    driver.kill().await;
    cluster.delete_pvc_and_wait(NS, "data").await;
    // Two failed attempts, then look: nothing may have been removed.
    let pv_field = format!("pv={name}");
    sidecar
        .wait_log(&["DeleteVolume failed", &pv_field], 2)
        .await;
    let pv = cluster.pv(&name).await;
    assert!(has_finalizer(&pv), "finalizer kept while the volume exists");
    assert!(
        pv.metadata.deletion_timestamp.is_none(),
        "PV not deleted early"
    );
    let events = cluster.events_counted("PersistentVolume", &name).await;
    assert!(
        events
            .iter()
            .any(|(reason, _, _)| reason == "VolumeFailedDelete"),
        "VolumeFailedDelete on the PV: {events:?}"
    );

    driver.restart().await;
    cluster.wait_pv_gone(&name).await;
    let state = driver.wait_volumes(0).await;
    assert!(state.volume(&id).is_none());
    assert_eq!(
        state.ok_calls("DeleteVolume"),
        1,
        "one successful DeleteVolume after the restart"
    );
}

#[tokio::test]
async fn delete_volume_errors_are_reported_on_the_pv_and_retried_until_they_clear() {
    let (cluster, driver, sidecar) = start(&[], &["--http-endpoint=127.0.0.1:0"]).await;
    let pv = cluster.provision("data", "fast").await;
    let name = pv.name_any();
    let control = driver.control().await;
    control
        .set_fault(
            "DeleteVolume",
            mock_csi_driver::FaultRule::always(tonic::Code::FailedPrecondition),
        )
        .await
        .unwrap();

    cluster.delete_pvc_and_wait(NS, "data").await;
    wait_for("two failed DeleteVolume calls", DEADLINE, || async {
        (driver.state().await.calls("DeleteVolume") >= 2).then_some(())
    })
    .await;
    // Upstream's reason and gRPC error text, on the PV; the PV and its finalizer stay.
    cluster
        .wait_pv_event(
            &name,
            "VolumeFailedDelete",
            "rpc error: code = FailedPrecondition desc = ",
        )
        .await;
    let pv = cluster.pv(&name).await;
    assert!(has_finalizer(&pv) && pv.metadata.deletion_timestamp.is_none());
    assert_eq!(driver.state().await.volumes.len(), 1);
    // The stuck deletion is visible to an operator's alert.
    sidecar
        .wait_metric("csi_provisioner_volumes_awaiting_deletion", 1.0)
        .await;

    control.clear_faults().await.unwrap();
    cluster.wait_pv_gone(&name).await;
    let state = driver.wait_volumes(0).await;
    assert_eq!(state.ok_calls("DeleteVolume"), 1);
    sidecar
        .wait_metric("csi_provisioner_volumes_awaiting_deletion", 0.0)
        .await;
}

// === 7: sidecar killed after DeleteVolume ===

#[tokio::test]
async fn sidecar_killed_after_delete_volume_repeats_it_on_restart_and_the_pv_goes() {
    let (cluster, driver, mut sidecar) = start(&[], &[]).await;
    // a: claim deleted first, the PV DELETE fails; b: PV deleted first, the finalizer PATCH fails.
    let a = cluster.provision("a", "fast").await.name_any();
    let b = cluster.provision("b", "fast").await.name_any();
    // Settled first: the ledger drops the intents lazily once the PVs exist. A crash inside that
    // window is the ledger's case (its resolver then races this reclaim; see tests/provision).
    wait_for(
        "the ledger to drop the intents of a and b",
        DEADLINE,
        || async { cluster.ledger_entries().await.is_empty().then_some(()) },
    )
    .await;
    let faults = cluster.sim().faults();
    let deny_delete = faults.add(
        kube_sim::FaultRule::error(500)
            .verb("delete")
            .resource("persistentvolumes")
            .name(&a),
    );
    let deny_patch = faults.add(
        kube_sim::FaultRule::error(500)
            .verb("patch")
            .resource("persistentvolumes")
            .name(&b),
    );
    cluster.delete_pv(&b).await;
    cluster.delete_pvc("a").await;
    cluster.delete_pvc("b").await;

    // Both volumes deleted, and the sidecar failed to write each PV afterwards.
    let state = driver.wait_volumes(0).await;
    assert_eq!(state.calls("DeleteVolume"), 2);
    wait_for("the PV DELETE and PATCH to fail", DEADLINE, || async {
        let c = cluster.sim().counters();
        (c.get("delete", "persistentvolumes", 500) >= 1
            && c.get("patch", "persistentvolumes", 500) >= 1)
            .then_some(())
    })
    .await;
    for pv in [&a, &b] {
        assert!(has_finalizer(&cluster.pv(pv).await), "{pv} still protected");
    }

    // Crash, the API recovers, restart: nothing in memory survived, so DeleteVolume is sent again
    // (the driver answers OK for a volume that is gone) and both PVs go away.
    sidecar.kill().await;
    assert!(faults.remove(deny_delete) && faults.remove(deny_patch));
    sidecar.restart().await;
    cluster.wait_pv_gone(&a).await;
    cluster.wait_pv_gone(&b).await;
    let state = driver.state().await;
    assert_eq!(
        state.calls("DeleteVolume"),
        4,
        "exactly once more per PV after the restart"
    );
    assert_eq!(state.ok_calls("DeleteVolume"), 4);
    assert!(state.volumes.is_empty());
}

// === 8: secrets of a deleted StorageClass ===

#[tokio::test]
async fn deletion_secrets_are_found_after_the_storage_class_was_deleted() {
    let (cluster, driver, sidecar) = start(&["--require-secret=password=s3cr3t-value"], &[]).await;
    let creds = secret(NS, "data-creds", "password", "s3cr3t-value");
    cluster.create(&cluster.secrets(NS), &creds).await;
    cluster.add_class(&templated_secret_class("secret")).await;
    let pv = cluster.provision("data", "secret").await;
    let ann = pv.annotations();
    assert_eq!(
        ann["volume.kubernetes.io/provisioner-deletion-secret-name"],
        "data-creds"
    );

    cluster
        .classes()
        .delete("secret", &DeleteParams::default())
        .await
        .expect("delete the StorageClass");
    wait_for("the StorageClass to be gone", DEADLINE, || async {
        matches!(cluster.classes().get_opt("secret").await, Ok(None)).then_some(())
    })
    .await;

    cluster.delete_pvc_and_wait(NS, "data").await;
    cluster.wait_pv_gone(&pv.name_any()).await;
    let state = driver.wait_volumes(0).await;
    // The driver refuses DeleteVolume without the secret: one call, and it succeeded.
    assert_eq!(state.calls("DeleteVolume"), 1);
    assert_eq!(state.ok_calls("DeleteVolume"), 1);
    assert!(
        !sidecar.log().contains("s3cr3t-value"),
        "a secret value reached the log"
    );
}

// === 9: another controller writing the PV ===

#[tokio::test]
async fn another_controller_rewriting_the_pv_does_not_leave_it_stuck() {
    let (cluster, driver, _sidecar) = start(&[], &[]).await;
    let pv = cluster.provision("data", "fast").await;
    let name = pv.name_any();
    // Like csi-attacher: its own finalizer first in the list, then Updates of the whole object.
    let mut attached = pv.clone();
    attached.metadata.finalizers = Some(
        std::iter::once(ATTACHER_FINALIZER.to_string())
            .chain(pv.finalizers().iter().cloned())
            .collect(),
    );
    cluster
        .pvs()
        .replace(&name, &PostParams::default(), &attached)
        .await
        .expect("add the attacher's finalizer");
    // DeleteVolume takes a while, so the other controller writes many times meanwhile and the
    // copy the sidecar read before the call is stale when it removes its finalizer.
    driver
        .control()
        .await
        .set_latency("DeleteVolume", Duration::from_millis(500))
        .await
        .unwrap();

    let writes = Arc::new(AtomicU64::new(0));
    let deleting = Arc::new(AtomicBool::new(false));
    let writer = tokio::spawn(rewrite_until_released(
        cluster.pvs(),
        name.clone(),
        writes.clone(),
        deleting.clone(),
    ));
    cluster.delete_pvc("data").await;
    deleting.store(true, Ordering::SeqCst);

    let writes_during_delete = tokio::time::timeout(DEADLINE, writer)
        .await
        .expect("our finalizer removed despite the concurrent writer")
        .expect("writer task");
    cluster.wait_pv_gone(&name).await;
    let state = driver.wait_volumes(0).await;
    assert_eq!(state.calls("DeleteVolume"), 1, "DeleteVolume exactly once");
    assert!(
        writes_during_delete >= 1,
        "the other controller wrote the PV while it was being deleted ({} writes in all)",
        writes.load(Ordering::SeqCst)
    );
}

/// The other controller: rotates the PV's finalizers (moving ours), bumps an annotation and a
/// label, with Update (PUT) as the attacher does, until our finalizer is gone; then drops its own
/// finalizer. Returns the writes made after `deleting` was set.
async fn rewrite_until_released(
    pvs: Api<PersistentVolume>,
    name: String,
    writes: Arc<AtomicU64>,
    deleting: Arc<AtomicBool>,
) -> u64 {
    let mut during = 0;
    for tick in 0u64.. {
        let Some(mut pv) = pvs.get_opt(&name).await.expect("get PV") else {
            panic!("PV {name} vanished while the attacher's finalizer was on it");
        };
        let mut finalizers = pv.finalizers().to_vec();
        if !finalizers.iter().any(|f| f == FINALIZER) {
            finalizers.retain(|f| f != ATTACHER_FINALIZER);
            pv.metadata.finalizers = Some(finalizers);
            if pvs
                .replace(&name, &PostParams::default(), &pv)
                .await
                .is_ok()
            {
                return during;
            }
            continue;
        }
        finalizers.rotate_left(1);
        pv.metadata.finalizers = Some(finalizers);
        pv.annotations_mut()
            .insert("example.com/attach-tick".into(), tick.to_string());
        pv.labels_mut()
            .insert("example.com/attach-tick".into(), tick.to_string());
        let during_delete = deleting.load(Ordering::SeqCst);
        if pvs
            .replace(&name, &PostParams::default(), &pv)
            .await
            .is_ok()
        {
            writes.fetch_add(1, Ordering::SeqCst);
            if during_delete {
                during += 1;
            }
        }
        // A real controller writes when something changes, not in a hot loop; leave the API
        // server some room (this is load shaping, nothing waits on it).
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    unreachable!()
}

// === Attachments ===

#[tokio::test]
async fn attached_volume_waits_with_one_event_and_is_deleted_once_detached() {
    let (cluster, driver, sidecar) = start(&[], &["--http-endpoint=127.0.0.1:0"]).await;
    let pv = cluster.provision("data", "fast").await;
    let (name, id) = (pv.name_any(), volume_id(&pv));
    let vas: Api<VolumeAttachment> = Api::all(cluster.client.clone());
    cluster
        .create(&vas, &attachment("va-1", &name, "node-1"))
        .await;
    // The claim is deleted only once the sidecar knows of the attachment: in a cluster the
    // attachment is old news by then (a pod used the volume), here it is milliseconds old.
    sidecar
        .wait_log(&["volume attachment observed", "va=va-1"], 1)
        .await;

    cluster.delete_pvc_and_wait(NS, "data").await;
    let message = format!("persistentvolume {name} is still attached to node node-1");
    cluster
        .wait_pv_event(&name, "VolumeFailedDelete", &message)
        .await;
    // Several retries later: still one Event, never aggregated, and nothing deleted.
    let pv_field = format!("pv={name}");
    sidecar.wait_log(&[&message, &pv_field], 3).await;
    let failed_delete = |events: Vec<(String, String, i32)>| {
        events
            .into_iter()
            .filter(|(reason, _, _)| reason == "VolumeFailedDelete")
            .map(|(_, message, count)| (message, count))
            .collect::<Vec<_>>()
    };
    let events = failed_delete(cluster.events_counted("PersistentVolume", &name).await);
    assert_eq!(
        events,
        vec![(message.clone(), 1)],
        "one event for the whole wait"
    );
    // Counted as a failed deletion, as upstream does, once for the wait (not per re-check).
    let failed = r#"controller_persistentvolume_delete_failed_total{class="fast"}"#;
    assert_eq!(sidecar.metric(failed).await, Some(1.0));
    assert!(has_finalizer(&cluster.pv(&name).await));
    let state = driver.state().await;
    assert!(
        state.volume(&id).is_some(),
        "an attached volume is not deleted"
    );
    assert_eq!(state.calls("DeleteVolume"), 0);

    vas.delete("va-1", &DeleteParams::default())
        .await
        .expect("detach");
    cluster.wait_pv_gone(&name).await;
    let state = driver.wait_volumes(0).await;
    assert_eq!(state.calls("DeleteVolume"), 1);
    let events = failed_delete(cluster.events_counted("PersistentVolume", &name).await);
    assert_eq!(events, vec![(message, 1)]);
    assert_eq!(
        sidecar.metric(failed).await,
        Some(1.0),
        "the deletion itself is no failure"
    );
}

// === 10: mass deletion ===

#[tokio::test]
async fn two_hundred_claims_deleted_at_once_call_delete_volume_exactly_200_times() {
    const N: usize = 200;
    // A generous CSI timeout: on a loaded machine a slow answer must not count as a second call.
    let (cluster, driver, _sidecar) = start(&[], &["--timeout=60s"]).await;
    let names: Vec<String> = (0..N).map(|i| format!("mass-{i:03}")).collect();

    let started = Instant::now();
    futures::stream::iter(&names)
        .for_each_concurrent(32, |name| {
            let cluster = &cluster;
            async move {
                cluster.claim_of_class(NS, name, "fast", "1Gi").await;
            }
        })
        .await;
    wait_for(&format!("{N} claims Bound"), DEADLINE * 3, || async {
        let list = cluster.pvcs(NS).list(&ListParams::default()).await.ok()?;
        let bound = list
            .items
            .iter()
            .filter(|c| c.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound"))
            .count();
        (bound == N).then_some(())
    })
    .await;
    let provisioning = started.elapsed();
    driver.wait_volumes(N).await;

    let started = Instant::now();
    let before = cluster.sim().counters();
    futures::stream::iter(&names)
        .for_each_concurrent(N, |name| {
            let cluster = &cluster;
            async move { cluster.delete_pvc(name).await }
        })
        .await;
    wait_for(&format!("all {N} PVs gone"), DEADLINE * 3, || async {
        (cluster.pv_count().await == 0).then_some(())
    })
    .await;
    let state = driver.wait_volumes(0).await;
    let deletion = started.elapsed();
    eprintln!("{N} volumes: provisioning took {provisioning:?}, deletion took {deletion:?}");
    assert_eq!(
        state.calls("DeleteVolume"),
        N as u64,
        "DeleteVolume exactly once per volume"
    );
    // The minimum per deleted volume: one PV DELETE and one finalizer PATCH (by value, so the PV
    // protection controller removing its own finalizer at the same moment costs no retry). A PV
    // DELETE may be repeated when a reconcile started from a cache without the deletion yet.
    let spent = cluster
        .sim()
        .counters()
        .since(&before)
        .agent(|a| a.contains("csi-provisioner-rs"));
    let patches = spent.count(Some("patch"), Some("persistentvolumes"), None);
    let deletes = spent.count(Some("delete"), Some("persistentvolumes"), None);
    eprintln!("per deleted volume: {patches} PV patches, {deletes} PV deletes for {N}");
    assert_eq!(patches, N as u64, "{:#}", spent.to_json());
    assert!(deletes <= N as u64 * 11 / 10, "{:#}", spent.to_json());
    assert!(
        spent.writes() - spent.writes_to(Some("events")) <= N as u64 * 21 / 10 + 5,
        "{:#}",
        spent.to_json()
    );
    // Reads too: the claims' absence comes from the cache and the PVs' Released phase, not GETs.
    let requests = spent.total()
        - spent.count(None, Some("events"), None)
        - spent.count(Some("watch"), None, None)
        - spent.count(Some("list"), None, None);
    assert!(requests <= N as u64 * 21 / 10 + 5, "{:#}", spent.to_json());
}
