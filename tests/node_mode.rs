//! End to end: node-deployment mode (one mock driver and one sidecar per simulated node) and the
//! answer for volumes whose node no longer exists, on the API simulator.
//!
//! "A node goes away" is simulated as it happens in a cluster: its pods are gone, its driver and
//! sidecar stop, and its Node and CSINode objects are deleted.

mod common;

use std::collections::{BTreeMap, BTreeSet};

use common::*;
use k8s_openapi::api::core::v1::{
    CSIPersistentVolumeSource, ObjectReference, PersistentVolume, PersistentVolumeSpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::{DeleteParams, ObjectMeta};
use kube_sim::FaultRule;

const NS: &str = "default";
/// The three nodes of a node-mode fleet.
const NODES: [&str; 3] = ["node-a", "node-b", "node-c"];
/// Our annotations and labels (see `csi_provisioner::names`).
const ANN_NODE_NAME: &str = "csi-provisioner.rs/node-name";
const ANN_NODE_UID: &str = "csi-provisioner.rs/node-uid";
const LABEL_PV_NODE: &str = "csi-provisioner.rs/node";
const LABEL_PV_DRIVER: &str = "csi-provisioner.rs/driver";
const FINALIZER: &str = "external-provisioner.volume.kubernetes.io/finalizer";
const GONE: &str = "VolumeNodeGone";
const ANSWERED: &str = "csi_provisioner_deleted_node_volumes_total";
const CLAIMS_DELETED: &str = "csi_provisioner_deleted_node_claims_total";
const WAITING: &str = "csi_provisioner_volumes_waiting_for_missing_node";

/// One simulated node: its mock driver and its node-mode sidecar.
struct Member {
    node: String,
    driver: Driver,
    sidecar: Sidecar,
}

/// Registers `node` (Node + CSINode) and starts its driver and node-mode sidecar.
async fn join(cluster: &Cluster, node: &str, extra: &[&str]) -> Member {
    join_with_driver(cluster, node, &[], extra).await
}

/// [`join`] with extra flags for the node's mock driver too.
async fn join_with_driver(
    cluster: &Cluster,
    node: &str,
    driver_extra: &[&str],
    extra: &[&str],
) -> Member {
    cluster.add_node(node).await;
    let mut driver_flags = vec!["--topology"];
    driver_flags.extend_from_slice(driver_extra);
    let driver = Driver::start(cluster.dir.path(), node, &driver_flags).await;
    let mut flags = vec![
        "--node-deployment",
        "--feature-gates=Topology=true",
        "--node-deployment-base-delay=100ms",
        "--node-deployment-max-delay=1s",
        "--http-endpoint=127.0.0.1:0",
    ];
    flags.extend_from_slice(extra);
    let sidecar = Sidecar::start_env(cluster, &driver, &flags, &[("NODE_NAME", node)]).await;
    sidecar.wait_started().await;
    Member {
        node: node.to_owned(),
        driver,
        sidecar,
    }
}

/// Every one of [`NODES`] joined with `extra` sidecar flags.
async fn fleet(cluster: &Cluster, extra: &[&str]) -> Vec<Member> {
    let mut members = Vec::new();
    for node in NODES {
        members.push(join(cluster, node, extra).await);
    }
    members
}

/// [`NODES`] joined (see [`fleet`]) and the WaitForFirstConsumer StorageClass `local`.
async fn local_fleet(cluster: &Cluster, extra: &[&str]) -> Vec<Member> {
    let members = fleet(cluster, extra).await;
    cluster.add_class(&delayed_class("local")).await;
    members
}

/// Claim `data` of class `local` provisioned on node-a (`members[0]`), then its pod is gone and
/// node-a goes away; returns the PV's name.
async fn volume_on_a_lost_node(cluster: &Cluster, members: &mut [Member]) -> String {
    let pv = claim_on(cluster, "data", "local", "node-a").await;
    let pv_name = name_of(&pv);
    members[0].driver.wait_volumes(1).await;
    delete_pod(cluster, "data").await;
    lose_node(cluster, &mut members[0]).await;
    pv_name
}

/// A claim of `class` whose selected-node annotation already names `node` (a scheduler's choice).
async fn claim_selected_to(cluster: &Cluster, name: &str, class: &str, node: &str) {
    let mut pvc = claim(NS, name, class, "1Gi");
    pvc.metadata.annotations = Some(BTreeMap::from([(
        "volume.kubernetes.io/selected-node".to_string(),
        node.to_string(),
    )]));
    cluster.create(&cluster.pvcs(NS), &pvc).await;
}

/// Waits until claim `name` carries no selected-node annotation.
async fn wait_selected_node_removed(cluster: &Cluster, name: &str) {
    wait_for("the selected node to be removed", DEADLINE, || async {
        let pvc = cluster.pvcs(NS).get(name).await.ok()?;
        let annotations = pvc.metadata.annotations.unwrap_or_default();
        (!annotations.contains_key("volume.kubernetes.io/selected-node")).then_some(())
    })
    .await;
}

/// The node goes away for good: its driver and sidecar stop, its Node and CSINode are deleted.
async fn lose_node(cluster: &Cluster, member: &mut Member) {
    member.sidecar.kill().await;
    member.driver.kill().await;
    cluster.delete_node(&member.node).await;
}

/// A claim of `class` used by a pod on `node` (the scheduler stand-in selects the node).
async fn claim_on(cluster: &Cluster, name: &str, class: &str, node: &str) -> PersistentVolume {
    cluster.claim_of_class(NS, name, class, "1Gi").await;
    let pod = format!("pod-{name}");
    cluster.schedule(NS, &pod, name, node).await;
    cluster.wait_bound(NS, name).await
}

async fn delete_pod(cluster: &Cluster, claim: &str) {
    let _ = cluster
        .pods(NS)
        .delete(&format!("pod-{claim}"), &DeleteParams::default())
        .await;
}

fn name_of(pv: &PersistentVolume) -> String {
    pv.metadata.name.clone().expect("PV name")
}

/// The members after node-a (`members[0]`, the one that goes away).
fn survivors(members: &[Member]) -> Vec<&Member> {
    members[1..].iter().collect()
}

/// Sum of an unlabelled metric over the members' sidecars (those that answer).
async fn metric_sum(members: &[&Member], name: &str) -> f64 {
    let mut sum = 0.0;
    for m in members {
        sum += m.sidecar.metric(name).await.unwrap_or(0.0);
    }
    sum
}

/// Waits until the metric summed over `members` equals `want`.
async fn wait_metric_sum(members: &[&Member], name: &str, want: f64) {
    wait_for(
        &format!("{name} summed over the instances to be {want}"),
        DEADLINE,
        || async { (metric_sum(members, name).await == want).then_some(()) },
    )
    .await;
}

async fn pv_exists(cluster: &Cluster, name: &str) -> Option<PersistentVolume> {
    cluster.pvs().get_opt(name).await.expect("read PV")
}

#[tokio::test]
async fn delayed_binding_each_claim_is_provisioned_by_its_selected_nodes_instance_only() {
    let cluster = Cluster::start().await;
    let members = local_fleet(&cluster, &[]).await;

    let mut pvs = BTreeMap::new();
    for node in NODES {
        let pv = claim_on(&cluster, &format!("data-{node}"), "local", node).await;
        pvs.insert(node, pv);
    }
    for m in &members {
        let pv = &pvs[m.node.as_str()];
        let node = cluster.nodes().get(&m.node).await.unwrap();
        assert_eq!(annotation(pv, ANN_NODE_NAME), Some(m.node.as_str()));
        assert_eq!(annotation(pv, ANN_NODE_UID), node.metadata.uid.as_deref());
        assert_eq!(label(pv, LABEL_PV_NODE), Some(m.node.as_str()));
        assert_eq!(label(pv, LABEL_PV_DRIVER), Some(DRIVER));
        assert_eq!(affinity_nodes(pv), vec![m.node.clone()]);

        // The volume lives on that node's driver, and no other driver was asked to create it.
        let state = m.driver.wait_volumes(1).await;
        let volume = &state.volumes[0];
        assert_eq!(volume.name, name_of(pv));
        let handle = pv
            .spec
            .as_ref()
            .unwrap()
            .csi
            .as_ref()
            .unwrap()
            .volume_handle
            .clone();
        assert_eq!(volume.id, handle);
        assert_eq!(volume.node, m.node);
        assert!(state.calls("CreateVolume") >= 1);
    }
    for m in &members {
        let state = m.driver.state().await;
        assert_eq!(
            state.volumes.len(),
            1,
            "driver {} holds only its own volume",
            m.node
        );
    }
    // Each instance records its intents in its own node's ledger: no claim is read or written.
    let ours = cluster
        .sim()
        .counters()
        .agent(|agent| agent.starts_with("csi-provisioner/"));
    for verb in ["get", "patch", "update"] {
        assert_eq!(
            ours.count(Some(verb), Some("persistentvolumeclaims"), None),
            0,
            "claim {verb}s by the instances"
        );
    }
    assert!(ours.count(Some("create"), Some("leases"), None) >= 1);
}

#[tokio::test]
async fn immediate_binding_every_claim_is_provisioned_exactly_once_by_one_instance() {
    let cluster = Cluster::start().await;
    let members = fleet(&cluster, &[]).await;
    nine_claims_each_provisioned_once_by_one_instance(&cluster, &members).await;
}

#[tokio::test]
async fn immediate_binding_with_upstreams_cluster_role_still_has_one_winner_per_claim() {
    let cluster = Cluster::start().await;
    // Upstream's ClusterRole: update but no patch on PVCs. The competition's compare-and-set
    // becomes a PUT carrying the resourceVersion read, which still lets exactly one instance win.
    cluster.sim().faults().add(
        FaultRule::error(403)
            .verb("patch")
            .resource("persistentvolumeclaims"),
    );
    let members = fleet(&cluster, &[]).await;
    nine_claims_each_provisioned_once_by_one_instance(&cluster, &members).await;
    let updates = cluster
        .sim()
        .counters()
        .get("update", "persistentvolumeclaims", 200);
    // The selected node; the intent is in each node's ledger, not on the claim.
    assert!(
        updates >= 9,
        "selected node written with update for each claim: {updates}"
    );
    assert!(
        cluster
            .sim()
            .counters()
            .count(Some("create"), Some("leases"), None)
            >= 1,
        "intents recorded in the nodes' ledgers"
    );
}

/// Nine Immediate claims, three instances: each claim is provisioned once, on the driver of the
/// node its winning instance wrote into `selected-node`.
async fn nine_claims_each_provisioned_once_by_one_instance(cluster: &Cluster, members: &[Member]) {
    cluster.add_class(&storage_class("fast", &[])).await;
    let claims: Vec<String> = (0..9).map(|i| format!("data-{i}")).collect();
    for name in &claims {
        cluster.claim_of_class(NS, name, "fast", "1Gi").await;
    }

    let mut by_node: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for name in &claims {
        let pv = cluster.wait_bound(NS, name).await;
        let pvc = cluster.pvcs(NS).get(name).await.unwrap();
        let selected = pvc
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get("volume.kubernetes.io/selected-node"))
            .cloned()
            .expect("the winning instance wrote its node into selected-node");
        assert_eq!(annotation(&pv, ANN_NODE_NAME), Some(selected.as_str()));
        assert_eq!(affinity_nodes(&pv), vec![selected.clone()]);
        by_node.entry(selected).or_default().insert(name_of(&pv));
    }
    // Every volume exists once, on the driver of its claim's selected node, and nowhere else.
    let mut total = 0;
    for m in members {
        let state = m.driver.state().await;
        let held: BTreeSet<String> = state.volumes.iter().map(|v| v.name.clone()).collect();
        assert_eq!(
            held,
            by_node.get(&m.node).cloned().unwrap_or_default(),
            "volumes on {}",
            m.node
        );
        total += state.volumes.len();
    }
    assert_eq!(total, claims.len(), "each claim provisioned exactly once");
}

