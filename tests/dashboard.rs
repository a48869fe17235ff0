//! The shipped Grafana dashboard and Prometheus alert rules (`deploy/monitoring/`) query only what
//! the sidecar serves: every metric name and label name in their PromQL is checked against a live
//! scrape of a sidecar on kube-sim that provisioned and deleted a volume. A renamed metric or label
//! fails here instead of leaving an empty panel or an alert that never fires.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use common::exposition::{families, scrape};
use common::{Cluster, DEADLINE, Driver, Sidecar, wait_for};

/// Labels Prometheus adds to every scraped series (target labels), not served by the sidecar.
const TARGET_LABELS: &[&str] = &["job", "instance"];

/// PromQL aggregation operators: never metric names, whether `(` or `by` follows.
const AGGREGATIONS: &[&str] = &[
    "sum",
    "min",
    "max",
    "avg",
    "group",
    "stddev",
    "stdvar",
    "count",
    "count_values",
    "bottomk",
    "topk",
    "quantile",
    "limitk",
    "limit_ratio",
];
/// Keywords followed by a list of label names.
const GROUPING: &[&str] = &[
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
];
/// Other keywords.
const KEYWORDS: &[&str] = &[
    "and", "or", "unless", "bool", "offset", "atan2", "inf", "nan",
];

/// What one PromQL expression refers to.
#[derive(Debug, Default, PartialEq)]
struct Uses {
    metrics: Vec<String>,
    /// (metric, label) of each label matcher.
    matchers: Vec<(String, String)>,
    /// Labels of `by`/`without`/`on`/`ignoring`/`group_*` lists.
    grouping: Vec<String>,
}

fn is_ident_start(c: char) -> bool {
    c.is_ascii_alphabetic() || c == '_' || c == ':'
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == ':'
}

/// A small PromQL tokenizer: enough to find metric names, matcher labels and grouping labels.
fn uses(expr: &str) -> Uses {
    let chars: Vec<char> = expr.chars().collect();
    let mut out = Uses::default();
    let mut last_metric: Option<String> = None;
    let mut i = 0;
    let skip_string = |mut i: usize, quote: char| {
        i += 1;
        while i < chars.len() && chars[i] != quote {
            if chars[i] == '\\' {
                i += 1;
            }
            i += 1;
        }
        i + 1
    };
    let next_non_space = |mut i: usize| {
        while i < chars.len() && chars[i].is_whitespace() {
            i += 1;
        }
        i
    };
    while i < chars.len() {
        let c = chars[i];
        if c == '"' || c == '\'' || c == '`' {
            i = skip_string(i, c);
        } else if c == '[' {
            // A range or subquery: durations and Grafana variables only.
            while i < chars.len() && chars[i] != ']' {
                i += 1;
            }
            i += 1;
        } else if c == '{' {
            i += 1;
            loop {
                i = next_non_space(i);
                if i >= chars.len() || chars[i] == '}' {
                    i += 1;
                    break;
                }
                if chars[i] == ',' {
                    i += 1;
                    continue;
                }
                let start = i;
                while i < chars.len() && is_ident(chars[i]) {
                    i += 1;
                }
                let label: String = chars[start..i].iter().collect();
                out.matchers
                    .push((last_metric.clone().unwrap_or_default(), label));
                while i < chars.len() && !matches!(chars[i], '"' | '\'' | '`') {
                    i += 1;
                }
                if i < chars.len() {
                    i = skip_string(i, chars[i]);
                }
            }
            last_metric = None;
        } else if c == '$' || c.is_ascii_digit() || c == '.' {
            // A Grafana variable, a number or a duration.
            i += 1;
            while i < chars.len() && (is_ident(chars[i]) || chars[i] == '.') {
                i += 1;
            }
        } else if is_ident_start(c) {
            let start = i;
            while i < chars.len() && is_ident(chars[i]) {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            let after = next_non_space(i);
            let call = after < chars.len() && chars[after] == '(';
            if GROUPING.contains(&word.as_str()) {
                if call {
                    let end = chars[after..]
                        .iter()
                        .position(|c| *c == ')')
                        .map_or(chars.len(), |p| after + p);
                    let list: String = chars[after + 1..end].iter().collect();
                    out.grouping.extend(
                        list.split(',')
                            .map(str::trim)
                            .filter(|l| !l.is_empty())
                            .map(str::to_owned),
                    );
                    i = end + 1;
                }
            } else if call
                || AGGREGATIONS.contains(&word.as_str())
                || KEYWORDS.contains(&word.to_ascii_lowercase().as_str())
            {
                // A function or an operator.
            } else {
                out.metrics.push(word.clone());
                last_metric = Some(word);
            }
        } else {
            i += 1;
        }
    }
    out
}

/// Every PromQL expression of the dashboard (panel targets and the templating queries).
fn dashboard_exprs() -> Vec<String> {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/monitoring/grafana-dashboard.json");
    let dashboard: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).expect("read the dashboard"))
            .expect("the dashboard is JSON");
    let mut exprs = Vec::new();
    for panel in dashboard["panels"].as_array().expect("panels") {
        for target in panel["targets"].as_array().expect("targets") {
            exprs.push(target["expr"].as_str().expect("expr").to_owned());
        }
    }
    for variable in dashboard["templating"]["list"]
        .as_array()
        .expect("templating")
    {
        // `label_values(metric, label)`: a metric and a label as PromQL sees them.
        if let Some(query) = variable["query"]["query"].as_str()
            && let Some(args) = query
                .strip_prefix("label_values(")
                .and_then(|q| q.strip_suffix(')'))
        {
            let (metric, label) = args.split_once(',').expect("label_values(metric, label)");
            exprs.push(format!("max by ({}) ({})", label.trim(), metric.trim()));
        }
    }
    exprs
}

