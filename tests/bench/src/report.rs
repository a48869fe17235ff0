//! Results of the scenarios, side by side per binary, as Markdown and JSON.

use std::collections::BTreeSet;
use std::fmt::Write as _;

use serde::Serialize;

use crate::cluster::Requests;

/// One measured figure of one run.
#[derive(Debug, Clone, Serialize)]
pub struct Metric {
    pub key: String,
    pub label: String,
    pub value: Option<f64>,
    /// Shown instead of a value that was not reached (e.g. "not within the run: 800 of 4000").
    #[serde(skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
}

/// Requests the provisioner made in one phase, and what to divide them by in the table.
#[derive(Debug, Clone, Serialize)]
pub struct Phase {
    pub name: String,
    /// e.g. "per provisioned volume"; the table shows count / divisor.
    pub per: String,
    pub divisor: f64,
    pub requests: Vec<RequestRow>,
}

#[derive(Debug, Clone, Serialize)]
pub struct RequestRow {
    pub verb: String,
    pub resource: String,
    pub count: u64,
}

impl Phase {
    pub fn new(name: &str, per: &str, divisor: f64, r: &Requests) -> Self {
        Self {
            name: name.into(),
            per: per.into(),
            divisor,
            requests: r
                .0
                .iter()
                .map(|((verb, resource), count)| RequestRow {
                    verb: verb.clone(),
                    resource: resource.clone(),
                    count: *count,
                })
                .collect(),
        }
    }
    fn count(&self, verb: &str, resource: &str) -> Option<u64> {
        self.requests
            .iter()
            .find(|r| r.verb == verb && r.resource == resource)
            .map(|r| r.count)
    }
}

/// One binary in one scenario.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Run {
    pub binary: String,
    pub metrics: Vec<Metric>,
    pub phases: Vec<Phase>,
    /// Correctness failures (leaked or doubled volumes, claims never bound, crashes).
    pub failures: Vec<String>,
    /// Figures sampled over the run (the capacity scenario), one JSON object per sample.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub samples: Vec<serde_json::Value>,
}

impl Run {
    pub fn metric(&mut self, key: &str, label: &str, value: f64) {
        self.metrics.push(Metric {
            key: key.into(),
            label: label.into(),
            value: value.is_finite().then_some(value),
            text: None,
        });
    }
    /// A figure given as text, for what a number cannot say.
    pub fn metric_text(&mut self, key: &str, label: &str, text: impl Into<String>) {
        self.metrics.push(Metric {
            key: key.into(),
            label: label.into(),
            value: None,
            text: Some(text.into()),
        });
    }
    pub fn fail(&mut self, what: impl Into<String>) {
        let what = what.into();
        eprintln!("bench: FAILURE ({}): {what}", self.binary);
        self.failures.push(what);
    }
}

/// One scenario at one QPS setting, with a run per binary.
#[derive(Debug, Clone, Serialize)]
pub struct Scenario {
    pub scenario: String,
    pub title: String,
    pub qps: String,
    pub runs: Vec<Run>,
    /// Set when the scenario ran in several rounds (`--rounds`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub round: Option<Round>,
}

/// Which round of a scenario run in rounds, and which binary ran first in it.
#[derive(Debug, Clone, Serialize)]
pub struct Round {
    pub number: usize,
    pub of: usize,
    pub first: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct Binary {
    pub label: String,
    pub path: String,
    pub version: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub command: String,
    pub date: String,
    pub cores: usize,
    pub load_average_start: String,
    pub load_average_end: String,
    pub binaries: Vec<Binary>,
    pub scenarios: Vec<Scenario>,
    pub notes: Vec<String>,
}

impl Report {
    pub fn failures(&self) -> Vec<String> {
        self.scenarios
            .iter()
            .flat_map(|s| {
                s.runs.iter().flat_map(move |r| {
                    r.failures
                        .iter()
                        .map(move |f| format!("{} [{}] {}: {f}", s.title, s.qps, r.binary))
                })
            })
            .collect()
    }

