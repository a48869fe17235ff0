//! The seeds' scenarios on a real Kubernetes 1.20.2 control plane (kube-apiserver,
//! kube-controller-manager, kube-scheduler, etcd): the real PV binder, pv-protection and
//! pvc-protection controllers, the real scheduler placing WaitForFirstConsumer claims, the node
//! lifecycle controller, real Leases, real RBAC. The mock CSI driver stands for the storage.
//!
//! Each test skips, saying why, when `tests/real-cluster/build.sh` has not built the control
//! plane here; `.ci/run` always builds it first.

mod common;

use std::collections::BTreeMap;

use common::real_cluster::{RealCluster, pod_placed_by_scheduler};
use common::*;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::PersistentVolume;
use kube::Api;
use kube::api::{DeleteParams, ListParams};
use mock_csi_driver::holds::HoldWhen;

const NS: &str = "default";
const FINALIZER: &str = "external-provisioner.volume.kubernetes.io/finalizer";
const PV_PROTECTION: &str = "kubernetes.io/pv-protection";

/// Starts the real control plane, or returns from the test (skipped) when it is not built.
macro_rules! real_cluster {
    () => {
        match RealCluster::start().await {
            Some(cluster) => cluster,
            None => return,
        }
    };
}

fn finalizers(pv: &PersistentVolume) -> Vec<String> {
    pv.metadata.finalizers.clone().unwrap_or_default()
}

fn name_of(pv: &PersistentVolume) -> String {
    pv.metadata.name.clone().expect("PV name")
}

fn retained(
    mut class: k8s_openapi::api::storage::v1::StorageClass,
) -> k8s_openapi::api::storage::v1::StorageClass {
    class.reclaim_policy = Some("Retain".into());
    class
}

async fn wait_driver_empty(driver: &Driver) {
    wait_for("the driver to hold no volume", DEADLINE, || async {
        driver.state().await.volumes.is_empty().then_some(())
    })
    .await;
}

#[tokio::test]
async fn immediate_and_wait_for_first_consumer_claims_are_provisioned_and_bound_by_the_real_binder()
{
    let cluster = real_cluster!();
    for node in ["node-1", "node-2"] {
        cluster.add_fake_node_with_driver(node, DRIVER).await;
    }
    // One driver standing for both nodes: the scheduler may pick either.
    let driver = Driver::start(
        cluster.dir.path(),
        "node-1",
        &["--topology", "--topology-node=node-2"],
    )
    .await;
    let _sidecar = Sidecar::start(&cluster, &driver, &["--feature-gates=Topology=true"]).await;

    // Immediate: the real binder completes the binding our PV starts.
    let claim = cluster.claim_with_fast_class(NS, "immediate").await;
    let pv = cluster.wait_bound(NS, "immediate").await;
    assert!(finalizers(&pv).contains(&FINALIZER.to_string()), "{pv:?}");
    assert!(
        finalizers(&pv).contains(&PV_PROTECTION.to_string()),
        "set by the real controller"
    );
    assert_eq!(
        annotation(&pv, "pv.kubernetes.io/provisioned-by"),
        Some(DRIVER)
    );
    let claim_uid = claim.metadata.uid.clone().expect("claim uid");
    assert_eq!(name_of(&pv), format!("pvc-{claim_uid}"));
    let bound = cluster.pvcs(NS).get("immediate").await.expect("claim");
    // 1.20 sets only the beta annotation; the sidecar acts on it.
    assert_eq!(
        annotation(&bound, "volume.beta.kubernetes.io/storage-provisioner"),
        Some(DRIVER)
    );
    assert_eq!(
        annotation(&bound, "pv.kubernetes.io/bind-completed"),
        Some("yes")
    );
    cluster
        .wait_claim_event(
            NS,
            "immediate",
            "ProvisioningSucceeded",
            "Successfully provisioned volume",
        )
        .await;

    // WaitForFirstConsumer: nothing until the real scheduler places a pod and selects a node.
    cluster.add_class(&delayed_class("local")).await;
    cluster.claim_of_class(NS, "delayed", "local", "1Gi").await;
    cluster
        .create(
            &cluster.pods(NS),
            &pod_placed_by_scheduler(NS, "app", "delayed"),
        )
        .await;
    let pv = cluster.wait_bound(NS, "delayed").await;
    let claim = cluster.pvcs(NS).get("delayed").await.expect("claim");
    let selected = annotation(&claim, "volume.kubernetes.io/selected-node")
        .expect("the scheduler selected a node")
        .to_owned();
    assert_eq!(
        affinity_nodes(&pv),
        vec![selected],
        "the volume is where the pod goes"
    );
    assert_eq!(driver.state().await.volumes.len(), 2);
}

