//! The start-up RBAC self-check, end to end: a permission the API server denies is named in the
//! log (with the rule to add), on `/healthz/rbac` and in a Warning event on the sidecar's Pod; with
//! every permission granted the check says so and stays quiet.

mod common;

use common::*;
use std::collections::BTreeSet;

use kube_sim::FaultRule;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const NS: &str = "default";

/// `GET path` on the sidecar's HTTP server: (status line, body).
async fn get(sidecar: &Sidecar, path: &str) -> (String, String) {
    let addr = sidecar.http_addr().await;
    let mut stream = tokio::net::TcpStream::connect(&addr)
        .await
        .expect("connect");
    let request = format!("GET {path} HTTP/1.0\r\nHost: sidecar\r\n\r\n");
    stream.write_all(request.as_bytes()).await.expect("send");
    let mut response = String::new();
    stream.read_to_string(&mut response).await.expect("read");
    let (head, body) = response.split_once("\r\n\r\n").expect("HTTP response");
    (
        head.lines().next().unwrap_or_default().to_owned(),
        body.to_owned(),
    )
}

#[tokio::test]
async fn a_denied_permission_is_named_with_the_rule_to_add_in_log_health_and_event() {
    let cluster = Cluster::start().await;
    // The identity may not delete PVs nor watch VolumeAttachments (the mock driver publishes, so
    // the sidecar needs them).
    for (verb, resource) in [
        ("delete", "persistentvolumes"),
        ("watch", "volumeattachments"),
    ] {
        cluster
            .sim()
            .faults()
            .add(FaultRule::error(403).verb(verb).resource(resource));
    }
    let pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "csi-provisioner-0", "namespace": NS},
        "spec": {"containers": [{"name": "csi-provisioner", "image": "csi-provisioner-rs"}]}
    }))
    .unwrap();
    cluster.create(&cluster.pods(NS), &pod).await;
    let driver = Driver::start(cluster.dir.path(), "node-1", &[]).await;
    let sidecar = Sidecar::start_env(
        &cluster,
        &driver,
        &["--http-endpoint=127.0.0.1:0"],
        &[("POD_NAME", "csi-provisioner-0"), ("NAMESPACE", NS)],
    )
    .await;

    sidecar
        .wait_log(
            &["missing RBAC permission", "cannot delete persistentvolumes"],
            1,
        )
        .await;
    sidecar
        .wait_log(
            &[
                "missing RBAC permission",
                "cannot watch volumeattachments.storage.k8s.io",
            ],
            1,
        )
        .await;
    sidecar
        .wait_log(&["add these rules to the sidecar's RBAC"], 1)
        .await;
    // The rules come as YAML lines to paste into the ClusterRole.
    sidecar
        .wait_log(&["  resources: [\"persistentvolumes\"]"], 1)
        .await;
    assert_eq!(
        sidecar.log_lines_with(&["cannot create persistentvolumes"]),
        0
    );

    let (status, body) = get(&sidecar, "/healthz/rbac").await;
    assert!(status.contains("500"), "{status}: {body}");
    assert!(body.contains("cannot delete persistentvolumes"), "{body}");
    assert!(
        body.contains("cannot watch volumeattachments.storage.k8s.io"),
        "{body}"
    );
    // Liveness is not tied to it: a restart does not grant a permission.
    assert!(get(&sidecar, "/healthz").await.0.contains("200"));
    // An alert can fire on it (deploy/monitoring/prometheus-rules.yaml).
    wait_for("the missing-permission gauge", DEADLINE, || async {
        let missing = sidecar
            .metric("csi_provisioner_rbac_missing_permissions")
            .await?;
        (missing >= 2.0).then_some(())
    })
    .await;

    let message = cluster
        .wait_event(
            "Pod",
            NS,
            "csi-provisioner-0",
            "MissingRBACPermission",
            "cannot delete persistentvolumes",
        )
        .await;
    assert!(message.contains("verbs: [\"delete\"]"), "{message}");
}

#[tokio::test]
async fn with_every_permission_granted_the_check_passes_quietly() {
    let cluster = Cluster::start().await;
    let driver = Driver::start(cluster.dir.path(), "node-1", &[]).await;
    let sidecar = Sidecar::start(&cluster, &driver, &["--http-endpoint=127.0.0.1:0"]).await;
    sidecar
        .wait_log(
            &["RBAC self-check: every permission this configuration needs is granted"],
            1,
        )
        .await;
    assert_eq!(sidecar.log_lines_with(&["missing RBAC permission"]), 0);
    let (status, body) = get(&sidecar, "/healthz/rbac").await;
    assert!(status.contains("200") && body == "ok", "{status}: {body}");
    assert_eq!(
        sidecar
            .metric("csi_provisioner_rbac_missing_permissions")
            .await,
        Some(0.0)
    );
    // One rules review for the ledger's namespace showed everything: no access review per
    // permission (there were 20).
    let ours = cluster
        .sim()
        .counters()
        .agent(|agent| agent.starts_with("csi-provisioner/"));
    assert_eq!(
        ours.count(Some("create"), Some("selfsubjectrulesreviews"), None),
        1
    );
    assert_eq!(
        ours.count(Some("create"), Some("selfsubjectaccessreviews"), None),
        0
    );
}