/// Every alert and recording rule expression of the rules file.
fn rule_exprs() -> Vec<String> {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/monitoring/prometheus-rules.yaml");
    let rules: serde_json::Value =
        serde_saphyr::from_str(&std::fs::read_to_string(path).expect("read the rules"))
            .expect("the rules are YAML");
    let mut exprs = Vec::new();
    for group in rules["groups"].as_array().expect("groups") {
        for rule in group["rules"].as_array().expect("rules") {
            exprs.push(rule["expr"].as_str().expect("expr").to_owned());
        }
    }
    exprs
}

/// Served sample names (`x_bucket`, `x_total`, ...) with the label names a query may use on them.
fn served(body: &str) -> BTreeMap<String, BTreeSet<String>> {
    let mut out = BTreeMap::new();
    for (name, family) in families(body) {
        let suffixes: &[&str] = match family.kind.as_str() {
            "histogram" => &["_bucket", "_sum", "_count"],
            "summary" => &["", "_sum", "_count"],
            _ => &[""],
        };
        for suffix in suffixes {
            let mut labels = family.labels.clone();
            if *suffix == "_bucket" {
                labels.insert("le".into());
            }
            out.insert(format!("{name}{suffix}"), labels);
        }
    }
    out
}

/// What `exprs` use that `served` lacks, one line each.
fn unserved(exprs: &[String], served: &BTreeMap<String, BTreeSet<String>>) -> Vec<String> {
    let mut problems = Vec::new();
    for expr in exprs {
        let used = uses(expr);
        assert!(!used.metrics.is_empty(), "no metric found in {expr}");
        let mut labels_in_scope: BTreeSet<String> =
            TARGET_LABELS.iter().map(|l| (*l).to_owned()).collect();
        for metric in &used.metrics {
            match served.get(metric) {
                Some(labels) => labels_in_scope.extend(labels.iter().cloned()),
                None => problems.push(format!("metric {metric} is not served: {expr}")),
            }
        }
        for (metric, label) in &used.matchers {
            let known = served.get(metric).is_some_and(|l| l.contains(label))
                || TARGET_LABELS.contains(&label.as_str());
            if !known {
                problems.push(format!("{metric} has no label {label}: {expr}"));
            }
        }
        for label in &used.grouping {
            if !labels_in_scope.contains(label) {
                problems.push(format!(
                    "no metric of the expression has label {label}: {expr}"
                ));
            }
        }
    }
    problems
}

#[test]
fn the_tokenizer_finds_metrics_and_labels() {
    assert_eq!(
        uses(
            r#"histogram_quantile(0.95, sum by (le, method_name) (rate(csi_sidecar_operations_seconds_bucket{job=~"$job",grpc_status_code!="OK"}[$__rate_interval]))) > 0.5"#
        ),
        Uses {
            metrics: vec!["csi_sidecar_operations_seconds_bucket".into()],
            matchers: vec![
                ("csi_sidecar_operations_seconds_bucket".into(), "job".into()),
                (
                    "csi_sidecar_operations_seconds_bucket".into(),
                    "grpc_status_code".into()
                ),
            ],
            grouping: vec!["le".into(), "method_name".into()],
        }
    );
    let subquery =
        uses("min_over_time(max by (job) (a_gauge)[1h:5m]) > 0 and on (job) b_total offset 5m");
    assert_eq!(subquery.metrics, ["a_gauge", "b_total"]);
    assert_eq!(subquery.grouping, ["job", "job"]);
    // The check fails on what is not served.
    let served = BTreeMap::from([(
        "workqueue_depth".to_owned(),
        BTreeSet::from(["name".to_owned()]),
    )]);
    let problems = unserved(
        &[
            "max by (queue) (workqueue_depth)".into(),
            r#"workqueue_depth{queue="claims"} + workqueue_missing"#.into(),
            "max by (job, name) (workqueue_depth)".into(),
        ],
        &served,
    );
    assert_eq!(problems.len(), 3, "{problems:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dashboard_and_alert_rules_use_only_served_metrics_and_labels() {
    let exprs: Vec<String> = dashboard_exprs().into_iter().chain(rule_exprs()).collect();
    assert!(exprs.len() >= 30, "{} expressions", exprs.len());

    let cluster = Cluster::start().await;
    let driver = Driver::start(cluster.dir.path(), "node-1", &[]).await;
    let sidecar = Sidecar::start_env(
        &cluster,
        &driver,
        &[
            "--http-endpoint=127.0.0.1:0",
            "--leader-election",
            "--leader-election-namespace=default",
            // The capacity lag alert's gauges are served only with capacity tracking.
            "--enable-capacity",
            "--capacity-ownerref-level=-1",
        ],
        &[("NAMESPACE", "default")],
    )
    .await;
    let address = sidecar.http_addr().await;
    // Labelled families appear once used: provision and delete one volume.
    cluster.claim_with_fast_class("default", "c1").await;
    let pv = cluster.wait_bound("default", "c1").await;
    cluster.delete_pvc_and_wait("default", "c1").await;
    cluster
        .wait_pv_gone(pv.metadata.name.as_deref().unwrap_or_default())
        .await;
    let body = wait_for("the delete counter", DEADLINE, || async {
        let (_, body) = scrape(&address, "/metrics", None).await?;
        body.contains("controller_persistentvolume_delete_total{")
            .then_some(body)
    })
    .await;

    let problems = unserved(&exprs, &served(&body));
    assert!(
        problems.is_empty(),
        "the dashboard or the rules query what the sidecar does not serve:\n{}\n\nserved:\n{body}",
        problems.join("\n")
    );
}
