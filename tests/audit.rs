//! End to end: `csi-provisioner audit` and `--audit-interval` against kube-sim and the mock
//! driver: each kind of finding made on purpose and reported, in-flight volumes never called
//! leaked, and leaked volumes deleted only with the confirmation flag.

mod common;

use std::collections::BTreeMap;

use common::*;
use k8s_openapi::api::core::v1::{
    CSIPersistentVolumeSource, ObjectReference, PersistentVolume, PersistentVolumeSpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::{ObjectMeta, Patch, PatchParams};
use serde_json::{Value, json};

const NS: &str = "default";

/// Runs `csi-provisioner audit` with the cluster's kubeconfig and the driver's socket.
async fn audit(cluster: &Cluster, driver: &Driver, extra: &[&str]) -> (String, String) {
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_csi-provisioner"))
        .arg("audit")
        .arg(format!("-kubeconfig={}", cluster.kubeconfig.display()))
        .arg(format!("--csi-address={}", driver.socket.display()))
        .args(extra)
        .env_remove("KUBECONFIG")
        .output()
        .await
        .expect("run csi-provisioner audit");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(
        output.status.success(),
        "audit failed ({:?}):\n{stderr}",
        output.status
    );
    (stdout, stderr)
}

async fn audit_json(cluster: &Cluster, driver: &Driver, extra: &[&str]) -> Value {
    let mut args = vec!["-o", "json"];
    args.extend_from_slice(extra);
    let (stdout, stderr) = audit(cluster, driver, &args).await;
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}\n{stderr}"))
}

fn strings(v: &Value, field: Option<&str>) -> Vec<String> {
    let mut out: Vec<String> = v
        .as_array()
        .unwrap_or_else(|| panic!("not a list: {v}"))
        .iter()
        .map(|x| match field {
            Some(f) => x[f].as_str().unwrap_or_default().to_owned(),
            None => x.as_str().unwrap_or_default().to_owned(),
        })
        .collect();
    out.sort();
    out
}

fn handle(pv: &PersistentVolume) -> String {
    pv.spec
        .as_ref()
        .unwrap()
        .csi
        .as_ref()
        .unwrap()
        .volume_handle
        .clone()
}

/// A PV of our driver, Released (its claim never existed), provisioned by someone else: nothing
/// deletes it, so it stays Released.
fn foreign_released_pv(name: &str, handle: &str) -> PersistentVolume {
    PersistentVolume {
        metadata: ObjectMeta {
            name: Some(name.into()),
            annotations: Some(BTreeMap::from([(
                "pv.kubernetes.io/provisioned-by".to_owned(),
                "someone-else".to_owned(),
            )])),
            ..Default::default()
        },
        spec: Some(PersistentVolumeSpec {
            access_modes: Some(vec!["ReadWriteOnce".into()]),
            capacity: Some(BTreeMap::from([(
                "storage".to_owned(),
                Quantity("1Gi".into()),
            )])),
            persistent_volume_reclaim_policy: Some("Delete".into()),
            claim_ref: Some(ObjectReference {
                namespace: Some(NS.into()),
                name: Some("ghost".into()),
                uid: Some("ghost-uid".into()),
                ..Default::default()
            }),
            csi: Some(CSIPersistentVolumeSource {
                driver: DRIVER.into(),
                volume_handle: handle.into(),
                ..Default::default()
            }),
            ..Default::default()
        }),
        status: None,
    }
}