#[tokio::test]
async fn a_pv_deleted_before_its_claim_is_deleted_with_its_volume_once_the_claim_goes() {
    let cluster = real_cluster!();
    let driver = Driver::start(cluster.dir.path(), "node-1", &[]).await;
    let _sidecar = Sidecar::start(&cluster, &driver, &[]).await;
    cluster.claim_with_fast_class(NS, "data").await;
    let pv = cluster.wait_bound(NS, "data").await;
    let pv_name = name_of(&pv);

    // KEP-2644: the real pv-protection controller holds the Bound PV; ours holds the volume.
    cluster
        .pvs()
        .delete(&pv_name, &DeleteParams::default())
        .await
        .expect("delete the PV");
    let held = wait_for("the PV to be Terminating", DEADLINE, || async {
        let pv = cluster.pvs().get(&pv_name).await.ok()?;
        pv.metadata.deletion_timestamp.is_some().then_some(pv)
    })
    .await;
    assert!(finalizers(&held).contains(&FINALIZER.to_string()));
    assert_eq!(
        driver.state().await.volumes.len(),
        1,
        "the volume stays while bound"
    );
    assert_eq!(driver.state().await.calls("DeleteVolume"), 0);

    cluster.delete_pvc_and_wait(NS, "data").await;
    cluster.wait_pv_gone(&pv_name).await;
    wait_driver_empty(&driver).await;
    assert_eq!(
        driver.state().await.calls("DeleteVolume"),
        1,
        "deleted once"
    );
}

#[tokio::test]
async fn a_claim_deleted_while_create_volume_is_in_flight_leaves_no_volume() {
    let cluster = real_cluster!();
    let driver = Driver::start(cluster.dir.path(), "node-1", &[]).await;
    driver
        .control()
        .await
        .set_latency("CreateVolume", std::time::Duration::from_secs(3))
        .await
        .expect("slow CreateVolume");
    let _sidecar = Sidecar::start(&cluster, &driver, &[]).await;
    cluster.claim_with_fast_class(NS, "brief").await;
    // The intent is recorded before the call (the intent ledger on a real Lease).
    cluster.wait_intent(NS, "brief", true).await;
    wait_for("CreateVolume in flight", DEADLINE, || async {
        (driver.state().await.calls("CreateVolume") >= 1).then_some(())
    })
    .await;
    cluster.delete_pvc_and_wait(NS, "brief").await;

    // The slow call still makes the volume; the sidecar deletes it and drops its record.
    wait_for("the volume made and deleted again", DEADLINE, || async {
        let state = driver.state().await;
        (state.calls("DeleteVolume") >= 1 && state.volumes.is_empty()).then_some(())
    })
    .await;
    cluster.wait_intent(NS, "brief", false).await;
    assert_eq!(
        cluster.pv_count().await,
        0,
        "no PV for a claim that is gone"
    );
}

#[tokio::test]
async fn retain_keeps_the_volume_and_the_pv_after_the_claim_is_deleted() {
    let cluster = real_cluster!();
    let driver = Driver::start(cluster.dir.path(), "node-1", &[]).await;
    let _sidecar = Sidecar::start(&cluster, &driver, &[]).await;
    cluster
        .add_class(&retained(storage_class("kept", &[])))
        .await;
    cluster.claim_of_class(NS, "precious", "kept", "1Gi").await;
    let pv = cluster.wait_bound(NS, "precious").await;
    let pv_name = name_of(&pv);
    // Created with the finalizer, as upstream does; the reclaim controller drops it from a Retain
    // PV, which may come after the binder has bound it.
    wait_for(
        "a Retain PV without the deletion-protection finalizer",
        DEADLINE,
        || async {
            let pv = cluster.pvs().get(&pv_name).await.ok()?;
            (!finalizers(&pv).contains(&FINALIZER.to_string())).then_some(())
        },
    )
    .await;

    cluster.delete_pvc_and_wait(NS, "precious").await;
    // The real binder releases the PV; the sidecar leaves it and its volume alone.
    let released = wait_for("the PV to be Released", DEADLINE, || async {
        let pv = cluster.pvs().get(&pv_name).await.ok()?;
        (pv.status.as_ref()?.phase.as_deref() == Some("Released")).then_some(pv)
    })
    .await;
    assert!(released.metadata.deletion_timestamp.is_none());
    // A second claim provisioned after the release shows the sidecar has worked since.
    cluster.claim_of_class(NS, "witness", "kept", "1Gi").await;
    cluster.wait_bound(NS, "witness").await;
    let state = driver.state().await;
    assert_eq!(state.calls("DeleteVolume"), 0);
    assert_eq!(state.volumes.len(), 2);
    assert!(
        cluster
            .pvs()
            .get_opt(&pv_name)
            .await
            .expect("read")
            .is_some()
    );
}