/// API group of each resource the sidecar may touch.
fn group_of(resource: &str) -> &'static str {
    match resource.split('/').next().unwrap_or_default() {
        "storageclasses"
        | "csinodes"
        | "volumeattachments"
        | "volumeattributesclasses"
        | "csistoragecapacities" => "storage.k8s.io",
        "leases" => "coordination.k8s.io",
        "selfsubjectaccessreviews" | "selfsubjectrulesreviews" => "authorization.k8s.io",
        "volumesnapshots" | "volumesnapshotcontents" => "snapshot.storage.k8s.io",
        "replicasets" => "apps",
        _ => "",
    }
}

/// (group, resource, verb) granted by every ClusterRole and Role of deploy/rbac.yaml, read back
/// from an API server the manifest was applied to with kubectl.
async fn granted_by_manifest(cluster: &Cluster) -> Option<BTreeSet<(String, String, String)>> {
    use k8s_openapi::api::rbac::v1::{ClusterRole, Role};
    let home = cluster.dir.path();
    let out = std::process::Command::new("kubectl")
        .args([
            "apply",
            "-f",
            concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/rbac.yaml"),
        ])
        .env("KUBECONFIG", &cluster.kubeconfig)
        .env("HOME", home)
        .output()
        .ok()?;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut rules = Vec::new();
    let client = cluster.client.clone();
    for role in kube::Api::<ClusterRole>::all(client.clone())
        .list(&Default::default())
        .await
        .unwrap()
    {
        rules.extend(role.rules.unwrap_or_default());
    }
    for role in kube::Api::<Role>::all(client)
        .list(&Default::default())
        .await
        .unwrap()
    {
        rules.extend(role.rules.unwrap_or_default());
    }
    let mut granted = BTreeSet::new();
    for rule in rules {
        for group in rule.api_groups.unwrap_or_default() {
            for resource in rule.resources.clone().unwrap_or_default() {
                for verb in &rule.verbs {
                    granted.insert((group.clone(), resource.clone(), verb.clone()));
                }
            }
        }
    }
    Some(granted)
}

/// Grants the scenario below may not use, each with why the manifest keeps it. Anything else
/// granted and unused is an over-grant.
#[rustfmt::skip]
const GRANTED_FOR_OTHER_PATHS: &[(&str, &str, &str, &str)] = &[
    ("", "persistentvolumeclaims", "get", "re-reading a claim after a write conflict"),
    ("", "persistentvolumeclaims", "update", "claim writes where PATCH is refused (upstream's role)"),
    ("", "persistentvolumeclaims", "patch", "selected-node clearing, node-mode competition and claim intents (tests/node_mode.rs)"),
    ("", "persistentvolumes", "get", "the live check that no PV exists before an abandoned intent's volume is deleted"),
    ("", "persistentvolumeclaims", "delete", "--deleted-node-pvc-cleanup (tests/node_mode.rs)"),
    ("", "persistentvolumeclaims", "list", "caches are filled by streaming watches; LIST is the fallback where streaming is refused (tests/startup.rs)"),
    ("", "persistentvolumes", "list", "caches are filled by streaming watches; LIST is the fallback where streaming is refused (tests/startup.rs)"),
    ("", "nodes", "list", "caches are filled by streaming watches; LIST is the fallback where streaming is refused (tests/startup.rs)"),
    ("storage.k8s.io", "csinodes", "list", "caches are filled by streaming watches; LIST is the fallback where streaming is refused (tests/startup.rs)"),
    ("storage.k8s.io", "storageclasses", "list", "caches are filled by streaming watches; LIST is the fallback where streaming is refused (tests/startup.rs)"),
    ("", "events", "list", "upstream's ClusterRole; kept so upstream can run with this manifest"),
    ("", "events", "watch", "upstream's ClusterRole; kept so upstream can run with this manifest"),
    ("", "events", "update", "upstream's ClusterRole; kept so upstream can run with this manifest"),
    ("", "events", "patch", "repeats of an event within an hour (aggregation)"),
    ("", "nodes", "get", "the live check that a node is gone (node-deployment mode)"),
    ("storage.k8s.io", "storageclasses", "get", "upstream's ClusterRole (classes come from the cache)"),
    ("storage.k8s.io", "csinodes", "get", "upstream's ClusterRole (topology)"),
    ("storage.k8s.io", "volumeattachments", "get", "upstream's ClusterRole"),
    ("storage.k8s.io", "volumeattributesclasses", "get", "claims naming a VolumeAttributesClass"),
    ("snapshot.storage.k8s.io", "volumesnapshots", "get", "data sources (upstream's role)"),
    ("snapshot.storage.k8s.io", "volumesnapshots", "list", "data sources (upstream's role)"),
    ("snapshot.storage.k8s.io", "volumesnapshots", "watch", "data sources (upstream's role)"),
    ("snapshot.storage.k8s.io", "volumesnapshots", "update", "data sources (upstream's role)"),
    ("snapshot.storage.k8s.io", "volumesnapshotcontents", "get", "data sources (upstream's role)"),
    ("snapshot.storage.k8s.io", "volumesnapshotcontents", "list", "data sources (upstream's role)"),
    ("coordination.k8s.io", "leases", "get", "--leader-election"),
    ("coordination.k8s.io", "leases", "watch", "--leader-election (upstream's role)"),
    ("coordination.k8s.io", "leases", "list", "--leader-election (upstream's role)"),
    ("coordination.k8s.io", "leases", "delete", "--leader-election (upstream's role)"),
    ("coordination.k8s.io", "leases", "update", "--leader-election"),
    ("coordination.k8s.io", "leases", "create", "--leader-election"),
    ("storage.k8s.io", "csistoragecapacities", "get", "--enable-capacity"),
    ("storage.k8s.io", "csistoragecapacities", "list", "--enable-capacity"),
    ("storage.k8s.io", "csistoragecapacities", "watch", "--enable-capacity"),
    ("storage.k8s.io", "csistoragecapacities", "create", "--enable-capacity"),
    ("storage.k8s.io", "csistoragecapacities", "update", "--enable-capacity"),
    ("storage.k8s.io", "csistoragecapacities", "patch", "--enable-capacity"),
    ("storage.k8s.io", "csistoragecapacities", "delete", "--enable-capacity"),
    ("", "pods", "get", "--enable-capacity owner references"),
    ("apps", "replicasets", "get", "--enable-capacity owner references"),
];

