//! Tests of `metrics.rs`: the exposed names, labels, buckets and always-present families.

use super::*;

fn sample_lines(text: &str) -> Vec<&str> {
    text.lines().filter(|line| !line.starts_with('#')).collect()
}

#[test]
fn families_are_exposed_with_upstream_names_and_labels() {
    let metrics = Metrics::new();
    metrics
        .provision
        .succeeded("fast", "", Duration::from_millis(300));
    metrics.provision.failed("fast", "VolumeSnapshot");
    metrics.delete.succeeded("slow", Duration::from_secs(2));
    metrics.delete.failed("slow");
    let text = metrics.encode(Format::Text).unwrap();
    let samples = sample_lines(&text);
    for expected in [
        r#"controller_persistentvolumeclaim_provision_total{class="fast",source=""} 1"#,
        r#"controller_persistentvolumeclaim_provision_failed_total{class="fast",source="VolumeSnapshot"} 1"#,
        r#"controller_persistentvolumeclaim_provision_duration_seconds_count{class="fast",source=""} 1"#,
        r#"controller_persistentvolumeclaim_provision_duration_seconds_sum{class="fast",source=""} 0.3"#,
        r#"controller_persistentvolume_delete_total{class="slow"} 1"#,
        r#"controller_persistentvolume_delete_failed_total{class="slow"} 1"#,
        r#"controller_persistentvolume_delete_duration_seconds_count{class="slow"} 1"#,
    ] {
        assert!(
            samples.contains(&expected),
            "missing {expected} in:\n{text}"
        );
    }
    assert!(!text.contains("_total_total"), "{text}");
    assert!(
        text.contains(
            "# TYPE controller_persistentvolumeclaim_provision_duration_seconds histogram"
        )
    );
    assert!(!text.contains("# EOF"), "text 0.0.4 has no EOF marker");
    assert!(
        metrics
            .encode(Format::OpenMetrics)
            .unwrap()
            .ends_with("# EOF\n")
    );
}

#[test]
fn duration_histograms_use_prometheus_default_buckets() {
    let metrics = Metrics::new();
    metrics.delete.succeeded("c", Duration::from_millis(30));
    let text = metrics.encode(Format::Text).unwrap();
    let buckets: Vec<&str> = sample_lines(&text)
        .into_iter()
        .filter(|line| {
            line.starts_with("controller_persistentvolume_delete_duration_seconds_bucket")
        })
        .collect();
    let expected = [
        ("0.005", 0),
        ("0.01", 0),
        ("0.025", 0),
        ("0.05", 1),
        ("0.1", 1),
        ("0.25", 1),
        ("0.5", 1),
        ("1", 1),
        ("2.5", 1),
        ("5", 1),
        ("10", 1),
        ("+Inf", 1),
    ];
    assert_eq!(buckets.len(), expected.len(), "{text}");
    for (line, (le, count)) in buckets.iter().zip(expected) {
        assert_eq!(
            *line,
            format!(
                r#"controller_persistentvolume_delete_duration_seconds_bucket{{class="c",le="{le}"}} {count}"#
            )
        );
    }
}

#[test]
fn other_modules_can_register_families() {
    let mut metrics = Metrics::new();
    let counter: Counter = Counter::default();
    metrics
        .registry_mut()
        .register("csi_sidecar_example", "Example.", counter.clone());
    counter.inc();
    assert!(
        sample_lines(&metrics.encode(Format::Text).unwrap())
            .contains(&"csi_sidecar_example_total 1")
    );
}

#[test]
fn families_without_observations_are_omitted_as_client_golang_does_and_backlog_gauges_read_zero() {
    let text = Metrics::new().encode(Format::Text).unwrap();
    // Upstream's labelled families appear only once observed; our unlabelled gauges, counter
    // and the latency histogram always answer, so an alert on them works from the first
    // scrape.
    let lines = sample_lines(&text);
    let ours: Vec<&str> = lines
        .iter()
        .copied()
        .filter(|l| {
            l.starts_with("csi_provisioner_")
                && !l.starts_with("csi_provisioner_claim_to_bound_seconds")
        })
        .collect();
    assert_eq!(
        ours,
        [
            "csi_provisioner_claims_pending 0",
            "csi_provisioner_claims_with_intent 0",
            "csi_provisioner_intent_volumes_kept_total 0",
            "csi_provisioner_rbac_missing_permissions 0",
            "csi_provisioner_volumes_awaiting_deletion 0",
        ]
    );
    assert!(
        !text.contains("controller_persistentvolume"),
        "labelled families appear once observed"
    );
    assert!(lines.contains(&"csi_provisioner_claim_to_bound_seconds_count 0"));
}

#[test]
fn scrapes_are_counted_after_they_are_served_as_promhttp_counts_them() {
    let metrics = Metrics::new();
    let first = metrics.scrape(Format::Text).unwrap();
    for line in [
        r#"promhttp_metric_handler_requests_total{code="200"} 0"#,
        r#"promhttp_metric_handler_requests_total{code="500"} 0"#,
        r#"promhttp_metric_handler_requests_total{code="503"} 0"#,
        "promhttp_metric_handler_requests_in_flight 1",
    ] {
        assert!(sample_lines(&first).contains(&line), "{line} in\n{first}");
    }
    let second = metrics.scrape(Format::Text).unwrap();
    assert!(
        sample_lines(&second).contains(&r#"promhttp_metric_handler_requests_total{code="200"} 1"#)
    );
}

#[test]
fn every_scrape_has_the_meta_and_process_families() {
    let mut metrics = Metrics::new();
    // The work queues register their families as the app does (`runtime::queue`).
    crate::runtime::queue::WorkQueueMetrics::register(&mut metrics.registrar());
    metrics.count_registered(Stability::Alpha, 1);
    let text = metrics.encode(Format::Text).unwrap();
    let lines = sample_lines(&text);
    // 3 meta + 7 work-queue families are BETA; the cardinality counter and the one counted
    // above are ALPHA.
    for line in [
        r#"registered_metrics_total{deprecated_version="",stability_level="ALPHA"} 2"#,
        r#"registered_metrics_total{deprecated_version="",stability_level="BETA"} 10"#,
        "disabled_metrics_total 0",
    ] {
        assert!(lines.contains(&line), "{line} in\n{text}");
    }
    #[cfg(target_os = "linux")]
    for family in [
        "process_cpu_seconds_total counter",
        "process_resident_memory_bytes gauge",
        "process_virtual_memory_bytes gauge",
        "process_virtual_memory_max_bytes gauge",
        "process_open_fds gauge",
        "process_max_fds gauge",
        "process_start_time_seconds gauge",
    ] {
        assert!(
            text.contains(&format!("# TYPE {family}\n")),
            "{family} in\n{text}"
        );
    }
    let names: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .collect();
    let mut sorted = names.clone();
    sorted.sort_unstable();
    assert_eq!(names, sorted, "families sorted by name");
}
