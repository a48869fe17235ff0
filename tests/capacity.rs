//! End to end: storage capacity tracking (`--enable-capacity`) on kube-sim with the mock driver,
//! whose GetCapacity reports each node pool's free bytes and `--max-volume-size`.

mod common;

use std::collections::BTreeMap;

use common::*;
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::storage::v1::CSIStorageCapacity;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, OwnerReference};
use kube::api::{DeleteParams, ListParams, ObjectMeta, Patch, PatchParams};
use kube::{Api, Resource};

/// Namespace of the capacity objects (`NAMESPACE` of the sidecar).
const NS: &str = "csi";
const LABEL_DRIVER: &str = "csi.storage.k8s.io/drivername";
const LABEL_MANAGED_BY: &str = "csi.storage.k8s.io/managed-by";

fn capacities(cluster: &Cluster) -> Api<CSIStorageCapacity> {
    Api::namespaced(cluster.client.clone(), NS)
}

/// Our driver's capacity objects as (class, node) -> (capacity, maximumVolumeSize, name).
async fn published(
    cluster: &Cluster,
) -> BTreeMap<(String, String), (String, Option<String>, String)> {
    let list = capacities(cluster)
        .list(&ListParams::default())
        .await
        .expect("list CSIStorageCapacities");
    list.items
        .into_iter()
        .filter(|c| label(c, LABEL_DRIVER) == Some(DRIVER))
        .map(|c| {
            let node = c
                .node_topology
                .as_ref()
                .and_then(|t| t.match_labels.as_ref())
                .and_then(|l| l.get(TOPOLOGY_KEY))
                .cloned()
                .unwrap_or_default();
            (
                (c.storage_class_name.clone(), node),
                (
                    c.capacity.clone().unwrap_or(Quantity(String::new())).0,
                    c.maximum_volume_size.clone().map(|q| q.0),
                    c.metadata.name.clone().unwrap_or_default(),
                ),
            )
        })
        .collect()
}

fn label<'a>(c: &'a CSIStorageCapacity, key: &str) -> Option<&'a str> {
    c.metadata.labels.as_ref()?.get(key).map(String::as_str)
}

/// Waits until the published (class, node) -> capacity map is exactly `want`.
async fn wait_published(cluster: &Cluster, what: &str, want: &[(&str, &str, &str)]) {
    let want: BTreeMap<(String, String), String> = want
        .iter()
        .map(|(c, n, q)| ((c.to_string(), n.to_string()), q.to_string()))
        .collect();
    wait_for(what, DEADLINE, || async {
        let got: BTreeMap<_, _> = published(cluster)
            .await
            .into_iter()
            .map(|(k, (q, _, _))| (k, q))
            .collect();
        (got == want).then_some(())
    })
    .await;
}

fn capacity_flags(poll: &str) -> Vec<String> {
    vec![
        "--enable-capacity".into(),
        format!("--capacity-poll-interval={poll}"),
        "--kube-api-capacity-qps=100".into(),
        "--kube-api-capacity-burst=100".into(),
    ]
}

async fn start_sidecar(
    cluster: &Cluster,
    driver: &Driver,
    flags: &[String],
    env: &[(&str, &str)],
) -> Sidecar {
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let mut all_env = vec![("NAMESPACE", NS)];
    all_env.extend_from_slice(env);
    Sidecar::start_env(cluster, driver, &flags, &all_env).await
}