    pub fn markdown(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "# csi-provisioner benchmark\n");
        let _ = writeln!(out, "- command: `{}`", self.command);
        let _ = writeln!(
            out,
            "- date: {}; {} cores; load average at start {}, at end {}",
            self.date, self.cores, self.load_average_start, self.load_average_end
        );
        for b in &self.binaries {
            let _ = writeln!(out, "- {}: `{}` ({})", b.label, b.path, b.version);
        }
        for n in &self.notes {
            let _ = writeln!(out, "- {n}");
        }
        let failures = self.failures();
        let _ = writeln!(
            out,
            "- correctness: {}",
            if failures.is_empty() {
                "no leaked or doubled volume, every claim bound".to_string()
            } else {
                format!("{} FAILURE(S), listed at the end", failures.len())
            }
        );
        for s in &self.scenarios {
            // Columns are the scenario's runs (the unused-claims scenario runs one binary twice).
            let labels: Vec<&str> = s.runs.iter().map(|r| r.binary.as_str()).collect();
            let ratio = labels.len() == 2;
            let round = s.round.as_ref().map_or(String::new(), |r| {
                format!(", round {} of {}, {} run first", r.number, r.of, r.first)
            });
            let _ = writeln!(out, "\n## {} ({}){round}\n", s.title, s.qps);
            let mut head = format!("| metric | {} |", labels.join(" | "));
            let mut rule = format!("|---|{}", "---:|".repeat(labels.len()));
            if ratio {
                let _ = write!(head, " {} / {} |", labels[0], labels[1]);
                rule.push_str("---:|");
            }
            let _ = writeln!(out, "{head}\n{rule}");
            let keys: Vec<(&str, &str)> = {
                let mut seen = BTreeSet::new();
                s.runs
                    .iter()
                    .flat_map(|r| r.metrics.iter())
                    .filter(|m| seen.insert(m.key.as_str()))
                    .map(|m| (m.key.as_str(), m.label.as_str()))
                    .collect()
            };
            for (key, label) in keys {
                let found: Vec<Option<&Metric>> = s
                    .runs
                    .iter()
                    .map(|r| r.metrics.iter().find(|m| m.key == key))
                    .collect();
                let vals: Vec<Option<f64>> =
                    found.iter().map(|m| m.and_then(|m| m.value)).collect();
                let mut line = format!("| {label} |");
                for m in &found {
                    let cell = match m {
                        Some(Metric { value: Some(v), .. }) => num(*v),
                        Some(Metric { text: Some(t), .. }) => t.clone(),
                        _ => "-".into(),
                    };
                    let _ = write!(line, " {cell} |");
                }
                if ratio {
                    let _ = write!(line, " {} |", ratio_of(vals[0], vals[1]));
                }
                let _ = writeln!(out, "{line}");
            }
            let phases: Vec<(&str, &str)> = {
                let mut seen = BTreeSet::new();
                s.runs
                    .iter()
                    .flat_map(|r| r.phases.iter())
                    .filter(|p| seen.insert(p.name.as_str()))
                    .map(|p| (p.name.as_str(), p.per.as_str()))
                    .collect()
            };
            for (name, per) in phases {
                let _ = writeln!(
                    out,
                    "\nAPI requests by the provisioner, {name}, {per} (Event requests last):\n"
                );
                let _ = writeln!(
                    out,
                    "| verb resource | {} |\n|---|{}",
                    labels.join(" | "),
                    "---:|".repeat(labels.len())
                );
                let of_run: Vec<Option<&Phase>> = s
                    .runs
                    .iter()
                    .map(|r| r.phases.iter().find(|p| p.name == name))
                    .collect();
                let rows: BTreeSet<(bool, &str, &str)> = of_run
                    .iter()
                    .flatten()
                    .flat_map(|p| p.requests.iter())
                    .map(|r| (r.resource == "events", r.verb.as_str(), r.resource.as_str()))
                    .collect();
                if rows.is_empty() {
                    let _ = writeln!(out, "| (none) |{}", " 0 |".repeat(labels.len()));
                }
                for (_, verb, resource) in rows {
                    let mut line = format!("| {verb} {resource} |");
                    for p in &of_run {
                        let cell = p.map_or("-".to_string(), |p| {
                            let n = p.count(verb, resource).unwrap_or(0);
                            let per = if p.divisor > 0.0 {
                                n as f64 / p.divisor
                            } else {
                                n as f64
                            };
                            format!("{} ({n})", num(per))
                        });
                        let _ = write!(line, " {cell} |");
                    }
                    let _ = writeln!(out, "{line}");
                }
            }
        }
        self.across_rounds(&mut out);
        if !failures.is_empty() {
            let _ = writeln!(out, "\n## Correctness failures\n");
            for f in failures {
                let _ = writeln!(out, "- {f}");
            }
        }
        out
    }
}

