use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::*;

fn options(leader_election_health: bool, metrics_path: &str) -> HttpOptions {
    HttpOptions {
        address: "127.0.0.1:0".into(),
        address_flag: "--http-endpoint",
        metrics_path: metrics_path.into(),
        enable_pprof: false,
        leader_election_health,
    }
}

/// Starts a server; returns its address and the sender that shuts it down.
async fn start(
    options: &HttpOptions,
    metrics: Arc<Metrics>,
    health: Health,
) -> (
    SocketAddr,
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<Result<(), HttpError>>,
) {
    let server = bind(options, metrics, health).await.unwrap();
    let address = server.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(server.run(async {
        let _ = stopped.await;
    }));
    (address, stop, task)
}

/// A minimal HTTP/1.1 GET: (status, raw headers, body).
async fn get(address: SocketAddr, path: &str) -> (u16, String, String) {
    get_with(address, path, "").await
}

/// [`get`] with extra header lines (each ending in `\r\n`).
async fn get_with(address: SocketAddr, path: &str, headers: &str) -> (u16, String, String) {
    let mut stream = TcpStream::connect(address).await.unwrap();
    let request =
        format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n{headers}\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    let (head, body) = response.split_once("\r\n\r\n").unwrap();
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    (status, head.to_owned(), body.to_owned())
}

#[tokio::test]
async fn serves_metrics_and_healthz() {
    let metrics = Arc::new(Metrics::new());
    metrics
        .provision
        .succeeded("fast", "", Duration::from_secs(1));
    let (address, stop, task) = start(
        &options(false, "/metrics"),
        metrics.clone(),
        Health::default(),
    )
    .await;

    let (status, head, body) = get(address, "/metrics").await;
    assert_eq!(status, 200);
    assert!(
        head.to_ascii_lowercase().contains(
            "content-type: text/plain; version=0.0.4; charset=utf-8; escaping=underscores"
        ),
        "{head}"
    );
    assert!(!body.contains("# EOF"), "{body}");
    assert!(
        body.contains(
            r#"controller_persistentvolumeclaim_provision_total{class="fast",source=""} 1"#
        ),
        "{body}"
    );
    // Families registered later by other modules, and new observations, show up on the next scrape.
    metrics.delete.failed("slow");
    assert!(
        get(address, "/metrics")
            .await
            .2
            .contains(r#"controller_persistentvolume_delete_failed_total{class="slow"} 1"#)
    );

    // Prometheus's own Accept header gets OpenMetrics, with the same sample names.
    let (status, head, om) = get_with(
        address,
        "/metrics",
        "Accept: application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5,*/*;q=0.1\r\n",
    )
    .await;
    assert_eq!(status, 200);
    assert!(
        head.to_ascii_lowercase()
            .contains("content-type: application/openmetrics-text; version=1.0.0"),
        "{head}"
    );
    assert!(om.ends_with("# EOF\n"), "{om}");
    assert!(
        om.contains(
            r#"controller_persistentvolumeclaim_provision_total{class="fast",source=""} 1"#
        ),
        "{om}"
    );
    let (_, head, _) = get_with(address, "/metrics", "Accept: */*\r\n").await;
    assert!(
        head.to_ascii_lowercase()
            .contains("content-type: text/plain; version=0.0.4")
    );

    let (status, _, body) = get(address, "/healthz").await;
    assert_eq!((status, body.as_str()), (200, "ok"));
    assert_eq!(
        get(address, "/healthz/leader-election").await.0,
        404,
        "only with leader election"
    );
    assert_eq!(get(address, "/other").await.0, 404);

    stop.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}

#[tokio::test]
async fn custom_metrics_path_replaces_the_default() {
    let (address, _stop, _task) = start(
        &options(false, "/custom/{x}"),
        Arc::new(Metrics::new()),
        Health::default(),
    )
    .await;
    assert_eq!(get(address, "/custom/{x}").await.0, 200);
    assert_eq!(get(address, "/metrics").await.0, 404);
}

#[tokio::test]
async fn leader_election_health_reflects_the_reported_state() {
    let health = Health::default();
    let (address, _stop, _task) = start(
        &options(true, "/metrics"),
        Arc::new(Metrics::new()),
        health.clone(),
    )
    .await;
    assert_eq!(get(address, "/healthz/leader-election").await.2, "ok");

    health.set_leader_election_unhealthy("failed to renew the lease for 35s");
    let (status, _, body) = get(address, "/healthz/leader-election").await;
    assert_eq!(
        (status, body.as_str()),
        (
            500,
            "internal server error: failed to renew the lease for 35s"
        )
    );
    assert_eq!(
        get(address, "/healthz").await.0,
        200,
        "the process itself is still healthy"
    );

    health.set_leader_election_healthy();
    assert_eq!(get(address, "/healthz/leader-election").await.0, 200);
}

#[tokio::test]
async fn a_taken_address_is_a_listen_error_naming_the_flag() {
    let taken = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let mut opts = options(false, "/metrics");
    opts.address = taken.local_addr().unwrap().to_string();
    opts.address_flag = "--metrics-address";
    let err = bind(&opts, Arc::new(Metrics::new()), Health::default())
        .await
        .unwrap_err();
    assert!(matches!(err, HttpError::Listen { .. }));
    let message = err.to_string();
    assert!(
        message.starts_with(&format!(
            "cannot listen on --metrics-address={:?}",
            opts.address
        )),
        "{message}"
    );
}

#[tokio::test]
async fn colon_port_listens_on_every_interface() {
    let mut opts = options(false, "/metrics");
    opts.address = ":0".into();
    let server = bind(&opts, Arc::new(Metrics::new()), Health::default())
        .await
        .unwrap();
    assert!(server.local_addr().unwrap().ip().is_unspecified());
}
