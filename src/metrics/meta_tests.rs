use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::{MetaMetrics, Registrar, Stability};
use crate::metrics::exposition::{Format, render};

#[test]
fn registrations_are_counted_by_stability_and_help_carries_the_level() {
    let mut registry = Registry::default();
    let meta = MetaMetrics::register(&mut registry);
    Registrar::new(&mut registry, &meta).register(
        Stability::Alpha,
        "example_gauge",
        "Example.",
        Gauge::<i64>::default(),
    );
    let mut openmetrics = String::new();
    prometheus_client::encoding::text::encode(&mut openmetrics, &registry).unwrap();
    let text = render(&openmetrics, Format::Text);
    for line in [
        "# HELP registered_metrics_total [BETA] The count of registered metrics broken by stability level and deprecation version.",
        "# TYPE registered_metrics_total counter",
        "registered_metrics_total{deprecated_version=\"\",stability_level=\"BETA\"} 3",
        "registered_metrics_total{deprecated_version=\"\",stability_level=\"ALPHA\"} 2",
        "# HELP disabled_metrics_total [BETA] The count of disabled metrics.",
        "hidden_metrics_total 0",
        "cardinality_enforcement_unexpected_categorizations_total 0",
        "# HELP example_gauge [ALPHA] Example.",
    ] {
        assert!(text.lines().any(|l| l == line), "missing {line} in\n{text}");
    }
}
