//! Unit tests of `client.rs`: the token bucket on a fake clock, the tower service, a real client
//! against a counting HTTP server, and the choice of configuration.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use governor::clock::FakeRelativeClock;
use tower::ServiceExt;

use super::*;

const MS: fn(u64) -> Duration = Duration::from_millis;

fn limit(qps: f64, burst: u32) -> RateLimit {
    RateLimit { qps, burst }
}

#[test]
fn bucket_admits_the_burst_then_one_token_per_period() {
    let clock = FakeRelativeClock::default();
    let bucket = TokenBucket::with_clock(limit(2.0, 3), clock.clone());
    for _ in 0..3 {
        assert_eq!(bucket.try_acquire(), Ok(()));
    }
    assert_eq!(bucket.try_acquire(), Err(MS(500)));
    clock.advance(MS(499));
    assert_eq!(bucket.try_acquire(), Err(MS(1)));
    clock.advance(MS(1));
    assert_eq!(bucket.try_acquire(), Ok(()));
    assert_eq!(bucket.try_acquire(), Err(MS(500)));

    // An idle bucket refills up to the burst, never beyond.
    clock.advance(Duration::from_secs(60));
    for _ in 0..3 {
        assert_eq!(bucket.try_acquire(), Ok(()));
    }
    assert_eq!(bucket.try_acquire(), Err(MS(500)));
}

#[test]
fn ten_requests_at_qps_2_burst_3_take_three_and_a_half_seconds_of_tokens() {
    let clock = FakeRelativeClock::default();
    let bucket = TokenBucket::with_clock(limit(2.0, 3), clock.clone());
    let mut admitted_at = Vec::new();
    let mut now = Duration::ZERO;
    while admitted_at.len() < 10 {
        match bucket.try_acquire() {
            Ok(()) => admitted_at.push(now),
            Err(wait) => {
                clock.advance(wait);
                now += wait;
            }
        }
    }
    let expected: Vec<Duration> = [0, 0, 0, 500, 1000, 1500, 2000, 2500, 3000, 3500]
        .map(MS)
        .to_vec();
    assert_eq!(admitted_at, expected);
}

#[test]
fn fractional_qps_is_honoured() {
    let clock = FakeRelativeClock::default();
    let bucket = TokenBucket::with_clock(limit(0.5, 1), clock);
    assert_eq!(bucket.try_acquire(), Ok(()));
    assert_eq!(bucket.try_acquire(), Err(Duration::from_secs(2)));
}

#[test]
fn background_work_takes_only_tokens_the_workers_leave() {
    let clock = FakeRelativeClock::default();
    // One token per 100 ms, burst 2: background work waits for 200 ms without worker demand.
    let bucket = TokenBucket::with_clock(limit(10.0, 2), clock.clone());
    assert_eq!(bucket.quiet(), MS(200));
    assert_eq!(
        bucket.try_acquire_spare(),
        Ok(()),
        "an idle bucket has spare tokens"
    );

    // A worker asked just now: a token is left, but background work waits out the quiet time.
    assert_eq!(bucket.try_acquire(), Ok(()));
    assert_eq!(bucket.try_acquire_spare(), Err(MS(200)));
    clock.advance(MS(150));
    assert_eq!(bucket.try_acquire_spare(), Err(MS(50)));

    // A worker waiting for a token holds background work off however long it waits.
    bucket.set_waiting(true);
    clock.advance(MS(1000));
    assert!(bucket.congested());
    assert_eq!(bucket.spare(), Err(MS(200)));
    assert_eq!(bucket.try_acquire_spare(), Err(MS(200)));
    bucket.set_waiting(false);
    assert!(!bucket.congested());
    assert_eq!(bucket.spare(), Ok(()), "looking takes no token");

    // Spare tokens come out of the same budget: after two, the worker waits a period.
    assert_eq!(bucket.try_acquire_spare(), Ok(()));
    assert_eq!(bucket.try_acquire_spare(), Ok(()));
    assert_eq!(bucket.try_acquire(), Err(MS(100)));
}