impl Report {
    /// Per scenario run in rounds: each figure's ratio in every round, and their geometric mean.
    fn across_rounds(&self, out: &mut String) {
        let mut groups: Vec<Vec<&Scenario>> = Vec::new();
        for s in self
            .scenarios
            .iter()
            .filter(|s| s.round.is_some() && s.runs.len() == 2)
        {
            match groups
                .iter_mut()
                .find(|g| g[0].title == s.title && g[0].qps == s.qps)
            {
                Some(g) => g.push(s),
                None => groups.push(vec![s]),
            }
        }
        for g in groups.iter().filter(|g| g.len() > 1) {
            let labels = (&g[0].runs[0].binary, &g[0].runs[1].binary);
            let _ = writeln!(
                out,
                "\n## {} ({}), {} rounds: {} / {}\n",
                g[0].title,
                g[0].qps,
                g.len(),
                labels.0,
                labels.1
            );
            let mut head = "| metric |".to_string();
            for s in g {
                let r = s.round.as_ref().expect("grouped by round");
                let _ = write!(head, " round {} ({} first) |", r.number, r.first);
            }
            let _ = writeln!(
                out,
                "{head} geometric mean |\n|---|{}---:|",
                "---:|".repeat(g.len())
            );
            for m in &g[0].runs[0].metrics {
                let ratios: Vec<Option<f64>> = g
                    .iter()
                    .map(|s| {
                        let value = |run: &Run| {
                            run.metrics
                                .iter()
                                .find(|x| x.key == m.key)
                                .and_then(|x| x.value)
                        };
                        ratio(value(&s.runs[0]), value(&s.runs[1]))
                    })
                    .collect();
                let mut line = format!("| {} |", m.label);
                for r in &ratios {
                    let _ = write!(line, " {} |", r.map_or("-".into(), |r| format!("{r:.2}")));
                }
                let _ = writeln!(out, "{line} {} |", geometric_mean(&ratios));
            }
        }
    }
}

/// `a / b`; two zeros are equal.
fn ratio(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a?, b?) {
        (a, b) if b != 0.0 => Some(a / b),
        (0.0, _) => Some(1.0),
        _ => None,
    }
}

/// The geometric mean of positive ratios, `-` unless every round has one.
fn geometric_mean(ratios: &[Option<f64>]) -> String {
    let logs: Option<Vec<f64>> = ratios
        .iter()
        .map(|r| r.filter(|r| *r > 0.0).map(f64::ln))
        .collect();
    match logs {
        Some(logs) if !logs.is_empty() => {
            format!(
                "{:.2}",
                (logs.iter().sum::<f64>() / logs.len() as f64).exp()
            )
        }
        _ => "-".into(),
    }
}

/// A figure with about three significant digits.
pub fn num(v: f64) -> String {
    let a = v.abs();
    if a >= 100.0 || v == v.trunc() && a < 1e15 {
        format!("{v:.0}")
    } else if a >= 10.0 {
        format!("{v:.1}")
    } else if a >= 0.1 {
        format!("{v:.2}")
    } else {
        format!("{v:.3}")
    }
}

fn ratio_of(a: Option<f64>, b: Option<f64>) -> String {
    ratio(a, b).map_or("-".into(), |r| format!("{r:.2}"))
}