#[tokio::test]
async fn immediate_binding_a_full_node_leaves_the_claim_to_a_node_with_room() {
    let cluster = Cluster::start().await;
    // Upstream's becomeOwner capacity check: node-a and node-b have 1Mi left, node-c 1Ti.
    let mut members = Vec::new();
    for (node, capacity) in [("node-a", "1Mi"), ("node-b", "1Mi"), ("node-c", "1Ti")] {
        let flag = format!("--capacity-total={capacity}");
        members.push(join_with_driver(&cluster, node, &[&flag], &[]).await);
    }
    cluster.add_class(&storage_class("fast", &[])).await;
    let claims: Vec<String> = (0..3).map(|i| format!("data-{i}")).collect();
    for name in &claims {
        cluster.claim_of_class(NS, name, "fast", "1Gi").await;
    }
    for name in &claims {
        let pv = cluster.wait_bound(NS, name).await;
        assert_eq!(
            annotation(&pv, ANN_NODE_NAME),
            Some("node-c"),
            "{name} provisioned on the node with room"
        );
    }
    for m in &members[..2] {
        let state = m.driver.state().await;
        assert!(
            state.volumes.is_empty(),
            "nothing placed on full {}",
            m.node
        );
        assert_eq!(state.calls("CreateVolume"), 0, "{} never tried", m.node);
    }
    // The cost: the winner asks its driver once per claim before its write (again only after a
    // lost resourceVersion race with another writer of the claim, as upstream).
    let asked = members[2].driver.state().await.calls("GetCapacity");
    assert!(
        (3..=6).contains(&asked),
        "GetCapacity calls on node-c: {asked}"
    );
}

