//! Timeouts, crashes and races: whatever the timing, every claim ends with exactly one volume and
//! a deleted claim with none.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use super::*;
use kube::api::{DeleteParams, ListParams};
use mock_csi_driver::FaultRule;

/// Waits until no PV exists.
async fn wait_no_pvs(cluster: &Cluster) {
    wait_for("every PV to be gone", DEADLINE, || async {
        let list = cluster.pvs().list(&ListParams::default()).await.ok()?;
        list.items.is_empty().then_some(())
    })
    .await;
}

#[tokio::test]
async fn driver_timeouts_are_retried_until_the_volume_exists_once() {
    let cluster = Cluster::start().await;
    let driver = Driver::start(cluster.dir.path(), "node-1", &[]).await;
    // The first two CreateVolume calls create the volume but answer DEADLINE_EXCEEDED.
    driver
        .control()
        .await
        .set_fault(
            "CreateVolume",
            FaultRule::times(tonic::Code::DeadlineExceeded, 2).after_effect(),
        )
        .await
        .unwrap();
    let _sidecar = Sidecar::start(&cluster, &driver, &[]).await;
    cluster.claim_with_fast_class(NS, "data").await;
    let pv = cluster.wait_bound(NS, "data").await;
    let state = driver.wait_volumes(1).await;
    assert!(state.calls("CreateVolume") >= 3);
    assert_eq!(
        state.volumes[0].id,
        pv.spec.unwrap().csi.unwrap().volume_handle
    );
}

#[tokio::test]
async fn pvc_deleted_while_create_volume_hangs_leaves_no_volume() {
    let cluster = Cluster::start().await;
    let driver = Driver::start(cluster.dir.path(), "node-1", &[]).await;
    // Every CreateVolume creates the volume and then times out: the sidecar never learns the id.
    let control = driver.creates_then_times_out().await;
    let sidecar = Sidecar::start(&cluster, &driver, &["--http-endpoint=127.0.0.1:0"]).await;
    cluster.claim_with_fast_class(NS, "data").await;
    driver.wait_volumes(1).await;
    // The operator can see a volume that may exist without a PV.
    sidecar
        .wait_metric("csi_provisioner_claims_with_intent", 1.0)
        .await;

    // The claim is deleted while provisioning is "in progress"; the driver recovers meanwhile.
    cluster
        .pvcs(NS)
        .delete("data", &DeleteParams::default())
        .await
        .unwrap();
    control.clear_faults().await.unwrap();
    cluster.delete_pvc_and_wait(NS, "data").await;
    // A retry that got through just before the deletion was seen made a PV; it goes the usual way.
    wait_no_pvs(&cluster).await;
    let state = driver.wait_volumes(0).await;
    assert!(state.ok_calls("DeleteVolume") >= 1);
    sidecar
        .wait_metric("csi_provisioner_claims_with_intent", 0.0)
        .await;
}

