//! The start-up RBAC self-check, end to end: a permission the API server denies is named in the
//! log (with the rule to add), on `/healthz/rbac` and in a Warning event on the sidecar's Pod; with
//! every permission granted the check says so and stays quiet.

mod common;

use common::*;
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
            .sim
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
}