/// Nearest-rank percentile (`p` in 0..=100) of unsorted values.
pub fn percentile(values: &[f64], p: f64) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let rank = ((p / 100.0) * v.len() as f64).ceil().max(1.0) as usize;
    v[rank.min(v.len()) - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_by_nearest_rank() {
        let v: Vec<f64> = (1..=100).rev().map(f64::from).collect();
        assert_eq!(percentile(&v, 50.0), 50.0);
        assert_eq!(percentile(&v, 95.0), 95.0);
        assert_eq!(percentile(&v, 99.0), 99.0);
        assert_eq!(percentile(&v, 100.0), 100.0);
        assert_eq!(percentile(&[3.0], 99.0), 3.0);
        assert!(percentile(&[], 50.0).is_nan());
    }

    #[test]
    fn numbers_and_ratios() {
        assert_eq!(num(1234.4), "1234");
        assert_eq!(num(12.34), "12.3");
        assert_eq!(num(1.234), "1.23");
        assert_eq!(num(3.0), "3");
        assert_eq!(num(0.01234), "0.012");
        assert_eq!(ratio_of(Some(2.0), Some(4.0)), "0.50");
        assert_eq!(ratio_of(Some(0.0), Some(0.0)), "1.00");
        assert_eq!(ratio_of(Some(1.0), None), "-");
    }

    #[test]
    fn markdown_has_both_columns_their_ratio_and_failures() {
        let mut a = Run {
            binary: "A".into(),
            ..Default::default()
        };
        a.metric("t", "time until all Bound (s)", 10.0);
        a.metric_text("all", "every object (s)", "not within the run: 3 of 8");
        let mut r = Requests::default();
        r.0.insert(("create".into(), "persistentvolumes".into()), 20);
        r.0.insert(("create".into(), "events".into()), 40);
        a.phases.push(Phase::new(
            "provisioning",
            "per provisioned volume",
            20.0,
            &r,
        ));
        let mut b = Run {
            binary: "B".into(),
            ..Default::default()
        };
        b.metric("t", "time until all Bound (s)", 40.0);
        b.fail("PV pvc-1 leaked");
        let report = Report {
            command: "bench".into(),
            date: "today".into(),
            cores: 2,
            load_average_start: "1".into(),
            load_average_end: "2".into(),
            binaries: vec![
                Binary {
                    label: "A".into(),
                    path: "/a".into(),
                    version: "a 1".into(),
                },
                Binary {
                    label: "B".into(),
                    path: "/b".into(),
                    version: "b 2".into(),
                },
            ],
            scenarios: vec![Scenario {
                scenario: "burst".into(),
                title: "burst of 20 claims".into(),
                qps: "QPS 5, burst 10".into(),
                runs: vec![a, b],
                round: None,
            }],
            notes: vec![],
        };
        let md = report.markdown();
        assert!(md.contains("| metric | A | B | A / B |"), "{md}");
        assert!(
            md.contains("| time until all Bound (s) | 10 | 40 | 0.25 |"),
            "{md}"
        );
        assert!(
            md.contains("| every object (s) | not within the run: 3 of 8 | - | - |"),
            "{md}"
        );
        assert!(
            md.contains("| create persistentvolumes | 1 (20) | - |"),
            "{md}"
        );
        assert!(md.contains("| create events | 2 (40) | - |"), "{md}");
        assert_eq!(report.failures().len(), 1);
        assert!(md.contains("PV pvc-1 leaked"), "{md}");
    }

    #[test]
    fn rounds_each_get_a_table_and_their_ratios_a_geometric_mean() {
        let run = |binary: &str, rate: f64| {
            let mut r = Run {
                binary: binary.into(),
                ..Default::default()
            };
            r.metric("v", "volumes/s", rate);
            r
        };
        let round = |number, first: &str, a, b| Scenario {
            scenario: "burst".into(),
            title: "burst of 20 claims".into(),
            qps: "QPS 1000".into(),
            runs: vec![run("A", a), run("B", b)],
            round: Some(Round {
                number,
                of: 2,
                first: first.into(),
            }),
        };
        let report = Report {
            command: "bench".into(),
            date: "today".into(),
            cores: 2,
            load_average_start: "1".into(),
            load_average_end: "1".into(),
            binaries: vec![],
            scenarios: vec![round(1, "A", 90.0, 100.0), round(2, "B", 160.0, 100.0)],
            notes: vec![],
        };
        let md = report.markdown();
        assert!(
            md.contains("## burst of 20 claims (QPS 1000), round 2 of 2, B run first"),
            "{md}"
        );
        assert!(
            md.contains("| volumes/s | 0.90 | 1.60 | 1.20 |"),
            "the geometric mean of 0.9 and 1.6 is 1.2: {md}"
        );
    }
}