#[tokio::test]
async fn deletion_only_the_owning_instance_calls_delete_volume() {
    let cluster = Cluster::start().await;
    let members = local_fleet(&cluster, &[]).await;
    let pv = claim_on(&cluster, "data", "local", "node-a").await;
    members[0].driver.wait_volumes(1).await;

    delete_pod(&cluster, "data").await;
    cluster.delete_pvc_and_wait(NS, "data").await;
    cluster.wait_pv_gone(&name_of(&pv)).await;
    let owner = members[0].driver.wait_volumes(0).await;
    assert_eq!(
        owner.calls("DeleteVolume"),
        1,
        "the owner deletes its volume once"
    );
    for m in &members[1..] {
        let state = m.driver.state().await;
        assert_eq!(
            state.calls("DeleteVolume"),
            0,
            "driver {} was never asked",
            m.node
        );
    }
}

#[tokio::test]
async fn node_deleted_then_its_claim_deleted_the_pv_is_answered_once_after_the_grace_period() {
    let cluster = Cluster::start().await;
    let mut members = local_fleet(&cluster, &["--deleted-node-grace-period=4s"]).await;
    let pv_name = volume_on_a_lost_node(&cluster, &mut members).await;
    cluster.delete_pvc_and_wait(NS, "data").await;

    cluster.wait_pv_gone(&pv_name).await;
    let message = cluster
        .wait_pv_event(&pv_name, GONE, "node \"node-a\"")
        .await;
    assert!(message.contains("no longer exists"), "{message}");
    assert!(message.contains("grace period of 4s"), "{message}");
    assert!(
        message.contains("without calling DeleteVolume"),
        "{message}"
    );
    let survivors = survivors(&members);
    wait_metric_sum(&survivors, ANSWERED, 1.0).await;
    assert_eq!(
        cluster
            .event_count("PersistentVolume", "", &pv_name, GONE)
            .await,
        1,
        "exactly one instance acted"
    );
    for m in &survivors {
        let state = m.driver.state().await;
        assert_eq!(
            state.calls("DeleteVolume"),
            0,
            "no DeleteVolume reached {}",
            m.node
        );
    }
}

#[tokio::test]
async fn when_the_first_ranked_instance_does_not_act_the_next_one_answers_after_its_fallback_delay()
{
    let cluster = Cluster::start().await;
    let mut members = local_fleet(&cluster, &["--deleted-node-grace-period=4s"]).await;
    let pv_name = volume_on_a_lost_node(&cluster, &mut members).await;
    // The instances agree, without talking, on who answers first: rendezvous order of the
    // driver's clean-up key over the live instances (node-a is gone).
    // The clean-up's rendezvous key: fixed forever, instances of different versions must agree.
    let key = format!("{DRIVER}/deleted-node-cleanup");
    let order = csi_provisioner::rendezvous::rendezvous_order(&key, ["node-b", "node-c"]);
    let index = |node: &str| members.iter().position(|m| m.node == node).expect("member");
    let (first, second) = (index(order[0]), index(order[1]));
    // The first-ranked instance is stuck: its sidecar is gone, but its Node and CSINode stay,
    // so the others still count it as live and ranked first.
    members[first].sidecar.kill().await;

    cluster.delete_pvc_and_wait(NS, "data").await;
    cluster.wait_pv_gone(&pv_name).await;
    cluster
        .wait_pv_event(&pv_name, GONE, "node \"node-a\"")
        .await;
    assert_eq!(
        cluster
            .event_count("PersistentVolume", "", &pv_name, GONE)
            .await,
        1,
        "exactly one instance acted"
    );
    let fallback = &members[second];
    let pv_field = format!("pv={pv_name}");
    assert_eq!(
        fallback
            .sidecar
            .log_lines_with(&["the volume's node is missing", &pv_field, "rank=1"]),
        1,
        "the second-ranked instance tracked the volume as the first fallback"
    );
    wait_metric_sum(&[fallback], ANSWERED, 1.0).await;
    assert_eq!(
        fallback.driver.state().await.calls("DeleteVolume"),
        0,
        "the backend went with its node: no DeleteVolume"
    );
}

/// Claim `data` (class `local`) selected to node-a, whose driver creates the volume but never
/// answers in time, so node-a's intent ledger keeps the claim's entry; then node-a goes away for
/// good.
async fn in_flight_on_a_lost_node(cluster: &Cluster, members: &mut [Member]) {
    in_flight(cluster, &members[0], "data", 1).await;
    cluster.wait_intent(NS, "data", true).await;
    let claim = cluster.pvcs(NS).get("data").await.unwrap();
    assert!(
        !claim
            .metadata
            .finalizers
            .unwrap_or_default()
            .iter()
            .any(|f| f == "csi-provisioner.rs/provisioning-intent"),
        "node mode records the intent in the node's ledger, not on the claim"
    );
    delete_pod(cluster, "data").await;
    lose_node(cluster, &mut members[0]).await;
}