#[tokio::test]
async fn another_drivers_claim_deleted_mid_provisioning_is_left_to_that_drivers_sidecar() {
    // Two drivers run this sidecar; the intent finalizer has the same name for both.
    let cluster = Cluster::start().await;
    let ours = Driver::start(cluster.dir.path(), "node-1", &[]).await;
    let ours_sidecar = Sidecar::start(&cluster, &ours, &[]).await;
    let other_name = "other.csi.rs";
    let other = Driver::start_as(cluster.dir.path(), "other", other_name, &[]).await;
    other.creates_then_times_out().await;
    let mut other_sidecar = Sidecar::start(&cluster, &other, &[]).await;
    let mut class = storage_class("other", &[]);
    class.provisioner = other_name.to_owned();
    cluster.add_class(&class).await;
    cluster.claim_of_class(NS, "data", "other", "1Gi").await;
    other.wait_volumes(1).await;
    cluster.wait_intent(NS, "data", true).await;
    // Each driver has its own ledger: the entry is in the other driver's.
    let entries = cluster.ledger_entries().await;
    assert!(
        entries
            .iter()
            .all(|(ledger, _, _)| ledger.starts_with("other-csi-rs")),
        "{entries:?}"
    );

    // The other driver's sidecar is down when its claim is deleted: ours must not step in.
    other_sidecar.kill().await;
    let seen = ["nothing to do for claim", "claim=default/data", "NotOurs"];
    ours_sidecar.wait_log(&seen, 1).await;
    cluster.delete_pvc_and_wait(NS, "data").await;
    // The record outlives the claim.
    cluster.wait_intent(NS, "data", true).await;

    // Its own sidecar, back, deletes the volume and drops the record; ours never called its driver.
    other.control().await.clear_faults().await.unwrap();
    other_sidecar.restart().await;
    other.wait_volumes(0).await;
    cluster.wait_intent(NS, "data", false).await;
    assert_eq!(ours.state().await.calls("CreateVolume"), 0);
    assert_eq!(ours.state().await.calls("DeleteVolume"), 0);
}

#[tokio::test]
async fn sidecar_killed_during_create_volume_makes_no_second_volume() {
    let cluster = Cluster::start().await;
    let driver = Driver::start(cluster.dir.path(), "node-1", &[]).await;
    let control = driver.control().await;
    // Slow enough that the sidecar is surely killed before the answer (within its --timeout).
    control
        .set_latency("CreateVolume", Duration::from_secs(5))
        .await
        .unwrap();
    let mut sidecar = Sidecar::start(&cluster, &driver, &["--timeout=60s"]).await;
    let pvc = cluster.claim_with_fast_class(NS, "data").await;
    // The intent is recorded before the call; the call is in flight when the sidecar dies.
    cluster.wait_intent(NS, "data", true).await;
    wait_for("CreateVolume in flight", DEADLINE, || async {
        (driver.state().await.calls("CreateVolume") >= 1).then_some(())
    })
    .await;
    sidecar.kill().await;
    // The driver finishes the call on its own: a volume without a PV.
    driver.wait_volumes(1).await;
    assert_eq!(cluster.pv_count().await, 0, "no PV exists");

    control
        .set_latency("CreateVolume", Duration::ZERO)
        .await
        .unwrap();
    sidecar.restart().await;
    let pv = cluster.wait_bound(NS, "data").await;
    let state = driver.wait_volumes(1).await;
    assert_eq!(state.volumes[0].name, format!("pvc-{}", uid(&pvc)));
    assert_eq!(
        state.volumes[0].id,
        pv.spec.unwrap().csi.unwrap().volume_handle
    );
    assert_eq!(
        state.calls("CreateVolume"),
        2,
        "one call before the crash, one replay after"
    );
    cluster.wait_intent(NS, "data", false).await;
}

#[tokio::test]
async fn sidecar_killed_while_the_pv_cannot_be_saved_reuses_the_volume() {
    let cluster = Cluster::start().await;
    let driver = Driver::start(cluster.dir.path(), "node-1", &[]).await;
    let faults = cluster.sim().faults();
    let refuse_pvs = faults.add(
        kube_sim::FaultRule::error(500)
            .verb("create")
            .resource("persistentvolumes"),
    );
    let mut sidecar = Sidecar::start(&cluster, &driver, &[]).await;
    let pvc = cluster.claim_with_fast_class(NS, "data").await;
    cluster
        .wait_claim_event(
            NS,
            "data",
            "ProvisioningFailed",
            "the volume is kept and reused",
        )
        .await;
    driver.wait_volumes(1).await;
    sidecar.kill().await;

    faults.remove(refuse_pvs);
    sidecar.restart().await;
    let pv = cluster.wait_bound(NS, "data").await;
    let state = driver.wait_volumes(1).await;
    assert_eq!(state.volumes[0].name, format!("pvc-{}", uid(&pvc)));
    assert_eq!(
        state.volumes[0].id,
        pv.spec.unwrap().csi.unwrap().volume_handle
    );
}

