use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family as MetricFamily;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};

use super::{Format, go_float, render};

#[test]
fn floats_are_written_as_go_writes_them() {
    let mut bound = 10e-9;
    let mut bounds = Vec::new();
    for _ in 0..10 {
        bounds.push(go_float(bound));
        bound *= 10.0;
    }
    // client-go's workqueue buckets, as upstream's scrape shows them.
    assert_eq!(
        bounds,
        [
            "1e-08",
            "1e-07",
            "1e-06",
            "9.999999999999999e-06",
            "9.999999999999999e-05",
            "0.001",
            "0.01",
            "0.1",
            "1",
            "10"
        ]
    );
    for (v, go) in [
        (0.0, "0"),
        (1.0, "1"),
        (-1.0, "-1"),
        (0.005, "0.005"),
        (0.0001, "0.0001"),
        (0.00001, "1e-05"),
        (100_000.0, "100000"),
        (1_000_000.0, "1e+06"),
        (1_712_345_678.0, "1.712345678e+09"),
        (123.456, "123.456"),
        (-2.5e-7, "-2.5e-07"),
        (1.8446744073709552e19, "1.8446744073709552e+19"),
        (1e100, "1e+100"),
        (f64::INFINITY, "+Inf"),
        (f64::NEG_INFINITY, "-Inf"),
        (f64::NAN, "NaN"),
    ] {
        assert_eq!(go_float(v), go, "{v}");
    }
}

#[test]
fn accept_header_picks_openmetrics_only_when_asked_for() {
    let text = Format::Text;
    let om = Format::OpenMetrics;
    for (accept, want) in [
        (None, text),
        (Some(""), text),
        (Some("*/*"), text),
        (Some("text/plain"), text),
        (Some("text/plain;version=0.0.4"), text),
        (Some("application/json"), text),
        (
            Some(
                "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited",
            ),
            text,
        ),
        (Some("application/openmetrics-text"), om),
        (Some("application/openmetrics-text; version=1.0.0"), om),
        // Prometheus 2's and 3's default scrape headers.
        (
            Some(
                "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1",
            ),
            om,
        ),
        (
            Some(
                "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=1.0.0;escaping=allow-utf-8;q=0.5,text/plain;version=0.0.4;q=0.4,*/*;q=0.1",
            ),
            om,
        ),
        (
            Some("text/plain;version=0.0.4,application/openmetrics-text;q=0.5"),
            text,
        ),
        (Some("application/openmetrics-text;q=0"), text),
    ] {
        assert_eq!(Format::negotiate(accept), want, "{accept:?}");
    }
}

fn sample_registry() -> Registry {
    let mut registry = Registry::default();
    let requests: MetricFamily<Vec<(String, String)>, Counter> = MetricFamily::default();
    requests
        .get_or_create(&vec![
            ("zone".to_owned(), "b\"q\\".to_owned()),
            ("code".to_owned(), "200".to_owned()),
        ])
        .inc_by(1_000_000);
    requests
        .get_or_create(&vec![
            ("zone".to_owned(), "a".to_owned()),
            ("code".to_owned(), "500".to_owned()),
        ])
        .inc();
    registry.register("requests", "Requests by code.", requests);
    type Labels = Vec<(String, String)>;
    let latency: MetricFamily<Labels, Histogram, fn() -> Histogram> =
        MetricFamily::new_with_constructor(|| Histogram::new([1e-8, 0.5, 1.0]));
    latency
        .get_or_create(&vec![("name".to_owned(), "claims".to_owned())])
        .observe(0.25);
    registry.register("latency_seconds", "Latency.", latency);
    let depth: Gauge = Gauge::default();
    depth.set(3);
    registry.register("b_depth", "Depth \\ of it", depth);
    let bytes: Counter = Counter::default();
    registry.register_with_unit("read", "Read.", Unit::Bytes, bytes);
    registry
}

fn openmetrics_of(registry: &Registry) -> String {
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, registry).unwrap();
    out
}

#[test]
fn text_format_names_series_like_client_golang() {
    let text = render(&openmetrics_of(&sample_registry()), Format::Text);
    assert_eq!(
        text,
        concat!(
            "# HELP b_depth Depth \\\\ of it\n",
            "# TYPE b_depth gauge\n",
            "b_depth 3\n",
            "# HELP latency_seconds Latency.\n",
            "# TYPE latency_seconds histogram\n",
            "latency_seconds_bucket{name=\"claims\",le=\"1e-08\"} 0\n",
            "latency_seconds_bucket{name=\"claims\",le=\"0.5\"} 1\n",
            "latency_seconds_bucket{name=\"claims\",le=\"1\"} 1\n",
            "latency_seconds_bucket{name=\"claims\",le=\"+Inf\"} 1\n",
            "latency_seconds_sum{name=\"claims\"} 0.25\n",
            "latency_seconds_count{name=\"claims\"} 1\n",
            "# HELP read_bytes_total Read.\n",
            "# TYPE read_bytes_total counter\n",
            "read_bytes_total 0\n",
            "# HELP requests_total Requests by code.\n",
            "# TYPE requests_total counter\n",
            "requests_total{code=\"200\",zone=\"b\\\"q\\\\\"} 1e+06\n",
            "requests_total{code=\"500\",zone=\"a\"} 1\n",
        )
    );
}

#[test]
fn openmetrics_keeps_prometheus_client_lines_sorted_by_family() {
    let openmetrics = openmetrics_of(&sample_registry());
    let sorted = render(&openmetrics, Format::OpenMetrics);
    assert!(sorted.ends_with("# EOF\n"), "{sorted}");
    assert!(sorted.contains("# UNIT read_bytes bytes\n"), "{sorted}");
    let families: Vec<&str> = sorted
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .collect();
    assert_eq!(
        families,
        [
            "b_depth gauge",
            "latency_seconds histogram",
            "read_bytes counter",
            "requests counter"
        ]
    );
    // Same lines, only reordered, and help as registered.
    let openmetrics = openmetrics.replace(".\n", "\n");
    let mut a: Vec<&str> = openmetrics.lines().collect();
    let mut b: Vec<&str> = sorted.lines().collect();
    a.sort_unstable();
    b.sort_unstable();
    assert_eq!(a, b);
}

#[test]
fn a_query_sees_the_same_sample_names_in_both_formats() {
    let openmetrics = render(&openmetrics_of(&sample_registry()), Format::OpenMetrics);
    let text = render(&openmetrics, Format::Text);
    let names = |body: &str| {
        let mut names: Vec<String> = body
            .lines()
            .filter(|l| !l.starts_with('#'))
            .map(|l| l.split(['{', ' ']).next().unwrap().to_owned())
            .collect();
        names.dedup();
        names.sort();
        names
    };
    assert_eq!(names(&openmetrics), names(&text));
    assert!(
        !text.contains("# EOF") && !text.contains("# UNIT"),
        "{text}"
    );
}