/// A claim of our driver carrying a provisioning intent (as node mode keeps it) for `volume`.
async fn claim_with_intent(cluster: &Cluster, name: &str, volume: &str, id: &str) {
    let mut claim = claim(NS, name, "no-such-class", "1Gi");
    let meta = &mut claim.metadata;
    meta.finalizers = Some(vec![INTENT_FINALIZER.into()]);
    meta.annotations = Some(BTreeMap::from([
        (
            "volume.kubernetes.io/storage-provisioner".to_owned(),
            DRIVER.to_owned(),
        ),
        (
            "csi-provisioner.rs/volume-name".to_owned(),
            volume.to_owned(),
        ),
        ("csi-provisioner.rs/volume-id".to_owned(), id.to_owned()),
    ]));
    cluster.create(&cluster.pvcs(NS), &claim).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_finding_is_reported_in_flight_volumes_are_not_and_orphans_go_only_when_confirmed() {
    let cluster = Cluster::start().await;
    let driver = Driver::start(cluster.dir.path(), "node-1", &[]).await;
    let mut sidecar = Sidecar::start(&cluster, &driver, &[]).await;
    cluster.add_class(&storage_class("fast", &[])).await;
    let mut pvs = BTreeMap::new();
    for name in ["a", "b", "c"] {
        cluster.claim_of_class(NS, name, "fast", "1Gi").await;
        pvs.insert(name, cluster.wait_bound(NS, name).await);
    }
    // Healthy so far: nothing to report.
    let clean = audit_json(&cluster, &driver, &["--min-age=0s"]).await;
    for finding in ["leaked", "lost", "missingFinalizer", "unresolvedIntents"] {
        assert_eq!(clean[finding], json!([]), "{finding} in {clean}");
    }
    assert_eq!(
        (clean["pvs"].as_u64(), clean["volumes"].as_u64()),
        (Some(3), Some(3))
    );

    // Stop the sidecar, then break things behind its back.
    sidecar.terminate().await;
    sidecar.wait_exit().await;
    let leaked = driver.create_volume("leaked-1").await;
    driver.delete_volume(&handle(&pvs["a"])).await;
    let pv_b = pvs["b"].metadata.name.clone().unwrap();
    cluster
        .pvs()
        .patch(
            &pv_b,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await
        .expect("remove PV b's finalizers");
    let stuck_volume = driver.create_volume("stuck-vol").await;
    cluster
        .create(
            &cluster.pvs(),
            &foreign_released_pv("stuck-pv", &stuck_volume),
        )
        .await;
    wait_for("stuck-pv Released", DEADLINE, || async {
        let pv = cluster.pvs().get("stuck-pv").await.ok()?;
        (pv.status?.phase.as_deref() == Some("Released")).then_some(())
    })
    .await;
    // An in-flight volume: created, its intent open, no PV yet.
    let in_flight = driver.create_volume("pvc-in-flight").await;
    claim_with_intent(&cluster, "e", "pvc-in-flight", &in_flight).await;
    claim_with_intent(&cluster, "d", "pvc-never-created", "never-created-id").await;
    cluster
        .pvcs(NS)
        .patch(
            "c",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"metadata": {"annotations": {"csi-provisioner.rs/unused-since": "2026-01-01T00:00:00Z"}}}),
            ),
        )
        .await
        .expect("annotate claim c");

    let report = audit_json(
        &cluster,
        &driver,
        &["--min-age=1s", "--stuck-after=0s", "--unused-for=1h"],
    )
    .await;
    assert_eq!(
        strings(&report["leaked"], None),
        std::slice::from_ref(&leaked),
        "{report}"
    );
    assert_eq!(
        strings(&report["lost"], Some("pv")),
        [pvs["a"].metadata.name.clone().unwrap()],
        "{report}"
    );
    assert_eq!(strings(&report["missingFinalizer"], Some("pv")), [pv_b]);
    let stuck = &report["stuck"][0];
    assert_eq!(
        (stuck["pv"].as_str(), stuck["state"].as_str()),
        (Some("stuck-pv"), Some("Released"))
    );
    assert!(
        stuck["reason"].as_str().unwrap().contains("someone-else"),
        "{stuck}"
    );
    assert_eq!(
        strings(&report["unresolvedIntents"], Some("volume")),
        ["pvc-in-flight", "pvc-never-created"]
    );
    assert_eq!(
        strings(&report["unusedClaims"], Some("claim")),
        ["default/c"]
    );

    // Dry run: listed, not deleted.
    let dry = audit_json(&cluster, &driver, &["--min-age=0s", "--delete-orphans"]).await;
    assert!(
        dry["deleted"][0]["outcome"]
            .as_str()
            .unwrap()
            .contains("dry run"),
        "{dry}"
    );
    assert!(driver.state().await.volume(&leaked).is_some());

    // Confirmed: the leaked volume goes, nothing else does.
    let (table, _) = audit(
        &cluster,
        &driver,
        &["--min-age=0s", "--delete-orphans", "--confirm"],
    )
    .await;
    assert!(table.contains("Leaked volumes (no PV) (1):"), "{table}");
    assert!(
        table
            .lines()
            .any(|l| l.contains(&leaked) && l.ends_with(" deleted")),
        "{table}"
    );
    let state = driver.state().await;
    assert!(
        state.volume(&leaked).is_none(),
        "the leaked volume is still there"
    );
    for kept in [
        &handle(&pvs["b"]),
        &handle(&pvs["c"]),
        &stuck_volume,
        &in_flight,
    ] {
        assert!(state.volume(kept).is_some(), "{kept} was deleted");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_driver_without_list_volumes_gets_the_pv_side_checks_and_a_plain_reason() {
    let cluster = Cluster::start().await;
    let driver = Driver::start(
        cluster.dir.path(),
        "node-1",
        &["--disable-capability=LIST_VOLUMES"],
    )
    .await;
    let report = audit_json(&cluster, &driver, &["--min-age=0s"]).await;
    assert!(
        report["volumesNotChecked"]
            .as_str()
            .unwrap()
            .contains("does not advertise the LIST_VOLUMES controller capability"),
        "{report}"
    );
    assert_eq!(report["volumes"], Value::Null);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_periodic_audit_counts_a_leak_in_its_metrics_and_not_a_volume_being_provisioned() {
    let cluster = Cluster::start().await;
    let driver = Driver::start(cluster.dir.path(), "node-1", &[]).await;
    let sidecar = Sidecar::start(
        &cluster,
        &driver,
        &["--audit-interval=1s", "--http-endpoint=127.0.0.1:0"],
    )
    .await;
    cluster.claim_with_fast_class(NS, "a").await;
    cluster.wait_bound(NS, "a").await;
    let leaked = r#"csi_provisioner_audit_findings{finding="leaked"}"#;
    sidecar.wait_metric(leaked, 0.0).await;
    // Slow provisioning: the volume exists for seconds before its PV does, under its intent.
    driver
        .control()
        .await
        .set_latency("CreateVolume", std::time::Duration::from_secs(3))
        .await
        .expect("set latency");
    cluster.claim_of_class(NS, "slow", "fast", "1Gi").await;
    driver.create_volume("leaked-1").await;
    sidecar.wait_metric(leaked, 1.0).await;
    cluster.wait_bound(NS, "slow").await;
    // Two more rounds after the slow volume was bound: still exactly the one leak.
    let runs = r"csi_provisioner_audit_last_run_timestamp_seconds";
    let before = sidecar.metric(runs).await.unwrap_or_default();
    wait_for("two more audit rounds", DEADLINE, || async {
        (sidecar.metric(runs).await? >= before + 2.0).then_some(())
    })
    .await;
    assert_eq!(sidecar.metric(leaked).await, Some(1.0));
    assert_eq!(
        sidecar
            .metric(r#"csi_provisioner_audit_findings{finding="lost"}"#)
            .await,
        Some(0.0)
    );
}

/// The sidecar's own claim writes (its User-Agent starts with the binary name).
fn sidecar_claim_writes(cluster: &Cluster) -> u64 {
    cluster
        .sim()
        .counters()
        .agent(|a| a.starts_with("csi-provisioner"))
        .writes_to(Some("persistentvolumeclaims"))
}

async fn unused_since(cluster: &Cluster, claim: &str) -> Option<String> {
    let pvc = cluster.pvcs(NS).get(claim).await.expect("get claim");
    annotation(&pvc, "csi-provisioner.rs/unused-since").map(str::to_owned)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unused_claims_are_marked_and_cleared_on_transitions_with_one_write_each() {
    let cluster = Cluster::start().await;
    cluster.add_node("node-1").await;
    let driver = Driver::start(cluster.dir.path(), "node-1", &[]).await;
    let sidecar = Sidecar::start(
        &cluster,
        &driver,
        &["--track-unused-claims", "--http-endpoint=127.0.0.1:0"],
    )
    .await;
    cluster.add_class(&storage_class("fast", &[])).await;
    for name in ["used", "idle"] {
        cluster.claim_of_class(NS, name, "fast", "1Gi").await;
        cluster.wait_bound(NS, name).await;
    }
    // Another driver's claim is never touched.
    let mut foreign = claim(NS, "foreign", "slow", "1Gi");
    foreign.metadata.annotations = Some(BTreeMap::from([(
        "volume.kubernetes.io/storage-provisioner".to_owned(),
        "other.csi".to_owned(),
    )]));
    cluster.create(&cluster.pvcs(NS), &foreign).await;
    cluster.schedule(NS, "app", "used", "node-1").await;

    let since = wait_for("claim idle marked unused", DEADLINE, || {
        unused_since(&cluster, "idle")
    })
    .await;
    since.parse::<jiff::Timestamp>().expect("an RFC 3339 time");
    // The Pod's claim stays unmarked (its mark, if the Pod came after the first look, is cleared).
    wait_for("claim used unmarked", DEADLINE, || async {
        unused_since(&cluster, "used").await.is_none().then_some(())
    })
    .await;
    assert_eq!(unused_since(&cluster, "foreign").await, None);
    sidecar
        .wait_metric(r#"csi_provisioner_unused_claims{age="lt_1d"}"#, 1.0)
        .await;

    // Pod gone: one write marks the claim; Pod back: one write clears it.
    let before = sidecar_claim_writes(&cluster);
    cluster
        .pods(NS)
        .delete("app", &Default::default())
        .await
        .expect("delete pod");
    wait_for("claim used marked unused", DEADLINE, || {
        unused_since(&cluster, "used")
    })
    .await;
    cluster.schedule(NS, "app-2", "used", "node-1").await;
    wait_for("claim used unmarked again", DEADLINE, || async {
        unused_since(&cluster, "used").await.is_none().then_some(())
    })
    .await;
    // A Pod that finishes uses its claim no more.
    cluster
        .pods(NS)
        .patch_status(
            "app-2",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Succeeded"}})),
        )
        .await
        .expect("finish pod");
    wait_for("claim used marked after the Pod finished", DEADLINE, || {
        unused_since(&cluster, "used")
    })
    .await;
    assert_eq!(
        sidecar_claim_writes(&cluster) - before,
        3,
        "one write per transition"
    );
    assert_eq!(
        unused_since(&cluster, "idle").await,
        Some(since.clone()),
        "idle was not rewritten"
    );

    // Kubernetes keeps the Unused condition (KEP-5541) from now on: it is read and nothing is
    // written, even when a Pod starts using the claim (the condition is Kubernetes' to flip).
    cluster
        .pvcs(NS)
        .patch_status(
            "idle",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"conditions": [{
                "type": "Unused", "status": "True",
                "lastTransitionTime": "2026-01-01T00:00:00Z"}]}})),
        )
        .await
        .expect("set the Unused condition");
    let before = sidecar_claim_writes(&cluster);
    cluster.schedule(NS, "app-3", "idle", "node-1").await;
    // A later transition of another claim proves the tracker saw the Pod meanwhile.
    cluster.schedule(NS, "app-4", "used", "node-1").await;
    wait_for("claim used unmarked by app-4", DEADLINE, || async {
        unused_since(&cluster, "used").await.is_none().then_some(())
    })
    .await;
    assert_eq!(
        unused_since(&cluster, "idle").await,
        Some(since),
        "left to the condition"
    );
    assert_eq!(
        sidecar_claim_writes(&cluster) - before,
        1,
        "only claim used was written"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_unused_claim_write_holds_up_no_provisioning() {
    let cluster = Cluster::start().await;
    cluster.add_node("node-1").await;
    let driver = Driver::start(cluster.dir.path(), "node-1", &[]).await;
    let _sidecar = Sidecar::start(&cluster, &driver, &["--track-unused-claims"]).await;
    cluster.add_class(&storage_class("fast", &[])).await;
    cluster.claim_of_class(NS, "idle", "fast", "1Gi").await;
    cluster.wait_bound(NS, "idle").await;
    wait_for("claim idle marked unused", DEADLINE, || {
        unused_since(&cluster, "idle")
    })
    .await;

    // The tracker's next write to idle (clearing its mark once a Pod uses it) hangs.
    let holds = cluster.sim().holds();
    let hold = holds.add(kube_sim::HoldRule {
        verb: Some("patch".to_owned()),
        resource: Some("persistentvolumeclaims".to_owned()),
        name: Some("idle".to_owned()),
        agent: Some("csi-provisioner".to_owned()),
        nth: 1,
        when: kube_sim::When::Before,
    });
    cluster.schedule(NS, "app", "idle", "node-1").await;
    wait_for("the tracker's write held", DEADLINE, || async {
        holds
            .list()
            .iter()
            .any(|h| h.id == hold && h.state == kube_sim::HoldState::Held)
            .then_some(())
    })
    .await;

    // More claim changes than a change stream buffers, while that write hangs.
    let mut foreign = claim(NS, "foreign", "slow", "1Gi");
    foreign.metadata.annotations = Some(BTreeMap::from([(
        "volume.kubernetes.io/storage-provisioner".to_owned(),
        "other.csi".to_owned(),
    )]));
    cluster.create(&cluster.pvcs(NS), &foreign).await;
    for i in 0..1_100 {
        cluster
            .pvcs(NS)
            .patch(
                "foreign",
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"labels": {"change": i.to_string()}}})),
            )
            .await
            .expect("change the foreign claim");
    }
    // The claim watch still reaches the provisioner.
    cluster.claim_of_class(NS, "new", "fast", "1Gi").await;
    cluster.wait_bound(NS, "new").await;

    holds.release(hold, true);
    wait_for("claim idle unmarked", DEADLINE, || async {
        unused_since(&cluster, "idle").await.is_none().then_some(())
    })
    .await;
}