/// An object as an upstream sidecar would have left it.
fn upstream_object(
    name: &str,
    class: &str,
    node: &str,
    capacity: &str,
    managed_by: &str,
) -> CSIStorageCapacity {
    CSIStorageCapacity {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(NS.into()),
            labels: Some(BTreeMap::from([
                (LABEL_DRIVER.to_string(), DRIVER.to_string()),
                (LABEL_MANAGED_BY.to_string(), managed_by.to_string()),
            ])),
            ..Default::default()
        },
        storage_class_name: class.into(),
        node_topology: Some(LabelSelector {
            match_labels: Some(BTreeMap::from([(
                TOPOLOGY_KEY.to_string(),
                node.to_string(),
            )])),
            match_expressions: None,
        }),
        capacity: Some(Quantity(capacity.into())),
        maximum_volume_size: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn objects_follow_classes_segments_and_provisioning_and_adopt_upstreams() {
    let cluster = Cluster::start().await;
    cluster.ensure_namespace(NS).await;
    cluster.add_nodes(&["node-1", "node-2", "node-3"]).await;
    let driver = Driver::start(
        cluster.dir.path(),
        "node-1",
        &[
            "--topology",
            "--topology-node=node-2",
            "--topology-node=node-3",
            "--capacity-total=10Gi",
            "--max-volume-size=4Gi",
        ],
    )
    .await;
    cluster.add_class(&delayed_class("local-a")).await;
    cluster.add_class(&delayed_class("local-b")).await;
    cluster.add_class(&storage_class("immediate", &[])).await;
    // Left by an upstream sidecar: adopted (updated in place), not duplicated.
    let adopted = upstream_object(
        "csisc-upstream",
        "local-a",
        "node-1",
        "1Gi",
        "external-provisioner",
    );
    cluster.create(&capacities(&cluster), &adopted).await;
    // Another instance's and another driver's objects: never touched.
    let other_instance = upstream_object(
        "csisc-node-x",
        "local-a",
        "node-1",
        "1Gi",
        "external-provisioner-node-x",
    );
    cluster.create(&capacities(&cluster), &other_instance).await;
    let mut other_driver = upstream_object(
        "csisc-other",
        "local-a",
        "node-1",
        "1Gi",
        "external-provisioner",
    );
    other_driver
        .metadata
        .labels
        .as_mut()
        .unwrap()
        .insert(LABEL_DRIVER.into(), "other.csi.example".into());
    cluster.create(&capacities(&cluster), &other_driver).await;

    // A poll interval longer than the test: every refresh below is caused by a change.
    let flags = [
        capacity_flags("1h"),
        vec!["--capacity-ownerref-level=-1".into()],
    ]
    .concat();
    let _sidecar = start_sidecar(&cluster, &driver, &flags, &[]).await;

    let all_full = [
        ("local-a", "node-1", "10Gi"),
        ("local-a", "node-2", "10Gi"),
        ("local-a", "node-3", "10Gi"),
        ("local-b", "node-1", "10Gi"),
        ("local-b", "node-2", "10Gi"),
        ("local-b", "node-3", "10Gi"),
    ];
    wait_published(
        &cluster,
        "one object per delayed class and node, none for Immediate",
        &all_full,
    )
    .await;
    let objects = capacities(&cluster)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items;
    for c in objects
        .iter()
        .filter(|c| label(c, LABEL_DRIVER) == Some(DRIVER))
    {
        if label(c, LABEL_MANAGED_BY) == Some("external-provisioner-node-x") {
            assert_eq!(
                c.capacity,
                Some(Quantity("1Gi".into())),
                "another instance's object untouched"
            );
            continue;
        }
        assert_eq!(label(c, LABEL_MANAGED_BY), Some("external-provisioner"));
        assert_eq!(c.maximum_volume_size, Some(Quantity("4Gi".into())));
        assert_eq!(c.metadata.owner_references, None, "level -1: no owner");
        let name = c.metadata.name.as_deref().unwrap();
        assert!(
            name == "csisc-upstream" || name.starts_with("csisc-"),
            "{name}"
        );
    }
    let names = published(&cluster).await;
    assert_eq!(
        names[&("local-a".into(), "node-1".into())].2,
        "csisc-upstream"
    );
    assert_eq!(
        capacities(&cluster)
            .get("csisc-other")
            .await
            .unwrap()
            .capacity,
        Some(Quantity("1Gi".into()))
    );

    // Provisioning 3Gi on node-2 shrinks node-2's pool: both classes' objects there follow.
    cluster
        .claim_of_class("default", "c1", "local-a", "3Gi")
        .await;
    cluster.schedule("default", "p1", "c1", "node-2").await;
    let pv = cluster.wait_bound("default", "c1").await;
    let shrunk = [
        ("local-a", "node-1", "10Gi"),
        ("local-a", "node-2", "7Gi"),
        ("local-a", "node-3", "10Gi"),
        ("local-b", "node-1", "10Gi"),
        ("local-b", "node-2", "7Gi"),
        ("local-b", "node-3", "10Gi"),
    ];
    wait_published(
        &cluster,
        "node-2's objects updated after CreateVolume",
        &shrunk,
    )
    .await;
    let name_of = |m: &BTreeMap<(String, String), (String, Option<String>, String)>| {
        m.iter()
            .map(|(k, v)| (k.clone(), v.2.clone()))
            .collect::<BTreeMap<_, _>>()
    };
    assert_eq!(
        name_of(&published(&cluster).await),
        name_of(&names),
        "updated in place, never re-created"
    );

    // Deleting the claim deletes the volume: the space comes back.
    let _ = cluster
        .pods("default")
        .delete("p1", &DeleteParams::default())
        .await;
    cluster.delete_pvc_and_wait("default", "c1").await;
    cluster
        .wait_pv_gone(&pv.metadata.name.clone().unwrap())
        .await;
    wait_published(
        &cluster,
        "node-2's objects updated after DeleteVolume",
        &all_full,
    )
    .await;

    // A class goes away: its objects go.
    cluster
        .classes()
        .delete("local-b", &DeleteParams::default())
        .await
        .unwrap();
    wait_published(
        &cluster,
        "local-b's objects deleted",
        &[
            ("local-a", "node-1", "10Gi"),
            ("local-a", "node-2", "10Gi"),
            ("local-a", "node-3", "10Gi"),
        ],
    )
    .await;

    // The driver goes away from node-3 (its CSINode no longer lists it): node-3's objects go.
    let patch = serde_json::json!({"spec": {"drivers": []}});
    cluster
        .csinodes()
        .patch("node-3", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    wait_published(
        &cluster,
        "node-3's objects deleted",
        &[("local-a", "node-1", "10Gi"), ("local-a", "node-2", "10Gi")],
    )
    .await;

    // A node goes away: its objects go.
    cluster.delete_node("node-2").await;
    wait_published(
        &cluster,
        "node-2's objects deleted",
        &[("local-a", "node-1", "10Gi")],
    )
    .await;
    let left: Vec<String> = capacities(&cluster)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|c| c.metadata.name)
        .collect();
    assert_eq!(
        left.len(),
        3,
        "ours, another instance's and another driver's: {left:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_is_written_while_nothing_changes_and_immediate_classes_need_the_flag() {
    let cluster = Cluster::start().await;
    cluster.ensure_namespace(NS).await;
    cluster.add_nodes(&["node-1", "node-2"]).await;
    let driver = Driver::start(
        cluster.dir.path(),
        "node-1",
        &[
            "--topology",
            "--topology-node=node-2",
            "--capacity-total=5Gi",
        ],
    )
    .await;
    cluster.add_class(&delayed_class("local")).await;
    cluster.add_class(&storage_class("immediate", &[])).await;
    let flags = [
        capacity_flags("500ms"),
        vec![
            "--capacity-ownerref-level=-1".into(),
            "--capacity-for-immediate-binding".into(),
            "--http-endpoint=127.0.0.1:0".into(),
        ],
    ]
    .concat();
    let sidecar = start_sidecar(&cluster, &driver, &flags, &[]).await;
    wait_published(
        &cluster,
        "objects for the delayed and, with the flag, the Immediate class",
        &[
            ("immediate", "node-1", "5Gi"),
            ("immediate", "node-2", "5Gi"),
            ("local", "node-1", "5Gi"),
            ("local", "node-2", "5Gi"),
        ],
    )
    .await;
    for c in capacities(&cluster)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
    {
        assert_eq!(
            c.maximum_volume_size, None,
            "the driver reports no maximum here"
        );
    }

    // Several poll intervals: every object polled at least 3 more times (the witness), no write.
    let before = cluster.sim().counters();
    let calls = driver.state().await.calls("GetCapacity");
    wait_for(
        "3 more polls of each of the 4 objects",
        DEADLINE,
        || async {
            let now = driver.state().await.calls("GetCapacity");
            (now >= calls + 12).then_some(())
        },
    )
    .await;
    let during = cluster.sim().counters().since(&before);
    assert_eq!(
        during.writes(),
        0,
        "no write while nothing changed: {:?}",
        during.rows()
    );
    sidecar
        .wait_metric("csistoragecapacities_desired_goal", 4.0)
        .await;
    sidecar
        .wait_metric("csistoragecapacities_desired_current", 4.0)
        .await;
    sidecar
        .wait_metric("csistoragecapacities_obsolete", 0.0)
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn owner_reference_per_level_and_a_restarted_instance_adopts_its_objects() {
    let cluster = Cluster::start().await;
    cluster.ensure_namespace(NS).await;
    cluster.add_nodes(&["node-1"]).await;
    // The sidecar's Pod, owned by a ReplicaSet owned by a Deployment.
    let deployment: Deployment = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "csi-provisioner", "namespace": NS},
        "spec": {"selector": {"matchLabels": {"app": "csi"}},
                 "template": {"metadata": {"labels": {"app": "csi"}},
                              "spec": {"containers": [{"name": "c", "image": "i"}]}}}
    }))
    .unwrap();
    let deployment = cluster
        .create(&Api::namespaced(cluster.client.clone(), NS), &deployment)
        .await;
    let controlled_by = |o: &dyn Fn() -> OwnerReference| serde_json::to_value(vec![o()]).unwrap();
    let dep_ref = || owner_ref(&deployment);
    let replica_set: ReplicaSet = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "csi-provisioner-5d8f", "namespace": NS,
                     "ownerReferences": controlled_by(&dep_ref)},
        "spec": {"selector": {"matchLabels": {"app": "csi"}}}
    }))
    .unwrap();
    let replica_set = cluster
        .create(&Api::namespaced(cluster.client.clone(), NS), &replica_set)
        .await;
    let rs_ref = || owner_ref(&replica_set);
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "csi-provisioner-5d8f-x1", "namespace": NS,
                     "ownerReferences": controlled_by(&rs_ref)},
        "spec": {"containers": [{"name": "c", "image": "i"}]}
    }))
    .unwrap();
    let pod = cluster.create(&cluster.pods(NS), &pod).await;

    let driver = Driver::start(cluster.dir.path(), "node-1", &["--topology"]).await;
    cluster.add_class(&delayed_class("local")).await;
    let env = [("POD_NAME", "csi-provisioner-5d8f-x1")];
    let owners = || async {
        let items = capacities(&cluster)
            .list(&ListParams::default())
            .await
            .unwrap()
            .items;
        assert!(items.len() <= 1, "never a duplicate: {items:?}");
        items
            .first()
            .and_then(|c| c.metadata.owner_references.clone())
            .unwrap_or_default()
            .into_iter()
            .map(|o| (o.kind, o.name, o.uid, o.controller))
            .collect::<Vec<_>>()
    };
    let expect = |objs: &[(&str, &str, String)]| {
        objs.iter()
            .map(|(k, n, u)| (k.to_string(), n.to_string(), u.clone(), Some(true)))
            .collect::<Vec<_>>()
    };
    let uid = |m: &ObjectMeta| m.uid.clone().unwrap();

    // Level 0: the Pod. Each later level is a new instance (as after a rollout) adopting the
    // object and adding its owner, as upstream does.
    let mut want = vec![("Pod", "csi-provisioner-5d8f-x1", uid(&pod.metadata))];
    let levels = [
        ("0", None),
        (
            "1",
            Some((
                "ReplicaSet",
                "csi-provisioner-5d8f",
                uid(&replica_set.metadata),
            )),
        ),
        (
            "2",
            Some(("Deployment", "csi-provisioner", uid(&deployment.metadata))),
        ),
    ];
    let mut sidecar: Option<Sidecar> = None;
    for (level, added) in levels {
        if let Some(mut old) = sidecar.take() {
            old.kill().await;
        }
        if let Some(added) = added {
            want.push(added);
        }
        let flags = [
            capacity_flags("1h"),
            vec![format!("--capacity-ownerref-level={level}")],
        ]
        .concat();
        sidecar = Some(start_sidecar(&cluster, &driver, &flags, &env).await);
        let expected = expect(&want);
        wait_for(
            &format!("owner references of level {level}"),
            DEADLINE,
            || async { (owners().await == expected).then_some(()) },
        )
        .await;
    }

    // Without POD_NAME an owner cannot be found: the sidecar refuses to start, saying why.
    if let Some(mut old) = sidecar.take() {
        old.kill().await;
    }
    let mut failing = Sidecar::start_env(
        &cluster,
        &driver,
        &["--enable-capacity", "--capacity-ownerref-level=1"],
        &[("NAMESPACE", NS)],
    )
    .await;
    assert_ne!(failing.wait_exit().await, Some(0));
    assert!(
        failing
            .log()
            .contains("need POD_NAME env variable to determine CSIStorageCapacity owner"),
        "{}",
        failing.log()
    );
}