/// Claim `claim` (class `local`) selected to `member`'s node, whose driver creates the volume
/// but answers DeadlineExceeded, so the intent stays recorded; waits for the driver to hold
/// `volumes` and returns its control client (to clear the fault).
async fn in_flight(
    cluster: &Cluster,
    member: &Member,
    claim: &str,
    volumes: usize,
) -> mock_csi_driver::control::ControlClient {
    let control = member.driver.creates_then_times_out().await;
    cluster.claim_of_class(NS, claim, "local", "1Gi").await;
    let pod = format!("pod-{claim}");
    cluster.schedule(NS, &pod, claim, &member.node).await;
    member.driver.wait_volumes(volumes).await;
    control
}

#[tokio::test]
async fn a_claim_deleted_mid_provisioning_on_a_node_that_then_vanished_goes_at_once_and_its_ledger_after_the_grace_period()
 {
    let cluster = Cluster::start().await;
    let mut members = local_fleet(&cluster, &["--deleted-node-grace-period=4s"]).await;
    in_flight_on_a_lost_node(&cluster, &mut members).await;

    // Nothing holds the claim (the intent is in node-a's ledger, not on it): it goes at once.
    cluster.delete_pvc_and_wait(NS, "data").await;
    // Nobody can clean up on node-a: after the grace period its ledger goes, volume unasked.
    cluster.wait_intent(NS, "data", false).await;
    assert!(
        cluster.ledger_entries().await.is_empty(),
        "node-a's ledger removed, the others hold nothing"
    );
    for m in survivors(&members) {
        assert_eq!(m.driver.state().await.calls("DeleteVolume"), 0);
    }
}

#[tokio::test]
async fn a_pending_claim_whose_node_vanished_mid_provisioning_is_rescheduled_after_the_grace_period()
 {
    let cluster = Cluster::start().await;
    let mut members = local_fleet(&cluster, &["--deleted-node-grace-period=4s"]).await;
    in_flight_on_a_lost_node(&cluster, &mut members).await;

    // The selected node is cleared once node-a is confirmed gone, and only then.
    wait_selected_node_removed(&cluster, "data").await;
    let message = cluster
        .wait_claim_event(NS, "data", GONE, "node \"node-a\"")
        .await;
    assert!(
        message.contains("scheduler picks another node"),
        "{message}"
    );
    // The pod comes back on node-b: the volume is created there under the recorded name.
    cluster.schedule(NS, "pod-data-2", "data", "node-b").await;
    let pv = cluster.wait_bound(NS, "data").await;
    assert_eq!(affinity_nodes(&pv), vec!["node-b".to_string()]);
    let on_b = members[1].driver.wait_volumes(1).await;
    assert_eq!(on_b.volumes[0].name, name_of(&pv));
}

/// A PV as upstream (or an older version) wrote it: no annotations or labels of ours, pinned to
/// `node` by the driver's topology key, released (its claim is gone).
fn legacy_released_pv(name: &str, node: &str) -> PersistentVolume {
    let affinity = serde_json::json!({"required": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": TOPOLOGY_KEY, "operator": "In", "values": [node]}]}
    ]}});
    PersistentVolume {
        metadata: ObjectMeta {
            name: Some(name.into()),
            annotations: Some(BTreeMap::from([(
                "pv.kubernetes.io/provisioned-by".to_string(),
                DRIVER.to_string(),
            )])),
            finalizers: Some(vec![FINALIZER.into()]),
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
                volume_handle: format!("{name}-handle"),
                ..Default::default()
            }),
            claim_ref: Some(ObjectReference {
                namespace: Some(NS.into()),
                name: Some(format!("{name}-claim")),
                uid: Some("0a0a0a0a-0000-4000-8000-000000000000".into()),
                ..Default::default()
            }),
            node_affinity: Some(serde_json::from_value(affinity).unwrap()),
            persistent_volume_reclaim_policy: Some("Delete".into()),
            storage_class_name: Some("local".into()),
            ..Default::default()
        }),
        ..Default::default()
    }
}

#[tokio::test]
async fn a_node_back_with_its_recorded_uid_within_the_grace_period_cancels_the_clean_up() {
    let cluster = Cluster::start().await;
    let mut members = local_fleet(&cluster, &["--deleted-node-grace-period=20s"]).await;
    let pv = claim_on(&cluster, "data", "local", "node-a").await;
    let pv_name = name_of(&pv);
    members[0].driver.wait_volumes(1).await;
    let node_a = cluster.nodes().get("node-a").await.expect("node-a");
    assert_eq!(
        annotation(&pv, ANN_NODE_UID),
        node_a.metadata.uid.as_deref(),
        "the PV records the Node's UID"
    );

    delete_pod(&cluster, "data").await;
    lose_node(&cluster, &mut members[0]).await;
    cluster.delete_pvc_and_wait(NS, "data").await;
    let survivors = survivors(&members);
    // The clean-up has seen the missing node and started its grace period.
    wait_metric_sum(&survivors, WAITING, 1.0).await;

    // The very same Node object comes back (same UID, e.g. an API server restored from backup).
    let mut restored = serde_json::to_value(&node_a).expect("node json");
    let meta = restored["metadata"].as_object_mut().expect("metadata");
    meta.remove("resourceVersion");
    meta.remove("creationTimestamp");
    cluster
        .sim()
        .restore("", "nodes", "", restored)
        .expect("restore node-a");

    // The wait is cancelled, and nothing is removed.
    wait_metric_sum(&survivors, WAITING, 0.0).await;
    wait_for("the clean-up to be cancelled", DEADLINE, || async {
        survivors
            .iter()
            .any(|m| {
                m.sidecar
                    .log()
                    .contains("the volume's node is back; nothing is removed")
            })
            .then_some(())
    })
    .await;
    let kept = pv_exists(&cluster, &pv_name).await.expect("the PV is kept");
    assert!(kept.metadata.deletion_timestamp.is_none());
    assert!(
        kept.metadata
            .finalizers
            .unwrap_or_default()
            .contains(&FINALIZER.to_string())
    );
    assert_eq!(
        cluster
            .event_count("PersistentVolume", "", &pv_name, GONE)
            .await,
        0
    );
    // The node's driver, back too, still holds the volume (its state file survived).
    members[0].driver.restart().await;
    assert_eq!(
        members[0].driver.state().await.volumes.len(),
        1,
        "the volume is kept"
    );
}