/// Node mode on a real control plane: three fake nodes, each with its driver and sidecar.
struct Member {
    node: String,
    driver: Driver,
    sidecar: Sidecar,
}

async fn node_fleet(cluster: &RealCluster, nodes: &[&str]) -> Vec<Member> {
    let mut members = Vec::new();
    for node in nodes {
        cluster.add_fake_node_with_driver(node, DRIVER).await;
        let driver = Driver::start(cluster.dir.path(), node, &["--topology"]).await;
        let sidecar = Sidecar::start_env(
            cluster,
            &driver,
            &[
                "--node-deployment",
                "--feature-gates=Topology=true",
                "--node-deployment-base-delay=100ms",
                "--node-deployment-max-delay=1s",
                "--deleted-node-grace-period=4s",
                "--http-endpoint=127.0.0.1:0",
            ],
            &[("NODE_NAME", node)],
        )
        .await;
        sidecar.wait_started().await;
        members.push(Member {
            node: node.to_string(),
            driver,
            sidecar,
        });
    }
    cluster.add_class(&delayed_class("local")).await;
    members
}

/// A claim of class `local` whose pod the real scheduler places on `node` (the only node the
/// pod's selector admits); returns its PV once bound, then deletes the pod.
async fn claim_placed_on(cluster: &RealCluster, claim: &str, node: &str) -> PersistentVolume {
    cluster.claim_of_class(NS, claim, "local", "1Gi").await;
    let mut pod = pod_placed_by_scheduler(NS, &format!("pod-{claim}"), claim);
    pod.spec.as_mut().expect("spec").node_selector = Some(BTreeMap::from([(
        "kubernetes.io/hostname".to_string(),
        node.to_string(),
    )]));
    cluster.create(&cluster.pods(NS), &pod).await;
    let pv = cluster.wait_bound(NS, claim).await;
    assert_eq!(affinity_nodes(&pv), vec![node.to_string()]);
    cluster
        .pods(NS)
        .delete(
            &format!("pod-{claim}"),
            &DeleteParams::default().grace_period(0),
        )
        .await
        .expect("delete pod");
    pv
}

#[tokio::test]
async fn node_mode_answers_a_deleted_node_after_the_grace_period_and_never_one_that_only_stopped_heartbeating()
 {
    let cluster = real_cluster!();
    let mut members = node_fleet(&cluster, &["node-a", "node-b", "node-c"]).await;
    let quiet = claim_placed_on(&cluster, "on-quiet-node", "node-a").await;
    let lost = claim_placed_on(&cluster, "on-lost-node", "node-c").await;

    // node-a stops heartbeating (its kubelet, driver and sidecar are down) but still exists:
    // the real node lifecycle controller marks it Unknown and taints it.
    members[0].sidecar.kill().await;
    members[0].driver.kill().await;
    cluster.wait_node_unreachable("node-a").await;
    cluster.delete_pvc_and_wait(NS, "on-quiet-node").await;

    // node-c is deleted for good; the real garbage collector removes its CSINode.
    members[2].sidecar.kill().await;
    members[2].driver.kill().await;
    cluster
        .nodes()
        .delete("node-c", &DeleteParams::default())
        .await
        .expect("delete node-c");
    cluster.delete_pvc_and_wait(NS, "on-lost-node").await;

    // The survivor answers node-c's volume after the grace period, without a driver call.
    let lost_name = name_of(&lost);
    cluster.wait_pv_gone(&lost_name).await;
    let message = cluster
        .wait_pv_event(&lost_name, "VolumeNodeGone", "node \"node-c\"")
        .await;
    assert!(message.contains("no longer exists"), "{message}");
    assert_eq!(members[1].driver.state().await.calls("DeleteVolume"), 0);

    // node-a's volume, released earlier, was seen by the same passes and is never answered:
    // its Node exists, however unreachable.
    let kept = cluster
        .pvs()
        .get(&name_of(&quiet))
        .await
        .expect("node-a's PV stays");
    assert!(kept.metadata.deletion_timestamp.is_none());
    assert!(finalizers(&kept).contains(&FINALIZER.to_string()));
    assert_eq!(
        cluster
            .event_count("PersistentVolume", "", &name_of(&quiet), "VolumeNodeGone")
            .await,
        0
    );
    let survivor = &members[1];
    assert_eq!(survivor.node, "node-b");
    assert_eq!(
        survivor
            .sidecar
            .metric("csi_provisioner_deleted_node_volumes_total")
            .await,
        Some(1.0),
        "one volume answered: node-c's"
    );
}