#[tokio::test]
async fn a_request_waiting_in_the_layer_holds_background_work_off_until_served() {
    let bucket = Arc::new(TokenBucket::with_clock(
        limit(1.0, 1),
        TokioClock::default(),
    ));
    let (calls, inner) = counting();
    let mut service = TokenBucketLayer::over(bucket.clone()).layer(inner);
    service.ready().await.unwrap();
    service.call(()).await.unwrap();
    // The second request waits one second for its token.
    let waker = futures::task::noop_waker();
    assert!(
        service
            .poll_ready(&mut Context::from_waker(&waker))
            .is_pending()
    );
    assert!(bucket.try_acquire_spare().is_err(), "a worker is waiting");
    service.ready().await.unwrap();
    service.call(()).await.unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    // Served, and quiet for longer than the quiet time (1 s at QPS 1) plus a refill: background
    // may go.
    tokio::time::sleep(Duration::from_millis(2100)).await;
    assert_eq!(bucket.try_acquire_spare(), Ok(()));
}

/// A service that counts its calls.
fn counting() -> (
    Arc<AtomicUsize>,
    impl Service<(), Response = (), Error = std::convert::Infallible> + Clone,
) {
    let calls = Arc::new(AtomicUsize::new(0));
    let counter = calls.clone();
    let service = tower::service_fn(move |()| {
        counter.fetch_add(1, Ordering::SeqCst);
        async { Ok(()) }
    });
    (calls, service)
}