#[tokio::test]
async fn a_node_recreated_within_the_grace_period_keeps_volumes_known_by_name_but_not_by_uid() {
    let cluster = Cluster::start().await;
    // node-d runs no instance of our driver; an upstream-written PV is pinned to it.
    cluster.add_node_without_driver("node-d").await;
    let legacy = "legacy-on-d";
    cluster
        .create(&cluster.pvs(), &legacy_released_pv(legacy, "node-d"))
        .await;
    let mut members = local_fleet(&cluster, &["--deleted-node-grace-period=20s"]).await;
    let pv = claim_on(&cluster, "data", "local", "node-a").await;
    let pv_name = name_of(&pv);
    members[0].driver.wait_volumes(1).await;
    // The start-up sweep labelled the legacy PV, so the clean-up can list it by node.
    wait_for(
        "the legacy PV to be labelled with its node",
        DEADLINE,
        || async {
            let pv = pv_exists(&cluster, legacy).await?;
            (label(&pv, LABEL_PV_NODE) == Some("node-d")).then_some(())
        },
    )
    .await;

    delete_pod(&cluster, "data").await;
    lose_node(&cluster, &mut members[0]).await;
    cluster.delete_node("node-d").await;
    cluster.delete_pvc_and_wait(NS, "data").await;
    let survivors = survivors(&members);
    // Both volumes wait for their missing node: the clean-up has seen them.
    wait_metric_sum(&survivors, WAITING, 2.0).await;

    // Both nodes come back under their names (new Node objects, hence new UIDs), well within 20s.
    cluster.add_node_without_driver("node-a").await;
    cluster.add_node_without_driver("node-d").await;

    // The PV recording node-a's UID belongs to a machine that is gone: answered after the period.
    cluster.wait_pv_gone(&pv_name).await;
    let message = cluster
        .wait_pv_event(&pv_name, GONE, "replaced by a new node of the same name")
        .await;
    assert!(message.contains("node \"node-a\""), "{message}");
    // The legacy PV knows its node only by name: the node is back, so it is kept. It was first
    // seen absent before the other PV, so its grace period ended before the other one's.
    let kept = pv_exists(&cluster, legacy)
        .await
        .expect("the legacy PV is kept");
    assert!(kept.metadata.deletion_timestamp.is_none());
    assert!(
        kept.metadata
            .finalizers
            .unwrap_or_default()
            .contains(&FINALIZER.to_string())
    );
    assert_eq!(
        cluster
            .event_count("PersistentVolume", "", legacy, GONE)
            .await,
        0
    );
    wait_metric_sum(&survivors, WAITING, 0.0).await;
    assert!(
        survivors.iter().any(|m| m
            .sidecar
            .log()
            .contains("the volume's node is back; nothing is removed")),
        "the cancellation is logged"
    );
}

#[tokio::test]
async fn node_lookups_failing_with_500_or_503_never_count_as_absence() {
    let cluster = Cluster::start().await;
    let mut members = local_fleet(&cluster, &["--deleted-node-grace-period=4s"]).await;
    let pv_name = volume_on_a_lost_node(&cluster, &mut members).await;

    let faults = cluster.sim().faults();
    // Only GETs of the missing node fail (the instances' own start-up reads are not disturbed).
    let node_get = || {
        FaultRule::default()
            .verb("get")
            .resource("nodes")
            .name("node-a")
    };
    let server_error = faults.add(FaultRule {
        status: Some(500),
        ..node_get()
    });
    cluster.delete_pvc_and_wait(NS, "data").await;
    // The grace period ended and the live check was refused: the volume stays. The witness that
    // the sidecar has read the refusal and acted on it is its next attempt: a second faulted GET
    // (counted when the request arrives, so the first alone proves nothing about the answer).
    wait_for(
        "a live Node GET answered 500, then retried",
        DEADLINE,
        || async { (faults.hits(server_error) >= 2).then_some(()) },
    )
    .await;
    assert!(
        pv_exists(&cluster, &pv_name).await.is_some(),
        "nothing removed on a 500"
    );

    faults.remove(server_error);
    let unavailable = faults.add(FaultRule {
        status: Some(503),
        ..node_get()
    });
    let before = faults.hits(unavailable);
    // As above: the second faulted GET shows the sidecar came back to retry after the first 503.
    wait_for(
        "a live Node GET answered 503, then retried",
        DEADLINE,
        || async { (faults.hits(unavailable) >= before + 2).then_some(()) },
    )
    .await;
    let still = pv_exists(&cluster, &pv_name)
        .await
        .expect("nothing removed on a 503");
    assert!(
        still
            .metadata
            .finalizers
            .unwrap_or_default()
            .contains(&FINALIZER.to_string())
    );
    assert_eq!(
        cluster
            .event_count("PersistentVolume", "", &pv_name, GONE)
            .await,
        0
    );
    let survivors = survivors(&members);
    assert!(
        survivors.iter().any(|m| m
            .sidecar
            .log()
            .contains("could not confirm that the volume's node is gone")),
        "the refused check is logged"
    );

    // Once the API server answers again, the absence is confirmed and the volume answered.
    faults.remove(unavailable);
    cluster.wait_pv_gone(&pv_name).await;
    cluster
        .wait_pv_event(&pv_name, GONE, "node \"node-a\"")
        .await;
}

