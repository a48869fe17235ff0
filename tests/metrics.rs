//! End to end: the metrics endpoint of a running sidecar on kube-sim serves upstream's families
//! (client-go work queues, process, meta, promhttp, leader election, CSI calls, the provisioner
//! library, capacity) with upstream's types and label names, in Prometheus text 0.0.4 by default
//! and in OpenMetrics when asked, and a query sees the same names in both.
//!
//! With `UPSTREAM_PROVISIONER=/path/to/csi-provisioner`, the same expectations are checked on the
//! upstream binary too, and that it answers text 0.0.4 even to Prometheus's OpenMetrics header.

mod common;

use std::collections::BTreeMap;
use std::path::Path;

use common::exposition::{Family, PROMETHEUS_ACCEPT, families, sample_names, scrape};
use common::{Cluster, DEADLINE, Driver, Sidecar, wait_for};

const TEXT: &str = "text/plain; version=0.0.4; charset=utf-8; escaping=underscores";

/// (family as a query names it, type, label names): what upstream v6.3 serves after the scenario
/// of [`exercise`] (docs/observability.md lists them).
const UPSTREAM_FAMILIES: &[(&str, &str, &[&str])] = &[
    ("workqueue_depth", "gauge", &["name"]),
    ("workqueue_adds_total", "counter", &["name"]),
    ("workqueue_queue_duration_seconds", "histogram", &["name"]),
    ("workqueue_work_duration_seconds", "histogram", &["name"]),
    ("workqueue_unfinished_work_seconds", "gauge", &["name"]),
    (
        "workqueue_longest_running_processor_seconds",
        "gauge",
        &["name"],
    ),
    ("workqueue_retries_total", "counter", &["name"]),
    ("process_cpu_seconds_total", "counter", &[]),
    ("process_resident_memory_bytes", "gauge", &[]),
    ("process_virtual_memory_bytes", "gauge", &[]),
    ("process_virtual_memory_max_bytes", "gauge", &[]),
    ("process_open_fds", "gauge", &[]),
    ("process_max_fds", "gauge", &[]),
    ("process_start_time_seconds", "gauge", &[]),
    ("process_network_receive_bytes_total", "counter", &[]),
    ("process_network_transmit_bytes_total", "counter", &[]),
    (
        "registered_metrics_total",
        "counter",
        &["deprecated_version", "stability_level"],
    ),
    ("disabled_metrics_total", "counter", &[]),
    ("hidden_metrics_total", "counter", &[]),
    (
        "cardinality_enforcement_unexpected_categorizations_total",
        "counter",
        &[],
    ),
    (
        "promhttp_metric_handler_requests_total",
        "counter",
        &["code"],
    ),
    ("promhttp_metric_handler_requests_in_flight", "gauge", &[]),
    ("leader_election_master_status", "gauge", &["name"]),
    (
        "csi_sidecar_operations_seconds",
        "histogram",
        &["driver_name", "grpc_status_code", "method_name"],
    ),
    (
        "controller_persistentvolumeclaim_provision_total",
        "counter",
        &["class", "source"],
    ),
    (
        "controller_persistentvolumeclaim_provision_duration_seconds",
        "histogram",
        &["class", "source"],
    ),
    (
        "controller_persistentvolume_delete_total",
        "counter",
        &["class"],
    ),
    (
        "controller_persistentvolume_delete_duration_seconds",
        "histogram",
        &["class"],
    ),
    ("csistoragecapacities_desired_goal", "gauge", &[]),
    ("csistoragecapacities_desired_current", "gauge", &[]),
    ("csistoragecapacities_obsolete", "gauge", &[]),
];

/// The queue names of a controller-mode sidecar with `--enable-capacity` that we serve.
/// (Upstream also has `unsavedpvs` and `csitopology`: docs/observability.md says why we do not.)
const QUEUES: &[&str] = &["claims", "volumes", "csistoragecapacity"];

fn free_address() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    listener.local_addr().expect("local address").to_string()
}

fn flags(address: &str) -> Vec<String> {
    [
        format!("--http-endpoint={address}"),
        "--enable-capacity".into(),
        "--capacity-ownerref-level=-1".into(),
        "--capacity-poll-interval=1s".into(),
        "--leader-election".into(),
        "--leader-election-namespace=default".into(),
    ]
    .into()
}

/// Starts `bin` with every optional family switched on, provisions and deletes one volume, and
/// returns the sidecar (kept running) and its metrics address.
async fn exercise(cluster: &Cluster, driver: &Driver, bin: &Path, name: &str) -> (Sidecar, String) {
    let address = free_address();
    let flags = flags(&address);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let sidecar = Sidecar::start_bin(
        cluster,
        driver,
        bin,
        name,
        &flags,
        &[("NAMESPACE", "default")],
    )
    .await;
    cluster.claim_with_fast_class("default", "c1").await;
    let pv = cluster.wait_bound("default", "c1").await;
    cluster.delete_pvc_and_wait("default", "c1").await;
    cluster
        .wait_pv_gone(pv.metadata.name.as_deref().unwrap_or_default())
        .await;
    // The delete counter is written after the PV is gone; wait for it rather than race it.
    wait_for(&format!("{name}'s delete metrics"), DEADLINE, || async {
        let (_, body) = scrape(&address, "/metrics", None).await?;
        families(&body)
            .contains_key("controller_persistentvolume_delete_total")
            .then_some(())
    })
    .await;
    (sidecar, address)
}