fn owner_ref<K: Resource<DynamicType = ()>>(obj: &K) -> OwnerReference {
    OwnerReference {
        api_version: K::api_version(&()).into_owned(),
        kind: K::kind(&()).into_owned(),
        name: obj.meta().name.clone().unwrap(),
        uid: obj.meta().uid.clone().unwrap(),
        controller: Some(true),
        block_owner_deletion: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_mode_each_instance_publishes_its_own_segment() {
    let cluster = Cluster::start().await;
    cluster.ensure_namespace(NS).await;
    let nodes = ["node-1", "node-2", "node-3"];
    cluster.add_nodes(&nodes).await;
    cluster.add_class(&delayed_class("local")).await;
    let mut running = Vec::new();
    for node in nodes {
        let driver = Driver::start(
            cluster.dir.path(),
            node,
            &["--topology", "--capacity-total=2Gi"],
        )
        .await;
        let flags = [
            capacity_flags("1h"),
            vec![
                "--capacity-ownerref-level=-1".into(),
                "--node-deployment".into(),
                "--node-deployment-base-delay=100ms".into(),
                "--node-deployment-max-delay=1s".into(),
                "--deleted-node-grace-period=2s".into(),
            ],
        ]
        .concat();
        let sidecar = start_sidecar(&cluster, &driver, &flags, &[("NODE_NAME", node)]).await;
        running.push((driver, sidecar));
    }
    let full = [
        ("local", "node-1", "2Gi"),
        ("local", "node-2", "2Gi"),
        ("local", "node-3", "2Gi"),
    ];
    wait_published(
        &cluster,
        "one object per node, from that node's instance",
        &full,
    )
    .await;
    for c in capacities(&cluster)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
    {
        let node = &c
            .node_topology
            .as_ref()
            .unwrap()
            .match_labels
            .as_ref()
            .unwrap()[TOPOLOGY_KEY];
        assert_eq!(
            label(&c, LABEL_MANAGED_BY),
            Some(format!("external-provisioner-{node}").as_str()),
            "each instance manages its own node's object"
        );
    }

    cluster
        .claim_of_class("default", "c1", "local", "1Gi")
        .await;
    cluster.schedule("default", "p1", "c1", "node-3").await;
    cluster.wait_bound("default", "c1").await;
    wait_published(
        &cluster,
        "only node-3's object shrinks",
        &[
            ("local", "node-1", "2Gi"),
            ("local", "node-2", "2Gi"),
            ("local", "node-3", "1Gi"),
        ],
    )
    .await;

    // node-3 goes away with its instance: a surviving instance removes node-3's object once the
    // node has been gone for the grace period; the others stay.
    let (mut driver3, mut sidecar3) = running.pop().unwrap();
    sidecar3.kill().await;
    driver3.kill().await;
    cluster.delete_node("node-3").await;
    wait_published(
        &cluster,
        "the deleted node's object removed by a survivor",
        &[("local", "node-1", "2Gi"), ("local", "node-2", "2Gi")],
    )
    .await;
    let removed_by: usize = running
        .iter()
        .map(|(_, s)| s.log_lines_with(&["deleted CSIStorageCapacity of an instance"]))
        .sum();
    assert_eq!(removed_by, 1, "exactly one instance deleted it");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_leader_publishes_and_a_new_leader_adopts_without_writing() {
    let cluster = Cluster::start().await;
    cluster.ensure_namespace(NS).await;
    cluster.add_nodes(&["node-1", "node-2"]).await;
    cluster.add_class(&delayed_class("local")).await;
    let flags: Vec<String> = [
        capacity_flags("500ms"),
        vec![
            "--capacity-ownerref-level=-1".into(),
            "--leader-election".into(),
            "--leader-election-namespace=default".into(),
            "--leader-election-lease-duration=4s".into(),
            "--leader-election-renew-deadline=3s".into(),
            "--leader-election-retry-period=500ms".into(),
        ],
    ]
    .concat();
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let mut replicas = Vec::new();
    for id in ["rep-a", "rep-b"] {
        // Each replica's driver serves the same two node pools (a shared backend).
        let driver = Driver::start(
            cluster.dir.path(),
            id,
            &[
                "--topology",
                "--topology-node=node-1",
                "--topology-node=node-2",
                "--capacity-total=3Gi",
            ],
        )
        .await;
        let sidecar = Sidecar::start_named(
            &cluster,
            &driver,
            &format!("sidecar-{id}"),
            &flags,
            &[("HOSTNAME", id), ("NAMESPACE", NS)],
        )
        .await;
        let full = [("local", "node-1", "3Gi"), ("local", "node-2", "3Gi")];
        if id == "rep-a" {
            wait_published(&cluster, "the first replica's objects", &full).await;
        }
        replicas.push((driver, sidecar));
    }
    // The standby is up and waiting: it publishes nothing and calls no GetCapacity.
    replicas[1].1.wait_log(&["waiting for leadership"], 1).await;
    let leader_polls = replicas[0].0.state().await.calls("GetCapacity");
    wait_for("the leader to poll again", DEADLINE, || async {
        (replicas[0].0.state().await.calls("GetCapacity") >= leader_polls + 4).then_some(())
    })
    .await;
    assert_eq!(replicas[1].0.state().await.calls("GetCapacity"), 0);
    assert_eq!(
        replicas[1]
            .1
            .log_lines_with(&["capacity controller started"]),
        0
    );
    let names: Vec<String> = published(&cluster)
        .await
        .into_values()
        .map(|v| v.2)
        .collect();

    // The leader dies; the standby takes over, adopts the same objects and, values unchanged,
    // writes none.
    let before = cluster.sim().counters();
    replicas[0].1.kill().await;
    replicas[1]
        .1
        .wait_log(&["capacity controller started"], 1)
        .await;
    wait_for(
        "the new leader to poll every object twice",
        DEADLINE,
        || async { (replicas[1].0.state().await.calls("GetCapacity") >= 4).then_some(()) },
    )
    .await;
    let after: Vec<String> = published(&cluster)
        .await
        .into_values()
        .map(|v| v.2)
        .collect();
    assert_eq!(after, names, "adopted, not re-created");
    let during = cluster.sim().counters().since(&before);
    assert_eq!(
        during.writes_to(Some("csistoragecapacities")),
        0,
        "{:?}",
        during.rows()
    );
}

/// Issue 42: within a write budget nobody may exceed, a new node's objects go ahead of a backlog
/// of refresh writes (before, a missing key was queued behind every refresh).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_nodes_object_is_created_ahead_of_a_backlog_of_refresh_writes() {
    // Two writes a second: 30 changed objects are a backlog of about 15 s.
    let (cluster, nodes, driver, sidecar) = many_nodes(30, "2s").await;
    wait_for("every node's object", DEADLINE, || async {
        (published(&cluster).await.len() == nodes.len()).then_some(())
    })
    .await;

    // Every node's capacity changes at once: each object needs a write.
    for node in &nodes {
        driver
            .create_volume_on(&format!("fill-{node}"), Some(node), Some(1 << 30))
            .await;
    }
    wait_for(
        "a backlog of 20 refreshes waiting for the budget",
        DEADLINE,
        || async {
            let text = sidecar.try_metrics().await?;
            let depth = metric_value(&text, "workqueue_depth{name=\"csistoragecapacity\"}")?;
            (depth >= 20.0).then_some(())
        },
    )
    .await;
    let lag = sidecar
        .metric("csi_provisioner_capacity_queue_oldest_seconds")
        .await
        .expect("the lag gauge");
    assert!(lag > 0.0, "the lag is shown: {lag}");

    cluster.add_node("node-new").await;
    let stale = wait_for("the new node's object", DEADLINE, || async {
        let objects = published(&cluster).await;
        objects
            .contains_key(&("local".to_string(), "node-new".to_string()))
            .then(|| objects.values().filter(|(q, _, _)| q == "10Gi").count())
    })
    .await;
    assert!(
        stale >= 10,
        "the new node's object waited behind the refreshes: only {stale} of 30 were still unwritten"
    );
    // The backlog is still written, every refresh once.
    wait_for("every refresh written", DEADLINE, || async {
        let objects = published(&cluster).await;
        (objects.values().filter(|(q, _, _)| q == "9Gi").count() == nodes.len()).then_some(())
    })
    .await;
}

/// Issue 42: a node added while the objects of a large cluster are still being created for the
/// first time (at the default budget 4,000 objects take over an hour) gets its objects first,
/// ahead of the initial creations as well as the refreshes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_nodes_object_is_created_ahead_of_the_initial_creations() {
    // Two writes a second: 40 objects take about 20 s to create.
    let (cluster, nodes, _driver, _sidecar) = many_nodes(40, "1m").await;
    wait_for("the first objects created", DEADLINE, || async {
        (published(&cluster).await.len() >= 3).then_some(())
    })
    .await;

    cluster.add_node("node-new").await;
    let created = wait_for("the new node's object", DEADLINE, || async {
        let objects = published(&cluster).await;
        objects
            .contains_key(&("local".to_string(), "node-new".to_string()))
            .then_some(objects.len())
    })
    .await;
    assert!(
        created <= nodes.len() - 10,
        "the new node's object waited behind the initial creations: {created} of {} existed",
        nodes.len() + 1
    );
    wait_for("every node's object", DEADLINE, || async {
        (published(&cluster).await.len() == nodes.len() + 1).then_some(())
    })
    .await;
}

/// `count` nodes behind one mock driver (10Gi each), the WaitForFirstConsumer class `local`, and a
/// sidecar writing capacity at two writes a second with `poll` as its interval.
async fn many_nodes(count: usize, poll: &str) -> (Cluster, Vec<String>, Driver, Sidecar) {
    let cluster = Cluster::start().await;
    cluster.ensure_namespace(NS).await;
    let nodes: Vec<String> = (1..=count).map(|i| format!("node-{i:02}")).collect();
    for node in &nodes {
        cluster.add_node(node).await;
    }
    let mut driver_flags = vec!["--topology".to_string(), "--capacity-total=10Gi".into()];
    driver_flags.extend(nodes[1..].iter().map(|n| format!("--topology-node={n}")));
    let driver_flags: Vec<&str> = driver_flags.iter().map(String::as_str).collect();
    let driver = Driver::start(cluster.dir.path(), &nodes[0], &driver_flags).await;
    cluster.add_class(&delayed_class("local")).await;
    let flags: Vec<String> = [
        "--enable-capacity",
        &format!("--capacity-poll-interval={poll}"),
        "--kube-api-capacity-qps=2",
        "--kube-api-capacity-burst=1",
        "--capacity-ownerref-level=-1",
        "--http-endpoint=127.0.0.1:0",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let sidecar = start_sidecar(&cluster, &driver, &flags, &[]).await;
    (cluster, nodes, driver, sidecar)
}

/// A capacity watch that never lists (its RBAC missing, say) holds up nothing else: the PV watch
/// the capacity controller shares with the claim and PV controllers goes on, however many PVs its
/// first list announces (here more than a change stream buffers). A claim is provisioned and,
/// deleted, its volume deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_capacity_watch_that_never_lists_holds_up_neither_provisioning_nor_deletion() {
    let cluster = Cluster::start().await;
    cluster.ensure_namespace(NS).await;
    cluster.add_nodes(&["node-1"]).await;
    let driver = Driver::start(cluster.dir.path(), "node-1", &["--capacity-total=10Gi"]).await;
    cluster.add_class(&storage_class("fast", &[])).await;
    for i in 0..1100 {
        let pv = serde_json::json!({
            "apiVersion": "v1", "kind": "PersistentVolume",
            "metadata": {"name": format!("other-{i}")},
            "spec": {
                "capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                "persistentVolumeReclaimPolicy": "Retain",
                "csi": {"driver": "other.csi.example", "volumeHandle": format!("v{i}")}
            }
        });
        cluster
            .sim()
            .create("", "persistentvolumes", "", pv)
            .expect("a PV of another driver");
    }
    cluster.sim().faults().add(
        kube_sim::FaultRule::error(403)
            .resource("csistoragecapacities")
            .message("csistoragecapacities is forbidden"),
    );
    let flags = [
        capacity_flags("1h"),
        vec!["--capacity-ownerref-level=-1".into()],
    ]
    .concat();
    let _sidecar = start_sidecar(&cluster, &driver, &flags, &[]).await;

    cluster.claim_of_class("default", "c1", "fast", "1Gi").await;
    let pv = cluster.wait_bound("default", "c1").await;
    cluster.delete_pvc_and_wait("default", "c1").await;
    cluster
        .wait_pv_gone(&pv.metadata.name.clone().unwrap())
        .await;
}