#[tokio::test]
async fn with_pvc_cleanup_a_claim_bound_to_a_volume_of_a_deleted_node_is_deleted() {
    let cluster = Cluster::start().await;
    let mut members = local_fleet(
        &cluster,
        &[
            "--deleted-node-grace-period=4s",
            "--deleted-node-pvc-cleanup",
        ],
    )
    .await;
    let pv_name = volume_on_a_lost_node(&cluster, &mut members).await;

    // The claim is deleted for the user, then its volume is answered as deleted.
    wait_for("the bound claim to be deleted", DEADLINE, || async {
        matches!(cluster.pvcs(NS).get_opt("data").await, Ok(None)).then_some(())
    })
    .await;
    cluster.wait_pv_gone(&pv_name).await;
    cluster
        .wait_pv_event(&pv_name, GONE, "Deleted claim default/data")
        .await;
    let survivors = survivors(&members);
    wait_metric_sum(&survivors, CLAIMS_DELETED, 1.0).await;
    wait_metric_sum(&survivors, ANSWERED, 1.0).await;
}

#[tokio::test]
async fn without_pvc_cleanup_a_claim_bound_to_a_volume_of_a_deleted_node_is_kept() {
    let cluster = Cluster::start().await;
    let mut members = local_fleet(&cluster, &["--deleted-node-grace-period=4s"]).await;
    let kept_pv = claim_on(&cluster, "data", "local", "node-a").await;
    let scratch_pv = claim_on(&cluster, "scratch", "local", "node-a").await;
    members[0].driver.wait_volumes(2).await;
    delete_pod(&cluster, "data").await;
    delete_pod(&cluster, "scratch").await;
    lose_node(&cluster, &mut members[0]).await;
    cluster.delete_pvc_and_wait(NS, "scratch").await;

    // The released volume of the same node is answered: the clean-up ran past the grace period.
    cluster.wait_pv_gone(&name_of(&scratch_pv)).await;
    let survivors = survivors(&members);
    wait_metric_sum(&survivors, ANSWERED, 1.0).await;
    // The bound claim and its volume are left alone.
    let pvc = cluster
        .pvcs(NS)
        .get("data")
        .await
        .expect("the claim is kept");
    assert!(pvc.metadata.deletion_timestamp.is_none());
    assert_eq!(pvc.status.unwrap().phase.as_deref(), Some("Bound"));
    assert!(pv_exists(&cluster, &name_of(&kept_pv)).await.is_some());
    assert_eq!(metric_sum(&survivors, CLAIMS_DELETED).await, 0.0);
}

#[tokio::test]
async fn controller_mode_answers_volumes_of_a_deleted_node_with_a_per_node_topology_driver() {
    let cluster = Cluster::start().await;
    cluster.add_node("node-a").await;
    cluster.add_node("node-b").await;
    // One controller plugin placing volumes on both nodes.
    let driver = Driver::start(
        cluster.dir.path(),
        "node-a",
        &["--topology", "--topology-node=node-b"],
    )
    .await;
    let sidecar = Sidecar::start(
        &cluster,
        &driver,
        &[
            "--feature-gates=Topology=true",
            "--deleted-node-grace-period=4s",
            "--http-endpoint=127.0.0.1:0",
        ],
    )
    .await;
    cluster.add_class(&delayed_class("local")).await;
    let pv = claim_on(&cluster, "data", "local", "node-b").await;
    let pv_name = name_of(&pv);
    assert_eq!(annotation(&pv, ANN_NODE_NAME), Some("node-b"));
    assert_eq!(affinity_nodes(&pv), vec!["node-b".to_string()]);

    // node-b is gone, and with it the controller's way to its disk: DeleteVolume keeps failing.
    driver
        .control()
        .await
        .set_fault(
            "DeleteVolume",
            mock_csi_driver::FaultRule::always(tonic::Code::FailedPrecondition),
        )
        .await
        .unwrap();
    delete_pod(&cluster, "data").await;
    cluster.delete_node("node-b").await;
    cluster.delete_pvc_and_wait(NS, "data").await;

    cluster.wait_pv_gone(&pv_name).await;
    cluster
        .wait_pv_event(&pv_name, GONE, "node \"node-b\"")
        .await;
    wait_for("the answered-volume counter", DEADLINE, || async {
        (sidecar.metric(ANSWERED).await == Some(1.0)).then_some(())
    })
    .await;
}

/// Issue 28: a claim selected for node-b lands on node-a because node-b is full (the requisite
/// allows it). When node-b is deleted and the claim released, the volume lives on node-a, a node
/// that exists: it must be deleted through the driver, never answered as gone with node-b.
#[tokio::test]
async fn a_volume_placed_off_its_selected_node_is_deleted_through_the_driver_when_that_node_goes() {
    let cluster = Cluster::start().await;
    cluster.add_node("node-a").await;
    cluster.add_node("node-b").await;
    let driver = Driver::start(
        cluster.dir.path(),
        "node-a",
        &[
            "--topology",
            "--topology-node=node-b",
            "--capacity-total=10Gi",
        ],
    )
    .await;
    let filler = driver
        .create_volume_on("filler", Some("node-b"), Some(10 << 30))
        .await;
    let sidecar = Sidecar::start(
        &cluster,
        &driver,
        &[
            "--feature-gates=Topology=true",
            "--deleted-node-grace-period=2s",
            "--http-endpoint=127.0.0.1:0",
        ],
    )
    .await;
    cluster.add_class(&delayed_class("local")).await;
    let pv = claim_on(&cluster, "data", "local", "node-b").await;
    let pv_name = name_of(&pv);
    assert_eq!(affinity_nodes(&pv), vec!["node-a".to_string()]);
    assert_eq!(
        annotation(&pv, ANN_NODE_NAME),
        None,
        "node-b is not where it lives"
    );
    let handle = pv
        .spec
        .as_ref()
        .and_then(|s| s.csi.as_ref())
        .unwrap()
        .volume_handle
        .clone();

    delete_pod(&cluster, "data").await;
    cluster.delete_node("node-b").await;
    cluster.delete_pvc_and_wait(NS, "data").await;
    cluster.wait_pv_gone(&pv_name).await;

    let state = driver.state().await;
    assert!(
        state.volume(&handle).is_none(),
        "the volume on node-a was deleted"
    );
    assert!(
        state.delete_calls.iter().any(|(id, _)| *id == handle),
        "through DeleteVolume"
    );
    assert!(state.volume(&filler).is_some());
    assert!(
        cluster
            .events_for("PersistentVolume", "", &pv_name)
            .await
            .iter()
            .all(|(r, _)| r != GONE)
    );
    assert_eq!(sidecar.metric(ANSWERED).await.unwrap_or(0.0), 0.0);
}