fn expected() -> BTreeMap<&'static str, Family> {
    UPSTREAM_FAMILIES
        .iter()
        .map(|(name, kind, labels)| {
            (
                *name,
                Family {
                    kind: (*kind).to_owned(),
                    labels: labels.iter().map(|l| (*l).to_owned()).collect(),
                },
            )
        })
        .collect()
}

/// Every expected family, with its type and label names, and a series for each queue name.
fn check_families(who: &str, body: &str) -> Vec<String> {
    let served = families(body);
    let mut problems = Vec::new();
    for (name, want) in expected() {
        match served.get(name) {
            Some(got) if *got == want => {}
            got => problems.push(format!("{who}: {name}: want {want:?}, served {got:?}")),
        }
    }
    for family in UPSTREAM_FAMILIES
        .iter()
        .filter(|(name, _, _)| name.starts_with("workqueue_"))
    {
        let sample = match family.1 {
            "histogram" => format!("{}_count", family.0),
            _ => family.0.to_owned(),
        };
        for queue in QUEUES {
            let series = format!("{sample}{{name=\"{queue}\"}} ");
            if !body.lines().any(|l| l.starts_with(&series)) {
                problems.push(format!("{who}: no series {series}"));
            }
        }
    }
    problems
}

/// `name{labels}` of an unlabelled or single-series sample, as a number.
fn value(body: &str, series: &str) -> Option<f64> {
    body.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_upstream_family_is_served_with_its_type_and_label_names_in_both_formats() {
    let cluster = Cluster::start().await;
    let driver = Driver::start(cluster.dir.path(), "node-1", &[]).await;
    let ours = Path::new(env!("CARGO_BIN_EXE_csi-provisioner"));
    let (_sidecar, address) = exercise(&cluster, &driver, ours, "ours").await;

    let (content_type, text) = scrape(&address, "/metrics", None).await.expect("scrape");
    assert_eq!(content_type, TEXT);
    let (om_type, openmetrics) = scrape(&address, "/metrics", Some(PROMETHEUS_ACCEPT))
        .await
        .expect("scrape with Prometheus's Accept header");
    assert!(
        om_type.starts_with("application/openmetrics-text; version=1.0.0"),
        "{om_type}"
    );
    let (_, star) = scrape(&address, "/metrics", Some("*/*"))
        .await
        .expect("scrape");
    assert!(!star.contains("# EOF"), "*/* gets text");

    let mut problems = check_families("text", &text);
    problems.extend(check_families("openmetrics", &openmetrics));
    assert!(problems.is_empty(), "{}\n\n{text}", problems.join("\n"));

    // A query sees the same families and sample names whichever format was negotiated.
    assert_eq!(families(&text), families(&openmetrics));
    assert_eq!(sample_names(&text), sample_names(&openmetrics));
    assert!(!text.contains("# EOF") && !text.contains("_created"));
    assert!(openmetrics.ends_with("# EOF\n"));

    // What an operator reads: the claim and the PV went through their queues, this replica leads,
    // and the scrape counter counts scrapes.
    assert!(value(&text, r#"workqueue_adds_total{name="claims"}"#) >= Some(1.0));
    assert!(value(&text, r#"workqueue_adds_total{name="volumes"}"#) >= Some(1.0));
    assert!(
        value(
            &text,
            r#"workqueue_work_duration_seconds_count{name="claims"}"#
        ) >= Some(1.0)
    );
    assert_eq!(
        value(&text, r#"leader_election_master_status{name=""}"#),
        Some(1.0)
    );
    assert!(
        value(
            &text,
            r#"promhttp_metric_handler_requests_total{code="200"}"#
        ) >= Some(1.0),
        "{text}"
    );
    assert!(text.contains(
        "workqueue_queue_duration_seconds_bucket{name=\"claims\",le=\"9.999999999999999e-06\"} "
    ));
    let names: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .collect();
    let mut sorted = names.clone();
    sorted.sort_unstable();
    assert_eq!(names, sorted, "families are sorted by name, as upstream's");
}

/// Runs only with `UPSTREAM_PROVISIONER`: the expectations above hold for upstream itself, and
/// upstream answers text 0.0.4 to Prometheus's OpenMetrics-first header (docs/compatibility.md).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_serves_the_same_families_and_never_openmetrics() {
    let Some(bin) = std::env::var_os("UPSTREAM_PROVISIONER") else {
        eprintln!("UPSTREAM_PROVISIONER is not set: nothing to compare with");
        return;
    };
    let cluster = Cluster::start().await;
    let driver = Driver::start(cluster.dir.path(), "node-1", &[]).await;
    let (_sidecar, address) = exercise(&cluster, &driver, Path::new(&bin), "upstream").await;
    let (content_type, text) = scrape(&address, "/metrics", Some(PROMETHEUS_ACCEPT))
        .await
        .expect("scrape upstream");
    assert_eq!(content_type, TEXT, "upstream never negotiates OpenMetrics");
    let problems = check_families("upstream", &text)
        .into_iter()
        // Queues we name differently are listed in docs/observability.md.
        .filter(|p| !p.contains("no series"))
        .collect::<Vec<_>>();
    assert!(problems.is_empty(), "{}\n\n{text}", problems.join("\n"));
    for queue in [
        "claims",
        "volumes",
        "unsavedpvs",
        "csitopology",
        "csistoragecapacity",
    ] {
        assert!(
            text.contains(&format!("workqueue_depth{{name=\"{queue}\"}}")),
            "upstream queue {queue}:\n{text}"
        );
    }
}