#[tokio::test]
async fn no_create_volume_before_the_intent_is_recorded_even_while_the_api_server_refuses_it() {
    let (cluster, driver, _sidecar) = start_single_node(&[], &[]).await;
    let faults = cluster.sim().faults();
    // The ledger's first write creates its Lease.
    let refuse_claim_writes = faults.add(
        kube_sim::FaultRule::error(500)
            .verb("create")
            .resource("leases"),
    );
    cluster.claim_with_fast_class(NS, "data").await;
    wait_for(
        "intent writes to be refused and retried",
        DEADLINE,
        || async { (faults.hits(refuse_claim_writes) >= 2).then_some(()) },
    )
    .await;
    // Without a record, a volume could outlive a claim deleted now: none is created,
    // and the claim says why.
    assert_eq!(driver.state().await.calls("CreateVolume"), 0);
    let message = cluster
        .wait_claim_event(NS, "data", "ProvisioningFailed", "provisioning intent")
        .await;
    assert!(
        message.contains("Internal error occurred: injected fault;"),
        "the API server's own message, as upstream prints it: {message}"
    );
    assert!(message.ends_with("; retrying"), "{message}");

    faults.remove(refuse_claim_writes);
    cluster.wait_bound(NS, "data").await;
    let state = driver.wait_volumes(1).await;
    assert_eq!(state.calls("CreateVolume"), 1);
}

#[tokio::test]
async fn pvc_deleted_while_the_sidecar_is_down_gets_its_volume_deleted() {
    let cluster = Cluster::start().await;
    let driver = Driver::start(cluster.dir.path(), "node-1", &[]).await;
    let control = driver.creates_then_times_out().await;
    let mut sidecar = Sidecar::start(&cluster, &driver, &[]).await;
    cluster.claim_with_fast_class(NS, "data").await;
    driver.wait_volumes(1).await;
    cluster.wait_intent(NS, "data", true).await;
    sidecar.kill().await;

    // Deleted while nobody provisions: the claim goes, its record stays in the ledger.
    cluster.delete_pvc_and_wait(NS, "data").await;
    cluster.wait_intent(NS, "data", true).await;
    control.clear_faults().await.unwrap();
    sidecar.restart().await;

    cluster.wait_intent(NS, "data", false).await;
    let state = driver.wait_volumes(0).await;
    assert_eq!(state.ok_calls("DeleteVolume"), 1);
    assert_eq!(cluster.pv_count().await, 0, "no PV exists");
}

#[tokio::test]
async fn claims_deleted_at_every_stage_of_provisioning_leave_nothing_behind() {
    let cluster = Cluster::start().await;
    let driver = Driver::start(cluster.dir.path(), "node-1", &[]).await;
    driver
        .control()
        .await
        .set_latency("CreateVolume", Duration::from_millis(300))
        .await
        .unwrap();
    let _sidecar = Sidecar::start(&cluster, &driver, &[]).await;
    cluster.add_class(&storage_class("fast", &[])).await;
    let names: Vec<String> = (0..12).map(|i| format!("race-{i}")).collect();
    let api = cluster.pvcs(NS);
    // Every third claim is deleted right after its creation, before anything could start.
    for (i, name) in names.iter().enumerate() {
        cluster.create(&api, &claim(NS, name, "fast", "1Gi")).await;
        if i % 3 == 0 {
            api.delete(name, &DeleteParams::default()).await.unwrap();
        }
    }
    // The others while their CreateVolume is in flight, or once bound.
    wait_for("CreateVolume calls in flight", DEADLINE, || async {
        (driver.state().await.calls("CreateVolume") >= 3).then_some(())
    })
    .await;
    for (i, name) in names.iter().enumerate() {
        if i % 3 == 1 {
            let _ = api.delete(name, &DeleteParams::default()).await;
        }
    }
    cluster.wait_bound(NS, "race-2").await;
    for name in &names {
        cluster.delete_pvc_and_wait(NS, name).await;
    }
    wait_no_pvs(&cluster).await;
    let state = driver.wait_volumes(0).await;
    assert!(state.calls("CreateVolume") >= 3);
    assert_eq!(
        state.ok_calls("DeleteVolume"),
        state.ok_calls("CreateVolume") - state.volumes.len() as u64,
    );
}