#[tokio::test]
async fn a_selected_node_without_our_driver_is_cleared_so_the_scheduler_picks_again() {
    let cluster = Cluster::start().await;
    cluster.add_node("node-a").await;
    cluster.add_node_without_driver("node-x").await;
    let driver = Driver::start(cluster.dir.path(), "node-a", &["--topology"]).await;
    let _sidecar = Sidecar::start(&cluster, &driver, &["--feature-gates=Topology=true"]).await;
    cluster.add_class(&delayed_class("local")).await;
    claim_selected_to(&cluster, "data", "local", "node-x").await;

    // Upstream's event for a selected node without a CSINode (it reschedules this case too).
    cluster
        .wait_claim_event(
            NS,
            "data",
            "ProvisioningFailed",
            "failed to get selected CSINode node-x: csinode.storage.k8s.io \"node-x\" not found",
        )
        .await;
    wait_selected_node_removed(&cluster, "data").await;
    // The scheduler picks a node with our driver; the claim is provisioned there.
    cluster.schedule(NS, "pod-data", "data", "node-a").await;
    let pv = cluster.wait_bound(NS, "data").await;
    assert_eq!(affinity_nodes(&pv), vec!["node-a".to_string()]);
}

#[tokio::test]
async fn node_mode_one_instance_clears_a_selected_node_without_our_driver() {
    let cluster = Cluster::start().await;
    cluster.add_node_without_driver("node-x").await;
    let _members = local_fleet(&cluster, &[]).await;
    claim_selected_to(&cluster, "data", "local", "node-x").await;

    cluster
        .wait_claim_event(NS, "data", "ProvisioningFailed", "selected CSINode node-x")
        .await;
    wait_selected_node_removed(&cluster, "data").await;
    // Each instance records events under its own source: one event object means one instance.
    let cleared = cluster
        .events_for("PersistentVolumeClaim", NS, "data")
        .await
        .into_iter()
        .filter(|(_, message)| message.starts_with("failed to get selected CSINode node-x"))
        .count();
    assert_eq!(cleared, 1, "one instance cleared the claim");
    cluster.schedule(NS, "pod-data", "data", "node-b").await;
    let pv = cluster.wait_bound(NS, "data").await;
    assert_eq!(affinity_nodes(&pv), vec!["node-b".to_string()]);
}

#[tokio::test]
async fn after_an_upgrade_pvs_written_without_our_labels_are_deleted_by_their_nodes_instance() {
    let cluster = Cluster::start().await;
    // Written by upstream before the upgrade: no labels of ours, pinned to node-a, released.
    let legacy = "legacy-on-a";
    cluster
        .create(&cluster.pvs(), &legacy_released_pv(legacy, "node-a"))
        .await;
    let members = fleet(&cluster, &[]).await;

    // node-a's instance labels it, sees it in its scoped watch and deletes it as upstream would.
    cluster.wait_pv_gone(legacy).await;
    let owner = members[0].driver.state().await;
    assert_eq!(owner.calls("DeleteVolume"), 1);
    for m in &members[1..] {
        let state = m.driver.state().await;
        assert_eq!(
            state.calls("DeleteVolume"),
            0,
            "driver {} was never asked",
            m.node
        );
    }
}

/// A PV an admin (or any tool) writes for a claim while the fleet runs: ours by its
/// `provisioned-by` annotation and driver, pre-bound to claim `claim`, reclaim Delete, pinned to
/// `node` (none: no node affinity). No labels, no finalizer.
fn admins_static_pv(name: &str, claim: &str, node: Option<&str>) -> PersistentVolume {
    let mut pv = legacy_released_pv(name, node.unwrap_or("unused"));
    pv.metadata.finalizers = None;
    let spec = pv.spec.as_mut().unwrap();
    if node.is_none() {
        spec.node_affinity = None;
    }
    spec.claim_ref = Some(ObjectReference {
        namespace: Some(NS.into()),
        name: Some(claim.into()),
        ..Default::default()
    });
    pv
}

/// Issue 41 item 3: PVs of our driver written by someone else after start-up (an admin's static
/// PV pinned to node-b, and one with no node affinity) are labelled at once, so the instance that
/// may delete them protects them with the finalizer and deletes them through its driver on
/// release, as upstream does, long before the 30-minute sweep.
#[tokio::test]
async fn static_pvs_written_while_the_fleet_runs_are_protected_and_deleted_on_release() {
    let cluster = Cluster::start().await;
    let members = local_fleet(&cluster, &[]).await;
    for (pv, claim_name, node) in [
        ("static-on-b", "claim-b", Some("node-b")),
        ("static-anywhere", "claim-any", None),
    ] {
        cluster
            .create(&cluster.pvs(), &admins_static_pv(pv, claim_name, node))
            .await;
        let mut pvc = claim(NS, claim_name, "local", "1Gi");
        pvc.spec.as_mut().unwrap().volume_name = Some(pv.into());
        cluster.create(&cluster.pvcs(NS), &pvc).await;
    }
    for (pv, claim_name) in [("static-on-b", "claim-b"), ("static-anywhere", "claim-any")] {
        cluster.wait_bound(NS, claim_name).await;
        wait_for(
            &format!("the deletion-protection finalizer on {pv}"),
            DEADLINE,
            || async {
                let found = pv_exists(&cluster, pv).await?;
                found
                    .metadata
                    .finalizers
                    .iter()
                    .flatten()
                    .any(|f| f == FINALIZER)
                    .then_some(())
            },
        )
        .await;
        let labelled = pv_exists(&cluster, pv).await.unwrap().metadata.labels;
        assert_eq!(
            labelled.as_ref().and_then(|l| l.get(LABEL_PV_DRIVER)),
            Some(&DRIVER.to_string())
        );
    }

    cluster.delete_pvc_and_wait(NS, "claim-b").await;
    cluster.wait_pv_gone("static-on-b").await;
    let on_b = members[1].driver.state().await.calls("DeleteVolume");
    assert_eq!(on_b, 1, "node-b's driver");
    for m in [&members[0], &members[2]] {
        let calls = m.driver.state().await.calls("DeleteVolume");
        assert_eq!(calls, 0, "driver {}", m.node);
    }

    // Of no single node: every instance may ask its driver (upstream §6.4); one does.
    cluster.delete_pvc_and_wait(NS, "claim-any").await;
    cluster.wait_pv_gone("static-anywhere").await;
    let mut total = 0;
    for m in &members {
        total += m.driver.state().await.calls("DeleteVolume");
    }
    assert!(total >= 2, "DeleteVolume calls in all: {total}");
}