// Multi-threaded: the in-process API server keeps answering while kubectl blocks this thread.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_manifest_grants_what_the_sidecar_uses_and_no_more() {
    let cluster = Cluster::start().await;
    let Some(granted) = granted_by_manifest(&cluster).await else {
        println!("skipped: kubectl is not installed (.ci/run installs Debian's kubernetes-client)");
        return;
    };
    // Provisioning with topology and deletion, on a driver that publishes (VolumeAttachments).
    cluster.add_nodes(&["node-1"]).await;
    let driver = Driver::start(cluster.dir.path(), "node-1", &["--topology"]).await;
    // With leader election, as the controller Deployment runs it.
    let sidecar = Sidecar::start(
        &cluster,
        &driver,
        &[
            "--feature-gates=Topology=true",
            "--leader-election",
            "--leader-election-namespace=default",
        ],
    )
    .await;
    sidecar.wait_started().await;
    cluster.add_class(&storage_class("fast", &[])).await;
    cluster.claim_of_class(NS, "data", "fast", "1Gi").await;
    let pv = cluster.wait_bound(NS, "data").await;
    let _ = cluster
        .pvcs(NS)
        .delete("data", &Default::default())
        .await
        .unwrap();
    cluster
        .wait_pv_gone(pv.metadata.name.as_deref().unwrap())
        .await;
    sidecar
        .wait_log(
            &["RBAC self-check: every permission this configuration needs is granted"],
            1,
        )
        .await;

    let ours = cluster
        .sim()
        .counters()
        .agent(|agent| agent.starts_with("csi-provisioner/"));
    let used: BTreeSet<(String, String, String)> = ours
        .rows()
        .into_iter()
        // Reviews are allowed to every authenticated user (system:basic-user).
        .filter(|row| !row.resource.starts_with("selfsubject"))
        .map(|row| {
            let resource = row
                .resource
                .split('/')
                .next()
                .unwrap_or_default()
                .to_owned();
            (group_of(&resource).to_owned(), resource, row.verb)
        })
        .collect();
    assert!(!used.is_empty(), "no request of the sidecar was counted");
    let missing: Vec<_> = used.difference(&granted).collect();
    assert!(missing.is_empty(), "deploy/rbac.yaml misses {missing:?}");
    let allowed: BTreeSet<(String, String, String)> = GRANTED_FOR_OTHER_PATHS
        .iter()
        .map(|(g, r, v, _)| (g.to_string(), r.to_string(), v.to_string()))
        .collect();
    let over: Vec<_> = granted
        .difference(&used)
        .filter(|g| !allowed.contains(*g))
        .collect();
    assert!(
        over.is_empty(),
        "deploy/rbac.yaml grants {over:?}, which no scenario uses and no entry of GRANTED_FOR_OTHER_PATHS explains"
    );
}