#[tokio::test]
async fn five_hundred_claims_at_once_get_exactly_five_hundred_volumes() {
    const CLAIMS: usize = 500;
    let (cluster, driver, _sidecar) = start_single_node(&[], &[]).await;
    cluster.add_class(&storage_class("fast", &[])).await;
    let api = cluster.pvcs(NS);
    let before = cluster.sim().counters();
    let started = Instant::now();
    let created: Vec<PersistentVolumeClaim> = futures::stream::iter(0..CLAIMS)
        .map(|i| {
            let api = api.clone();
            async move {
                api.create(
                    &Default::default(),
                    &claim(NS, &format!("bulk-{i}"), "fast", "1Gi"),
                )
                .await
                .expect("create claim")
            }
        })
        .buffer_unordered(32)
        .collect()
        .await;
    let bound = wait_for(
        &format!("{CLAIMS} claims to be Bound"),
        Duration::from_secs(600),
        || async {
            let list = api.list(&ListParams::default()).await.ok()?;
            let bound = list
                .items
                .iter()
                .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound"))
                .count();
            (bound == CLAIMS).then_some(list.items)
        },
    )
    .await;
    eprintln!("{CLAIMS} claims bound in {:?}", started.elapsed());

    let state = driver.state().await;
    let want: BTreeSet<String> = created.iter().map(|p| format!("pvc-{}", uid(p))).collect();
    let have: BTreeSet<String> = state.volumes.iter().map(|v| v.name.clone()).collect();
    assert_eq!(state.volumes.len(), CLAIMS);
    assert_eq!(have, want);
    assert_eq!(
        state.calls("CreateVolume"),
        CLAIMS as u64,
        "no volume was asked for twice"
    );
    let handles: BTreeSet<String> = state.volumes.iter().map(|v| v.id.clone()).collect();
    let pvs = cluster
        .pvs()
        .list(&ListParams::default())
        .await
        .unwrap()
        .items;
    assert_eq!(pvs.len(), CLAIMS);
    for pvc in &bound {
        let pv_name = pvc
            .spec
            .as_ref()
            .and_then(|s| s.volume_name.clone())
            .unwrap();
        let pv = pvs
            .iter()
            .find(|p| p.metadata.name.as_deref() == Some(&pv_name))
            .unwrap();
        assert!(
            handles.contains(
                &pv.spec
                    .as_ref()
                    .unwrap()
                    .csi
                    .as_ref()
                    .unwrap()
                    .volume_handle
            )
        );
    }
    // No double work under load: one PV create each, no claim write; the intents of many
    // claims share each ledger write.
    let spent = cluster.sim().counters().since(&before);
    assert_eq!(
        spent.count(Some("create"), Some("persistentvolumes"), None),
        CLAIMS as u64
    );
    assert_eq!(
        spent.count(Some("patch"), Some("persistentvolumeclaims"), None),
        0,
        "{:#}",
        spent.to_json()
    );
    assert!(
        spent.writes_to(Some("leases")) <= CLAIMS as u64 / 5,
        "{:#}",
        spent.to_json()
    );
    eprintln!(
        "API writes: {} in all, {} ledger writes, {} PV creates, {} claim patches ({} refused), {} event writes",
        spent.writes(),
        spent.writes_to(Some("leases")),
        spent.count(Some("create"), Some("persistentvolumes"), None),
        spent.count(Some("patch"), Some("persistentvolumeclaims"), None),
        spent.count(Some("patch"), Some("persistentvolumeclaims"), Some(422))
            + spent.count(Some("patch"), Some("persistentvolumeclaims"), Some(409)),
        spent.writes_to(Some("events")),
    );
    eprintln!(
        "claim reads: {}",
        spent.count(Some("get"), Some("persistentvolumeclaims"), None)
    );
}