#[tokio::test]
async fn leader_election_on_a_real_lease_fails_over_to_the_standby() {
    let cluster = real_cluster!();
    let flags = [
        "--leader-election",
        "--leader-election-namespace=default",
        "--leader-election-lease-duration=4s",
        "--leader-election-renew-deadline=3s",
        "--leader-election-retry-period=500ms",
    ];
    let mut replicas = Vec::new();
    for id in ["replica-1", "replica-2"] {
        let driver = Driver::start(cluster.dir.path(), id, &[]).await;
        let sidecar = Sidecar::start_named(
            &cluster,
            &driver,
            &format!("sidecar-{id}"),
            &flags,
            &[("HOSTNAME", id)],
        )
        .await;
        replicas.push((id, driver, sidecar));
    }
    let leases: Api<Lease> = Api::namespaced(cluster.client.clone(), NS);
    let holder = || async {
        let lease = leases.get_opt("mock-csi-rs").await.ok()??;
        lease.spec?.holder_identity.filter(|h| !h.is_empty())
    };
    let first = wait_for("a leader", DEADLINE, holder).await;
    let leader = replicas
        .iter()
        .position(|(id, ..)| *id == first)
        .expect("a replica leads");

    cluster.claim_with_fast_class(NS, "before").await;
    cluster.wait_bound(NS, "before").await;
    assert_eq!(replicas[leader].1.state().await.calls("CreateVolume"), 1);
    assert_eq!(
        replicas[1 - leader].1.state().await.calls("CreateVolume"),
        0,
        "the standby waits"
    );

    replicas[leader].2.kill().await;
    let standby = replicas[1 - leader].0;
    wait_for("the standby to take the Lease", DEADLINE, || async {
        (holder().await.as_deref() == Some(standby)).then_some(())
    })
    .await;
    cluster.claim_of_class(NS, "after", "fast", "1Gi").await;
    cluster.wait_bound(NS, "after").await;
    assert_eq!(
        replicas[1 - leader].1.state().await.calls("CreateVolume"),
        1
    );
}

#[tokio::test]
async fn the_intent_ledger_on_a_real_lease_loses_nothing_when_the_sidecar_dies_after_create_volume()
{
    let cluster = real_cluster!();
    let driver = Driver::start(cluster.dir.path(), "node-1", &[]).await;
    let control = driver.control().await;
    // The crash point "after CreateVolume, before its answer": the volume exists, the sidecar
    // never hears of it.
    control
        .set_hold("CreateVolume", 1, HoldWhen::After)
        .await
        .expect("hold");
    let mut sidecar = Sidecar::start(&cluster, &driver, &[]).await;
    cluster.claim_with_fast_class(NS, "crash").await;
    cluster.wait_intent(NS, "crash", true).await;
    let entries = cluster.ledger_entries().await;
    assert_eq!(entries.len(), 1, "{entries:?}");
    driver.wait_volumes(1).await;
    sidecar.kill().await;
    // While it is down the claim goes; the volume would leak without the record.
    cluster.delete_pvc_and_wait(NS, "crash").await;
    control
        .release_hold("CreateVolume", true)
        .await
        .expect("release");

    sidecar.restart().await;
    wait_driver_empty(&driver).await;
    cluster.wait_intent(NS, "crash", false).await;
    assert_eq!(cluster.pv_count().await, 0);
    let leases: Api<Lease> = Api::all(cluster.client.clone());
    let ledgers = leases
        .list(&ListParams::default().labels(LEDGER_LABEL))
        .await
        .expect("list ledgers");
    assert!(!ledgers.items.is_empty(), "the ledger is a real Lease");
}

