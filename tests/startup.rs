//! Start-up and shutdown of the real binary: waiting for a late driver socket (and saying so), a
//! driver that cannot provision, the metrics endpoint, and graceful exit on SIGTERM.

mod common;

use common::*;

const NS: &str = "default";

/// Sends SIGTERM to a child by pid (tokio's `Child::kill` only sends SIGKILL).
fn sigterm(pid: u32) {
    let status = std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .expect("run kill");
    assert!(status.success());
}

#[tokio::test]
async fn waits_for_a_missing_driver_socket_says_so_and_starts_once_it_appears() {
    let cluster = Cluster::start().await;
    let dir = cluster.dir.path().to_path_buf();
    // The sidecar is pointed at the driver's socket before the driver exists.
    let socket = dir.join("driver-late").join("csi.sock");
    let placeholder = Driver::placeholder("late", &socket);
    let sidecar = Sidecar::start(&cluster, &placeholder, &[]).await;
    wait_for("the sidecar to say what it waits for", DEADLINE, || async {
        sidecar
            .log()
            .contains(&format!(
                "waiting for CSI driver socket {}",
                socket.display()
            ))
            .then_some(())
    })
    .await;

    let driver = Driver::start(&dir, "late", &[]).await;
    assert_eq!(driver.socket, socket);
    cluster.claim_with_fast_class("default", "c1").await;
    cluster.wait_bound("default", "c1").await;
    driver.wait_volumes(1).await;
}

#[tokio::test]
async fn refuses_to_start_when_the_driver_cannot_create_volumes() {
    let cluster = Cluster::start().await;
    let driver = Driver::start(
        cluster.dir.path(),
        "node-1",
        &["--disable-capability=CREATE_DELETE_VOLUME"],
    )
    .await;
    let mut sidecar = Sidecar::start(&cluster, &driver, &[]).await;
    let code = sidecar.wait_exit().await;
    assert_eq!(code, Some(1));
    let log = sidecar.log();
    assert!(
        log.contains("CREATE_DELETE_VOLUME"),
        "the reason names the missing capability: {log}"
    );
}

#[tokio::test]
async fn sigterm_stops_the_sidecar_cleanly_and_metrics_were_served() {
    let cluster = Cluster::start().await;
    let driver = Driver::start(cluster.dir.path(), "node-1", &[]).await;
    let port = free_port();
    let endpoint = format!("--http-endpoint=127.0.0.1:{port}");
    let mut sidecar = Sidecar::start(&cluster, &driver, &[&endpoint]).await;
    cluster.claim_with_fast_class("default", "c1").await;
    cluster.wait_bound("default", "c1").await;

    // Upstream's metric names are served on the metrics path.
    let body = wait_for(
        "metrics to show the CreateVolume call",
        DEADLINE,
        || async {
            let body = http_get(port, "/metrics").await?;
            body.contains("method_name=\"/csi.v1.Controller/CreateVolume\"")
                .then_some(body)
        },
    )
    .await;
    assert!(
        body.contains("csi_sidecar_operations_seconds_bucket"),
        "{body}"
    );
    assert!(
        body.contains("controller_persistentvolumeclaim_provision_total"),
        "{body}"
    );
    assert_eq!(http_get(port, "/healthz").await.as_deref(), Some("ok"));

    sigterm(sidecar.pid().expect("sidecar running"));
    assert_eq!(sidecar.wait_exit().await, Some(0), "exit 0 after SIGTERM");
    assert!(sidecar.log().contains("SIGTERM received"));
}

/// A port that was free a moment ago (the sidecar binds it right after).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

/// A plain HTTP/1.0 GET, enough for the metrics endpoint; `None` while it is not listening yet.
async fn http_get(port: u16, path: &str) -> Option<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .ok()?;
    let request = format!("GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n");
    stream.write_all(request.as_bytes()).await.ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await.ok()?;
    let (head, body) = response.split_once("\r\n\r\n")?;
    // hyper answers an HTTP/1.0 request with an HTTP/1.0 status line.
    let status = head.split_whitespace().nth(1)?;
    (status == "200").then(|| body.to_owned())
}

/// Claims and PVs are listed by streaming (a watch with `sendInitialEvents`), so the start-up of a
/// large cluster costs no LIST of them, and it reaches the same state: the claim gets its volume.
#[tokio::test]
async fn start_up_streams_claims_and_pvs_instead_of_listing_them() {
    let (cluster, _driver, _sidecar) = start_single_node(&[], &[]).await;
    cluster.add_class(&storage_class("fast", &[])).await;
    cluster.claim_of_class(NS, "data", "fast", "1Gi").await;
    cluster.wait_bound(NS, "data").await;
    let counters = cluster.sim().counters();
    for resource in ["persistentvolumeclaims", "persistentvolumes"] {
        assert_eq!(
            counters.count(Some("list"), Some(resource), None),
            0,
            "{resource} listed although the API server streams lists: {:#}",
            counters.to_json()
        );
        assert!(counters.count(Some("watch"), Some(resource), Some(200)) >= 1);
    }
}

/// An API server without streaming lists (before Kubernetes 1.32, or with the WatchList gate off)
/// answers the streaming watch 422: the sidecar falls back to paged LISTs once and works as before.
#[tokio::test]
async fn start_up_falls_back_to_paged_lists_when_the_api_server_refuses_streaming() {
    let cluster = Cluster::start_with(kube_sim::SimConfig {
        watch_list: false,
        ..Default::default()
    })
    .await;
    let driver = Driver::start(cluster.dir.path(), "node-1", &[]).await;
    let _sidecar = Sidecar::start(&cluster, &driver, &[]).await;
    cluster.add_class(&storage_class("fast", &[])).await;
    cluster.claim_of_class(NS, "data", "fast", "1Gi").await;
    cluster.wait_bound(NS, "data").await;
    // The first refusal is remembered: later watches go straight to paged lists.
    let counters = cluster.sim().counters();
    assert!(
        counters.count(Some("watch"), None, Some(422)) >= 1,
        "{:#}",
        counters.to_json()
    );
    for resource in ["persistentvolumeclaims", "persistentvolumes"] {
        assert!(counters.count(Some("list"), Some(resource), Some(200)) >= 1);
    }
}