/// The claim moves to node-b while node-a's CreateVolume is in flight and node-a's sidecar is
/// down (as when the selected node is cleared during a restart of node-a's driver pod). Node-b
/// provisions it under the same volume name; node-a, back, finds the PV of its entry's name is
/// node-b's, so its own copy is referenced by nothing: it deletes it instead of keeping it.
#[tokio::test]
async fn a_node_back_after_its_claim_moved_deletes_its_own_copy_of_the_volume() {
    let cluster = Cluster::start().await;
    let mut members = local_fleet(&cluster, &[]).await;
    let control = in_flight(&cluster, &members[0], "data", 1).await;
    cluster.wait_intent(NS, "data", true).await;
    members[0].sidecar.kill().await;
    control.clear_faults().await.unwrap();

    delete_pod(&cluster, "data").await;
    let patch = serde_json::json!({"metadata": {"annotations": {
        "volume.kubernetes.io/selected-node": null}}});
    cluster
        .pvcs(NS)
        .patch(
            "data",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&patch),
        )
        .await
        .unwrap();
    cluster.schedule(NS, "pod-data-2", "data", "node-b").await;
    let pv = cluster.wait_bound(NS, "data").await;
    assert_eq!(affinity_nodes(&pv), vec!["node-b".to_string()]);

    members[0].sidecar.restart().await;
    members[0].driver.wait_volumes(0).await;
    let on_b = members[1].driver.wait_volumes(1).await;
    assert_eq!(on_b.volumes[0].name, name_of(&pv));
    cluster.wait_intent(NS, "data", false).await;
    assert!(pv_exists(&cluster, &name_of(&pv)).await.is_some());
}

/// node-a's sidecar, killed with a volume in flight for claim `data` whose only record is an
/// earlier version's intent journal (node-a's ledger as a file, the Lease deleted); with the
/// driver's control (CreateVolume still failing) and the journal's directory.
async fn left_in_a_retired_journal(
    cluster: &Cluster,
) -> (
    Member,
    mock_csi_driver::control::ControlClient,
    std::path::PathBuf,
) {
    let mut a = join(cluster, "node-a", &[]).await;
    cluster.add_class(&delayed_class("local")).await;
    let control = in_flight(cluster, &a, "data", 1).await;
    cluster.wait_intent(NS, "data", true).await;
    a.sidecar.kill().await;

    // An earlier version's journal: the node's ledger as a file, and no Lease.
    let api: kube::Api<k8s_openapi::api::coordination::v1::Lease> =
        kube::Api::namespaced(cluster.client.clone(), "default");
    let leases = api
        .list(&kube::api::ListParams::default().labels("csi-provisioner.rs/intent-ledger"))
        .await
        .unwrap();
    assert_eq!(leases.items.len(), 1, "one shard of node-a's ledger");
    let lease = &leases.items[0];
    let entries =
        lease.metadata.annotations.as_ref().unwrap()["csi-provisioner.rs/intents"].clone();
    let journal = cluster.dir.path().join("journal-node-a");
    std::fs::create_dir_all(&journal).unwrap();
    std::fs::write(journal.join("intents-0.json"), &entries).unwrap();
    api.delete(
        lease.metadata.name.as_deref().unwrap(),
        &kube::api::DeleteParams::default(),
    )
    .await
    .unwrap();
    assert!(cluster.ledger_entries().await.is_empty());

    (a, control, journal)
}

/// node-a's sidecar started again, pointed at the retired journal in `journal`.
async fn back_with_journal(cluster: &Cluster, a: &Member, journal: &std::path::Path) -> Sidecar {
    let flag = format!("--node-deployment-intent-journal={}", journal.display());
    let flags = [
        "--node-deployment",
        "--feature-gates=Topology=true",
        "--http-endpoint=127.0.0.1:0",
        flag.as_str(),
    ];
    let back = Sidecar::start_env(cluster, &a.driver, &flags, &[("NODE_NAME", "node-a")]).await;
    back.wait_started().await;
    back
}

/// `--node-deployment-intent-journal` is retired and ignored (issue 40): what an earlier version
/// left in the journal, here a volume in flight whose claim was deleted while the sidecar was
/// down, is not resolved by this version. The volume is kept, never deleted on a guess, and the
/// warning names it for the operator to check; the sidecar otherwise starts and provisions as
/// usual. (Before, the journal's entries were taken into the node's Lease ledger and resolved.)
#[tokio::test]
async fn a_retired_intent_journal_is_reported_and_its_volume_kept() {
    let cluster = Cluster::start().await;
    let (a, control, journal) = left_in_a_retired_journal(&cluster).await;
    control.clear_faults().await.unwrap();
    let volume = {
        let text = std::fs::read_to_string(journal.join("intents-0.json")).unwrap();
        let entries: Vec<serde_json::Value> = serde_json::from_str(&text).unwrap();
        entries[0]["volume"].as_str().unwrap().to_owned()
    };
    delete_pod(&cluster, "data").await;
    cluster.delete_pvc_and_wait(NS, "data").await;
    let back = back_with_journal(&cluster, &a, &journal).await;
    let warning = [
        "--node-deployment-intent-journal is retired and ignored",
        "csi-provisioner audit",
        volume.as_str(),
    ];
    back.wait_log(&warning, 1).await;

    // The sidecar works: a new claim on node-a is provisioned; the journal's volume is kept.
    claim_on(&cluster, "fresh", "local", "node-a").await;
    let state = a.driver.wait_volumes(2).await;
    assert_eq!(state.calls("DeleteVolume"), 0, "nothing deleted on a guess");
    assert!(state.volumes.iter().any(|v| v.name == volume));
    assert!(
        journal.join("intents-0.json").exists(),
        "the journal is left as it is"
    );
}