/// Applies a manifest with kubectl as an administrator would; `None` when kubectl is absent.
fn kubectl_apply(cluster: &RealCluster, manifest: &str) -> Option<()> {
    let kubectl = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|p| p.join("kubectl"))
            .find(|p| p.is_file())
    })?;
    let file = cluster.dir.path().join("manifest.yaml");
    std::fs::write(&file, manifest).expect("write manifest");
    let out = std::process::Command::new(kubectl)
        .arg(format!("--kubeconfig={}", cluster.kubeconfig.display()))
        .args(["apply", "-f"])
        .arg(&file)
        .output()
        .expect("run kubectl");
    assert!(
        out.status.success(),
        "kubectl apply: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some(())
}

/// deploy/rbac.yaml as shipped, or with the `create` verb of PersistentVolumes removed.
fn deploy_rbac(without_pv_create: bool) -> String {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/rbac.yaml"))
        .expect("deploy/rbac.yaml");
    if !without_pv_create {
        return text;
    }
    let full = r#"verbs: ["get", "list", "watch", "create", "patch", "delete"]"#;
    assert_eq!(
        text.matches(full).count(),
        1,
        "the PV rule of deploy/rbac.yaml changed"
    );
    text.replace(
        full,
        r#"verbs: ["get", "list", "watch", "patch", "delete"]"#,
    )
}

async fn sidecar_as_service_account(cluster: &RealCluster, driver: &Driver) -> Sidecar {
    let kubeconfig = cluster
        .service_account_kubeconfig(NS, "csi-provisioner")
        .await;
    let kubeconfig_flag = format!("--kubeconfig={}", kubeconfig.display());
    Sidecar::start_env(
        cluster,
        driver,
        &[&kubeconfig_flag, "--http-endpoint=127.0.0.1:0"],
        &[("POD_NAME", "csi-provisioner-0"), ("NAMESPACE", NS)],
    )
    .await
}

#[tokio::test]
async fn with_the_shipped_rbac_the_self_check_finds_nothing_missing_and_claims_are_provisioned() {
    let cluster = real_cluster!();
    if kubectl_apply(&cluster, &deploy_rbac(false)).is_none() {
        eprintln!("SKIPPED: kubectl not found on PATH");
        return;
    }
    let driver = Driver::start(cluster.dir.path(), "node-1", &[]).await;
    let sidecar = sidecar_as_service_account(&cluster, &driver).await;
    sidecar
        .wait_log(
            &["RBAC self-check: every permission this configuration needs is granted"],
            1,
        )
        .await;
    assert_eq!(sidecar.log_lines_with(&["missing RBAC permission"]), 0);
    cluster.claim_with_fast_class(NS, "data").await;
    let pv = cluster.wait_bound(NS, "data").await;
    cluster.delete_pvc_and_wait(NS, "data").await;
    cluster.wait_pv_gone(&name_of(&pv)).await;
    wait_driver_empty(&driver).await;
}

#[tokio::test]
async fn with_one_rule_removed_the_self_check_names_it_and_the_claim_says_what_happened() {
    let cluster = real_cluster!();
    if kubectl_apply(&cluster, &deploy_rbac(true)).is_none() {
        eprintln!("SKIPPED: kubectl not found on PATH");
        return;
    }
    let driver = Driver::start(cluster.dir.path(), "node-1", &[]).await;
    let sidecar = sidecar_as_service_account(&cluster, &driver).await;
    sidecar
        .wait_log(
            &["missing RBAC permission", "cannot create persistentvolumes"],
            1,
        )
        .await;
    sidecar
        .wait_log(&["  resources: [\"persistentvolumes\"]"], 1)
        .await;
    assert_eq!(
        sidecar.log_lines_with(&["cannot delete persistentvolumes"]),
        0
    );

    cluster.claim_with_fast_class(NS, "data").await;
    let message = cluster
        .wait_claim_event(NS, "data", "ProvisioningFailed", "forbidden")
        .await;
    assert!(
        message.contains("cannot create resource \"persistentvolumes\""),
        "the API server's own words: {message}"
    );
    assert!(
        !message.contains("Api(") && !message.contains("ErrorResponse"),
        "{message}"
    );
    // As upstream, the volume is kept for the PV that cannot be written yet (one volume, reused
    // by every retry), never deleted and made again.
    let state = driver.state().await;
    assert_eq!(state.volumes.len(), 1);
    assert_eq!(state.calls("DeleteVolume"), 0);

    // The rule comes back: the claim is provisioned without a restart.
    kubectl_apply(&cluster, &deploy_rbac(false)).expect("kubectl");
    cluster.wait_bound(NS, "data").await;
    assert_eq!(
        driver.state().await.volumes.len(),
        1,
        "the kept volume is the claim's"
    );
}