#[tokio::test]
async fn the_service_passes_the_burst_at_once_then_holds_requests_back() {
    // One token per 1000 s: after the burst, nothing can pass during the test.
    let (calls, inner) = counting();
    let mut service = TokenBucketLayer::new(limit(0.001, 3)).layer(inner);
    let waker = futures::task::noop_waker();
    let mut cx = Context::from_waker(&waker);
    for _ in 0..3 {
        assert!(
            matches!(service.poll_ready(&mut cx), Poll::Ready(Ok(()))),
            "burst tokens are immediate"
        );
        service.call(()).await.unwrap();
    }
    assert!(
        service.poll_ready(&mut cx).is_pending(),
        "the fourth request must wait for a token"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn held_back_requests_proceed_once_their_token_arrives() {
    let (calls, inner) = counting();
    let mut service = TokenBucketLayer::new(limit(50.0, 1)).layer(inner);
    let start = tokio::time::Instant::now();
    let mut admitted = Vec::new();
    for _ in 0..4 {
        let ready = tokio::time::timeout(Duration::from_secs(10), service.ready()).await;
        ready
            .expect("a token arrives within 20ms; 10s means the waker is lost")
            .unwrap();
        admitted.push(start.elapsed());
        service.call(()).await.unwrap();
    }
    assert_eq!(calls.load(Ordering::SeqCst), 4);
    // Lower bounds only (timers never fire early): request k waits for token k at k x 20ms.
    for (k, at) in admitted.iter().enumerate().skip(1) {
        assert!(
            *at >= MS(20) * k as u32 - MS(1),
            "request {k} admitted after {at:?}"
        );
    }
}

/// An API server stand-in that answers `/version` and counts requests.
async fn version_server() -> (String, Arc<AtomicUsize>) {
    let requests = Arc::new(AtomicUsize::new(0));
    let counter = requests.clone();
    let app = axum::Router::new().route(
        "/version",
        axum::routing::get(move || {
            counter.fetch_add(1, Ordering::SeqCst);
            async {
                (
                    [(http::header::CONTENT_TYPE, "application/json")],
                    r#"{"major":"1","minor":"34","gitVersion":"v1.34.0","gitCommit":"","gitTreeState":"",
                        "buildDate":"","goVersion":"","compiler":"","platform":"linux/amd64"}"#,
                )
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (format!("http://{address}"), requests)
}

fn master_only(master: String, rate_limit: Option<RateLimit>) -> KubeOptions {
    KubeOptions {
        kubeconfig: None,
        master: Some(master),
        rate_limit,
    }
}

#[tokio::test]
async fn the_built_client_enforces_qps_and_burst_on_every_request() {
    let (master, requests) = version_server().await;
    let client = build_client(&master_only(master, Some(limit(0.001, 3))))
        .await
        .unwrap();
    let mut pending: FuturesUnordered<_> = (0..5)
        .map(|_| {
            let client = client.clone();
            async move { client.apiserver_version().await }
        })
        .collect();
    for _ in 0..3 {
        let version = tokio::time::timeout(Duration::from_secs(10), pending.next()).await;
        assert_eq!(
            version
                .expect("burst requests complete")
                .unwrap()
                .unwrap()
                .git_version,
            "v1.34.0"
        );
    }
    // The next token is 1000 s away: the remaining two cannot complete, whatever the machine's load.
    assert!(tokio::time::timeout(MS(300), pending.next()).await.is_err());
    assert_eq!(requests.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn a_negative_qps_means_no_client_side_limit() {
    let (master, requests) = version_server().await;
    let client = build_client(&master_only(master, None)).await.unwrap();
    let all = futures::future::join_all((0..20).map(|_| client.apiserver_version()));
    let results = tokio::time::timeout(Duration::from_secs(30), all)
        .await
        .unwrap();
    assert!(results.iter().all(Result::is_ok));
    assert_eq!(requests.load(Ordering::SeqCst), 20);
}

#[tokio::test]
async fn master_without_scheme_is_plain_http() {
    let config = kube_config(&master_only("127.0.0.1:8080".into(), None))
        .await
        .unwrap();
    assert_eq!(config.cluster_url.to_string(), "http://127.0.0.1:8080/");
    let err = kube_config(&master_only("http://bad host".into(), None))
        .await
        .unwrap_err();
    assert!(
        err.to_string()
            .starts_with("--master=\"http://bad host\" is not a valid URL"),
        "{err}"
    );
}

const KUBECONFIG: &str = "apiVersion: v1
kind: Config
clusters:
- name: c
  cluster:
    server: https://10.0.0.1:6443
contexts:
- name: ctx
  context:
    cluster: c
    user: u
current-context: ctx
users:
- name: u
  user: {}
";

#[tokio::test]
async fn kubeconfig_is_used_and_master_overrides_its_server() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kubeconfig");
    std::fs::write(&path, KUBECONFIG).unwrap();
    let mut options = KubeOptions {
        kubeconfig: Some(path),
        master: None,
        rate_limit: None,
    };
    assert_eq!(
        kube_config(&options).await.unwrap().cluster_url.to_string(),
        "https://10.0.0.1:6443/"
    );
    options.master = Some("https://api.example:443".into());
    assert_eq!(
        kube_config(&options).await.unwrap().cluster_url.to_string(),
        "https://api.example:443/"
    );
}

#[tokio::test]
async fn a_missing_kubeconfig_names_the_file() {
    let options = KubeOptions {
        kubeconfig: Some("/nonexistent/kubeconfig".into()),
        master: None,
        rate_limit: None,
    };
    let err = kube_config(&options).await.unwrap_err();
    assert!(
        err.to_string()
            .starts_with("cannot load kubeconfig \"/nonexistent/kubeconfig\""),
        "{err}"
    );
}

#[tokio::test]
async fn outside_a_cluster_without_flags_the_error_says_what_to_set() {
    if std::env::var_os("KUBERNETES_SERVICE_HOST").is_some() {
        eprintln!("skipped: running inside a pod, where the in-cluster configuration may work");
        return;
    }
    let options = KubeOptions {
        kubeconfig: None,
        master: None,
        rate_limit: None,
    };
    let err = kube_config(&options).await.unwrap_err();
    let message = err.to_string();
    assert!(matches!(err, ClientError::NotInCluster { .. }));
    assert!(
        message.contains("--kubeconfig")
            && message.contains("KUBECONFIG")
            && message.contains("--master"),
        "{message}"
    );
}

#[tokio::test]
async fn requests_say_they_come_from_csi_provisioner_in_client_gos_shape() {
    let config = kube_config(&master_only("127.0.0.1:8080".into(), None))
        .await
        .unwrap();
    let agent = config
        .headers
        .iter()
        .find(|(name, _)| name == http::header::USER_AGENT)
        .map(|(_, value)| value.to_str().unwrap().to_owned())
        .expect("a User-Agent header");
    assert!(
        agent.starts_with(&format!(
            "csi-provisioner/{} (linux/",
            env!("CARGO_PKG_VERSION")
        )),
        "{agent}"
    );
}
