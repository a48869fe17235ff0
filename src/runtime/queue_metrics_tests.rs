use std::time::Duration;

use super::*;
use crate::metrics::exposition::{Format, render};
use crate::metrics::meta::MetaMetrics;
use prometheus_client::registry::Registry;

fn scrape(registry: &Registry) -> String {
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, registry).unwrap();
    render(&out, Format::Text)
}

fn setup() -> (Registry, WorkQueueMetrics) {
    let mut registry = Registry::default();
    let meta = MetaMetrics::default();
    let queues = WorkQueueMetrics::register(&mut Registrar::new(&mut registry, &meta));
    (registry, queues)
}

#[test]
fn every_series_of_a_queue_exists_at_zero_once_the_queue_is_built() {
    let (registry, queues) = setup();
    assert!(
        !scrape(&registry).contains("name=\"claims\""),
        "no queue, no series"
    );
    let _claims = queues.queue("claims");
    let text = scrape(&registry);
    for line in [
        "# HELP workqueue_depth [BETA] Current depth of workqueue",
        "# TYPE workqueue_depth gauge",
        "workqueue_depth{name=\"claims\"} 0",
        "# TYPE workqueue_adds_total counter",
        "workqueue_adds_total{name=\"claims\"} 0",
        "# TYPE workqueue_retries_total counter",
        "workqueue_retries_total{name=\"claims\"} 0",
        "# TYPE workqueue_queue_duration_seconds histogram",
        "workqueue_queue_duration_seconds_bucket{name=\"claims\",le=\"1e-08\"} 0",
        "workqueue_queue_duration_seconds_bucket{name=\"claims\",le=\"9.999999999999999e-06\"} 0",
        "workqueue_queue_duration_seconds_bucket{name=\"claims\",le=\"10\"} 0",
        "workqueue_queue_duration_seconds_bucket{name=\"claims\",le=\"+Inf\"} 0",
        "workqueue_work_duration_seconds_count{name=\"claims\"} 0",
        "# TYPE workqueue_unfinished_work_seconds gauge",
        "workqueue_unfinished_work_seconds{name=\"claims\"} 0",
        "# HELP workqueue_longest_running_processor_seconds [BETA] How many seconds has the longest running processor for workqueue been running.",
        "workqueue_longest_running_processor_seconds{name=\"claims\"} 0",
    ] {
        assert!(text.lines().any(|l| l == line), "missing {line} in\n{text}");
    }
    let buckets = text
        .lines()
        .filter(|l| l.starts_with("workqueue_work_duration_seconds_bucket"))
        .count();
    assert_eq!(buckets, 11, "ten bounds and +Inf");
}

#[test]
fn adds_depth_latency_and_runs_are_counted_like_client_go() {
    let (registry, queues) = setup();
    let claims = queues.queue("claims");
    let added = std::time::Instant::now();
    claims.added();
    claims.added();
    assert_eq!(claims.depth(), 2);
    claims.taken(added);
    let run = claims.started();
    std::thread::sleep(Duration::from_millis(20));
    let text = scrape(&registry);
    let value = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{name}{{name=\"claims\"}} ")))
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or_else(|| panic!("{name} in\n{text}"))
    };
    assert_eq!(value("workqueue_adds_total"), 2.0);
    assert_eq!(value("workqueue_depth"), 1.0);
    assert_eq!(value("workqueue_queue_duration_seconds_count"), 1.0);
    assert!(value("workqueue_unfinished_work_seconds") >= 0.02, "{text}");
    assert!(value("workqueue_longest_running_processor_seconds") >= 0.02);
    claims.finished(run);
    claims.retried();
    let text = scrape(&registry);
    assert!(text.contains("workqueue_work_duration_seconds_count{name=\"claims\"} 1\n"));
    assert!(text.contains("workqueue_unfinished_work_seconds{name=\"claims\"} 0\n"));
    assert!(text.contains("workqueue_retries_total{name=\"claims\"} 1\n"));
}

#[test]
fn queues_of_one_name_share_their_series() {
    let (registry, queues) = setup();
    queues.queue("volumes").added();
    queues.queue("volumes").added();
    let text = scrape(&registry);
    assert!(
        text.contains("workqueue_adds_total{name=\"volumes\"} 2\n"),
        "{text}"
    );
    assert_eq!(text.matches("workqueue_depth{").count(), 1);
}