#[tokio::test]
async fn on_kubernetes_1_20_the_sidecar_says_once_which_features_are_off_and_works() {
    let cluster = real_cluster!();
    let driver = Driver::start(cluster.dir.path(), "node-1", &[]).await;
    let mut sidecar = Sidecar::start_env(
        &cluster,
        &driver,
        &[
            "--feature-gates=VolumeAttributesClass=true",
            "--enable-capacity",
            "--capacity-poll-interval=1s",
        ],
        &[("NAMESPACE", NS), ("POD_NAME", "csi-provisioner-0")],
    )
    .await;
    cluster.claim_with_fast_class(NS, "data").await;
    let pv = cluster.wait_bound(NS, "data").await;
    cluster.delete_pvc_and_wait(NS, "data").await;
    cluster.wait_pv_gone(&name_of(&pv)).await;

    let off = ["features off on this API server"];
    assert_eq!(sidecar.log_lines_with(&off), 1, "said once");
    assert_eq!(
        sidecar.log_lines_with(&[
            "features off",
            "VolumeAttributesClass",
            "storage capacity tracking"
        ]),
        1,
        "{}",
        sidecar.log()
    );
    // No crash loop and no error spam: nothing retries a kind the server lacks.
    assert!(sidecar.is_running(), "still running");
    let log = sidecar.log();
    let errors = log.lines().filter(|l| l.contains(" ERROR ")).count();
    assert_eq!(errors, 0, "{log}");
    assert_eq!(
        sidecar.log_lines_with(&["csistoragecapacities"]),
        0,
        "{log}"
    );
    sidecar.kill().await;
}

/// Whether the sidecar's ServiceAccount may list Leases in `NS` now (the API server's own answer:
/// an RBAC change takes a moment to reach its authorizer).
async fn service_account_may_list_leases(cluster: &RealCluster) -> bool {
    use k8s_openapi::api::authorization::v1::{
        ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
    };
    let review = SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(format!("system:serviceaccount:{NS}:csi-provisioner")),
            resource_attributes: Some(ResourceAttributes {
                group: Some("coordination.k8s.io".into()),
                resource: Some("leases".into()),
                verb: Some("list".into()),
                namespace: Some(NS.into()),
                ..ResourceAttributes::default()
            }),
            ..SubjectAccessReviewSpec::default()
        },
        ..SubjectAccessReview::default()
    };
    let api: Api<SubjectAccessReview> = Api::all(cluster.client.clone());
    api.create(&kube::api::PostParams::default(), &review)
        .await
        .ok()
        .and_then(|r| r.status)
        .is_some_and(|s| s.allowed)
}