/// The store is chosen once at start-up: a Lease write refused later fails that attempt like any
/// API error, with an event naming the permission, and nothing reaches the driver until the
/// intent is recorded (before: the store switched to claim records at run time).
#[tokio::test]
async fn a_refused_lease_write_fails_the_attempt_with_the_permission_to_grant() {
    let (cluster, driver, _sidecar) = start_single_node(&[], &[]).await;
    // The sidecar may list Leases (it loaded an empty ledger) but not create them.
    let faults = cluster.sim().faults();
    let refused = faults.add(
        kube_sim::FaultRule::error(403)
            .verb("create")
            .resource("leases"),
    );
    let before = cluster.sim().counters();
    cluster.claim_with_fast_class(NS, "data").await;
    let message = cluster
        .wait_claim_event(NS, "data", "ProvisioningFailed", "intent ledger Lease")
        .await;
    assert!(
        message.contains("grant create and update on leases (coordination.k8s.io)"),
        "{message}"
    );
    assert!(faults.hits(refused) >= 1);
    assert_eq!(
        driver.state().await.calls("CreateVolume"),
        0,
        "nothing is sent before the intent is durable"
    );

    // Granted again: the retried attempt records and provisions, with no claim write.
    faults.remove(refused);
    cluster.wait_bound(NS, "data").await;
    let spent = cluster.sim().counters().since(&before);
    assert_eq!(
        spent.count(Some("patch"), Some("persistentvolumeclaims"), None),
        0,
        "{:#}",
        spent.to_json()
    );
    assert_eq!(driver.wait_volumes(1).await.calls("CreateVolume"), 1);
}

#[tokio::test]
async fn a_ledger_lease_deleted_under_the_sidecar_is_written_again() {
    let (cluster, driver, _sidecar) = start_single_node(&[], &[]).await;
    cluster.claim_with_fast_class(NS, "first").await;
    cluster.wait_bound(NS, "first").await;
    let leases: kube::Api<k8s_openapi::api::coordination::v1::Lease> =
        kube::Api::namespaced(cluster.client.clone(), "default");
    let shard = "mock-csi-rs-intents-0";
    wait_for("the ledger Lease", DEADLINE, || async {
        leases.get_opt(shard).await.ok()?.map(|_| ())
    })
    .await;
    leases
        .delete(shard, &DeleteParams::default())
        .await
        .unwrap();

    // The next intent cannot be written where the Lease was: it is created again, and the claim
    // is provisioned only after that.
    cluster.claim_of_class(NS, "second", "fast", "1Gi").await;
    cluster.wait_bound(NS, "second").await;
    wait_for("the ledger Lease written again", DEADLINE, || async {
        leases.get_opt(shard).await.ok()?.map(|_| ())
    })
    .await;
    cluster.wait_intent(NS, "second", false).await;
    assert_eq!(driver.wait_volumes(2).await.calls("CreateVolume"), 2);
}

/// A run without Lease RBAC (intents go on the claims) whose every CreateVolume makes its volume
/// and times out, killed once `claims` (class `fast`) carry their records; the refusal and the
/// driver's fault are lifted, so the next start may use Leases.
async fn records_left_without_leases(
    flags: &[&str],
    claims: &[&str],
) -> (
    Cluster,
    Driver,
    mock_csi_driver::control::ControlClient,
    Sidecar,
    Vec<PersistentVolumeClaim>,
) {
    let cluster = Cluster::start().await;
    let driver = Driver::start(cluster.dir.path(), "node-1", &[]).await;
    let control = driver.creates_then_times_out().await;
    let faults = cluster.sim().faults();
    let refused = faults.add(
        kube_sim::FaultRule::error(403)
            .verb("list")
            .resource("leases"),
    );
    let mut sidecar = Sidecar::start(&cluster, &driver, flags).await;
    let mut made = vec![cluster.claim_with_fast_class(NS, claims[0]).await];
    for name in &claims[1..] {
        made.push(cluster.claim_of_class(NS, name, "fast", "1Gi").await);
    }
    driver.wait_volumes(claims.len()).await;
    for name in claims {
        wait_claim(&cluster, name, "the record on the claim", |pvc| {
            has_intent(pvc).then_some(())
        })
        .await;
    }
    sidecar.kill().await;
    faults.remove(refused);
    control.clear_faults().await.unwrap();
    (cluster, driver, control, sidecar, made)
}

/// Without Lease RBAC at start-up the intents go on their claims; a later run that may use Leases
/// finishes what that run left there: the volume of a claim deleted meanwhile is deleted and the
/// claim let go, and a claim still pending gets the very volume it was created for (no second
/// one), its record removed once its PV exists.
#[tokio::test]
async fn claim_records_left_by_a_run_without_leases_are_finished_by_a_run_with_them() {
    let (cluster, driver, _control, mut sidecar, made) =
        records_left_without_leases(&[], &["kept", "gone"]).await;
    let kept = &made[0];
    // The claim's finalizer holds it, Terminating, until its record is resolved.
    let _ = cluster
        .pvcs(NS)
        .delete("gone", &DeleteParams::default())
        .await;
    sidecar.restart().await;
    cluster.delete_pvc_and_wait(NS, "gone").await;
    let pv = cluster.wait_bound(NS, "kept").await;
    wait_claim(&cluster, "kept", "the record removed", |pvc| {
        (!has_intent(pvc)).then_some(())
    })
    .await;
    cluster.wait_intent(NS, "kept", false).await;
    let state = driver.wait_volumes(1).await;
    assert_eq!(state.volumes[0].name, format!("pvc-{}", uid(kept)));
    assert_eq!(
        state.volumes[0].id,
        pv.spec.unwrap().csi.unwrap().volume_handle
    );
    assert_eq!(
        state.ok_calls("DeleteVolume"),
        1,
        "the deleted claim's volume"
    );
}

/// A claim deleted during CreateVolume that still carries an earlier run's record of the same
/// volume (that run had no Lease RBAC): the claim's own path deletes the volume once and drops
/// the record with the ledger's entry, so the claim is let go with no CreateVolume replayed.
#[tokio::test]
async fn a_claim_carrying_an_earlier_runs_record_deleted_during_create_volume_is_let_go_once() {
    let (cluster, driver, control, mut sidecar, _) =
        records_left_without_leases(&["--timeout=60s"], &["data"]).await;
    control
        .set_latency("CreateVolume", Duration::from_secs(5))
        .await
        .unwrap();
    let before = driver.state().await.calls("CreateVolume");
    sidecar.restart().await;
    wait_for("CreateVolume in flight", DEADLINE, || async {
        (driver.state().await.calls("CreateVolume") > before).then_some(())
    })
    .await;
    cluster
        .pvcs(NS)
        .delete("data", &DeleteParams::default())
        .await
        .unwrap();
    cluster.delete_pvc_and_wait(NS, "data").await;
    let state = driver.wait_volumes(0).await;
    assert_eq!(
        state.calls("CreateVolume"),
        before + 1,
        "the one in flight, no replay"
    );
    assert_eq!(
        sidecar.log_lines_with(&["claim deleted during CreateVolume; volume deleted again"]),
        1,
        "deleted by the claim's own path"
    );
    assert_eq!(state.ok_calls("DeleteVolume"), 1);
    assert_eq!(cluster.pv_count().await, 0, "no PV exists");
}