/// RBAC without Leases puts the intents on the claims (a finalizer and annotations); once Leases
/// are granted, the next start uses the Lease ledger and finishes what the earlier run left on
/// the claims: a claim deleted meanwhile has its volume deleted and is let go, and a pending one
/// gets the very volume it was created for, its record removed.
#[tokio::test]
async fn claim_records_left_without_lease_rbac_are_finished_once_leases_are_granted() {
    let cluster = real_cluster!();
    let full = deploy_rbac(false);
    let lease_rule = r#"  - apiGroups: ["coordination.k8s.io"]
    resources: ["leases"]
    verbs: ["get", "watch", "list", "delete", "update", "create"]
"#;
    assert_eq!(
        full.matches(lease_rule).count(),
        1,
        "the Lease rule of deploy/rbac.yaml changed"
    );
    if kubectl_apply(&cluster, &full.replace(lease_rule, "")).is_none() {
        eprintln!("SKIPPED: kubectl not found on PATH");
        return;
    }
    wait_for("the Lease rule gone", DEADLINE, || async {
        (!service_account_may_list_leases(&cluster).await).then_some(())
    })
    .await;
    let driver = Driver::start(cluster.dir.path(), "node-1", &[]).await;
    // Every CreateVolume makes its volume and times out: the records stay.
    let control = driver.creates_then_times_out().await;
    let mut sidecar = sidecar_as_service_account(&cluster, &driver).await;
    let kept = cluster.claim_with_fast_class(NS, "kept").await;
    cluster.claim_of_class(NS, "gone", "fast", "1Gi").await;
    driver.wait_volumes(2).await;
    cluster.wait_intent(NS, "kept", true).await;
    cluster.wait_intent(NS, "gone", true).await;
    assert_eq!(
        sidecar.log_lines_with(&["the intent ledger is off"]),
        1,
        "the records are on the claims"
    );
    sidecar.kill().await;
    // The record's finalizer holds the claim, Terminating, until the record is resolved.
    let _ = cluster
        .pvcs(NS)
        .delete("gone", &DeleteParams::default())
        .await;

    kubectl_apply(&cluster, &full);
    wait_for("the Lease rule granted", DEADLINE, || async {
        service_account_may_list_leases(&cluster)
            .await
            .then_some(())
    })
    .await;
    control.clear_faults().await.unwrap();
    sidecar.restart().await;
    sidecar.wait_log(&["intent ledger loaded"], 1).await;
    cluster.delete_pvc_and_wait(NS, "gone").await;
    let pv = cluster.wait_bound(NS, "kept").await;
    cluster.wait_intent(NS, "kept", false).await;
    let state = driver.wait_volumes(1).await;
    let uid = kept.metadata.uid.clone().expect("claim UID");
    assert_eq!(state.volumes[0].name, format!("pvc-{uid}"));
    assert_eq!(
        state.volumes[0].id,
        pv.spec.and_then(|s| s.csi).expect("CSI PV").volume_handle
    );
    assert_eq!(
        state.ok_calls("DeleteVolume"),
        1,
        "the deleted claim's volume"
    );
}

/// The environment variable that makes [`holds_a_child_until_killed`] play its part.
const CHILD_ROLE: &str = "CSI_PROVISIONER_TEST_HOLDS_A_CHILD";

/// A test killed outright (a timeout's SIGKILL, the OOM killer) leaves none of the processes the
/// harness started running: here a test process that started one is SIGKILLed, and its child
/// goes with it. Without `dying_with_test` the child would stay, as control planes used to.
#[test]
fn a_test_killed_outright_leaves_no_process_behind() {
    use std::io::{BufRead, BufReader};
    let mut holder = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "holds_a_child_until_killed",
            "--exact",
            "--ignored",
            "--nocapture",
        ])
        .env(CHILD_ROLE, "1")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let lines = BufReader::new(holder.stdout.take().unwrap()).lines();
    let child: i32 = lines
        .map_while(Result::ok)
        .find_map(|line| line.strip_prefix("child ")?.trim().parse().ok())
        .expect("the holder names its child");
    let alive = |pid: i32| {
        std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
            !stat
                .rsplit(')')
                .next()
                .unwrap_or("")
                .trim_start()
                .starts_with('Z')
        })
    };
    // Once the child runs its program: `setpriv` sets the parent-death signal just before.
    let runs_sleep = || {
        std::fs::read_to_string(format!("/proc/{child}/comm")).is_ok_and(|c| c.trim() == "sleep")
    };
    let deadline = std::time::Instant::now() + DEADLINE;
    while !runs_sleep() {
        assert!(
            std::time::Instant::now() < deadline,
            "child {child} never ran its program"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert!(alive(child), "the child runs while its test does");
    holder.kill().unwrap();
    holder.wait().unwrap();
    let deadline = std::time::Instant::now() + DEADLINE;
    while alive(child) {
        assert!(
            std::time::Instant::now() < deadline,
            "child {child} outlived its test"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// The killed test of [`a_test_killed_outright_leaves_no_process_behind`]: starts a child as the
/// harness starts its processes, names it, and waits to be killed. Runs only when asked for.
#[test]
#[ignore = "a part of a_test_killed_outright_leaves_no_process_behind"]
#[allow(
    clippy::zombie_processes,
    reason = "killed before its child, which is what the test checks"
)]
fn holds_a_child_until_killed() {
    if std::env::var_os(CHILD_ROLE).is_none() {
        return;
    }
    let child = dying_with_test("sleep").arg("600").spawn().unwrap();
    println!("child {}", child.id());
    loop {
        std::thread::park();
    }
}
