//! Two outcomes side by side, and the allow-list of deliberate differences
//! (`tests/differential/allow.yaml`): each entry says why ours differs on purpose; any difference
//! no entry names fails the suite.

use std::fmt;

use regex::Regex;
use serde::Deserialize;

use crate::outcome::Outcome;

/// One field where the two worlds differ (`None`: absent on that side).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Difference {
    pub path: String,
    pub upstream: Option<String>,
    pub ours: Option<String>,
}

impl fmt::Display for Difference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let side = |v: &Option<String>| v.clone().unwrap_or_else(|| "(absent)".into());
        write!(
            f,
            "{}\n      upstream: {}\n      ours:     {}",
            self.path,
            side(&self.upstream),
            side(&self.ours)
        )
    }
}

/// Every field present on one side only or with different values.
pub fn diff(upstream: &Outcome, ours: &Outcome) -> Vec<Difference> {
    let mut out = Vec::new();
    for (path, u) in upstream {
        match ours.get(path) {
            Some(o) if o == u => {}
            o => out.push(Difference {
                path: path.clone(),
                upstream: Some(u.clone()),
                ours: o.cloned(),
            }),
        }
    }
    for (path, o) in ours {
        if !upstream.contains_key(path) {
            out.push(Difference {
                path: path.clone(),
                upstream: None,
                ours: Some(o.clone()),
            });
        }
    }
    out.sort_by(|a, b| a.path.cmp(&b.path));
    out
}

/// Our outcome reduced to the metric families a comparison with `upstream` covers: none when
/// `upstream` has none (recorded before families were recorded), else only the families upstream
/// serves. Families only we serve are our additions (docs/observability.md), not differences;
/// families only upstream serves stay differences unless `allow.yaml` names them.
pub fn scope_metrics(upstream: &Outcome, mut ours: Outcome) -> Outcome {
    let recorded = upstream.keys().any(|k| k.starts_with(METRIC));
    ours.retain(|k, _| !k.starts_with(METRIC) || (recorded && upstream.contains_key(k)));
    ours
}

/// Outcome paths of metric families.
const METRIC: &str = "metric/";

/// One deliberate difference, as written in `allow.yaml`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AllowEntry {
    /// Why ours differs, and where the docs say so.
    pub why: String,
    /// Regex over the flattened path.
    pub path: String,
    /// Regex over the scenario name (default: every scenario).
    #[serde(default)]
    pub scenarios: Option<String>,
    /// Regex our value must match (`absent` for a field only upstream has).
    #[serde(default)]
    pub ours: Option<String>,
    /// Regex upstream's value must match (`absent` for a field only ours has).
    #[serde(default)]
    pub upstream: Option<String>,
}

/// One entry with its regexes compiled: path, scenarios, ours, upstream.
struct Compiled {
    entry: AllowEntry,
    path: Regex,
    scenarios: Option<Regex>,
    ours: Option<Regex>,
    upstream: Option<Regex>,
}

/// The compiled allow-list.
pub struct AllowList {
    entries: Vec<Compiled>,
}

fn side_matches(re: &Option<Regex>, value: &Option<String>) -> bool {
    match (re, value) {
        (None, _) => true,
        (Some(re), None) => re.as_str() == "absent",
        (Some(re), Some(v)) => re.as_str() != "absent" && re.is_match(v),
    }
}

impl AllowList {
    pub fn parse(text: &str) -> Result<AllowList, String> {
        let raw: Vec<AllowEntry> = serde_saphyr::from_str(text).map_err(|e| e.to_string())?;
        let compile = |s: &str| Regex::new(s).map_err(|e| format!("{s:?}: {e}"));
        let mut entries = Vec::new();
        for e in raw {
            let path = compile(&e.path)?;
            let scen = e.scenarios.as_deref().map(compile).transpose()?;
            let ours = e.ours.as_deref().map(compile).transpose()?;
            let up = e.upstream.as_deref().map(compile).transpose()?;
            entries.push(Compiled {
                entry: e,
                path,
                scenarios: scen,
                ours,
                upstream: up,
            });
        }
        Ok(AllowList { entries })
    }

    /// The entry that allows `d` in `scenario`, if any.
    pub fn allows(&self, scenario: &str, d: &Difference) -> Option<&AllowEntry> {
        self.entries
            .iter()
            .find(|c| {
                c.path.is_match(&d.path)
                    && c.scenarios.as_ref().is_none_or(|s| s.is_match(scenario))
                    && side_matches(&c.ours, &d.ours)
                    && side_matches(&c.upstream, &d.upstream)
            })
            .map(|c| &c.entry)
    }

    /// Every entry's `why`, in file order (to report the ones no run used).
    pub fn reasons(&self) -> Vec<&str> {
        self.entries.iter().map(|c| c.entry.why.as_str()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcome(pairs: &[(&str, &str)]) -> Outcome {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn a_difference_names_the_field_and_both_sides() {
        let up = outcome(&[("a", "1"), ("b", "2")]);
        let ours = outcome(&[("a", "1"), ("b", "3"), ("c", "4")]);
        let d = diff(&up, &ours);
        assert_eq!(d.len(), 2);
        assert_eq!(d[0].path, "b");
        assert_eq!(d[1].upstream, None);
        assert!(diff(&up, &up).is_empty());
    }

    #[test]
    fn the_allow_list_matches_path_scenario_and_sides() {
        let list = AllowList::parse(
            r#"
- why: our own annotation
  path: '^pv/.*csi-provisioner\.rs/'
  upstream: absent
- why: only in node mode
  path: '^x$'
  scenarios: '^node/'
"#,
        )
        .unwrap();
        let ours_only = Difference {
            path: "pv/p.metadata.annotations[\"csi-provisioner.rs/node-name\"]".into(),
            upstream: None,
            ours: Some("\"n1\"".into()),
        };
        assert!(list.allows("any", &ours_only).is_some());
        let changed = Difference {
            upstream: Some("\"n2\"".into()),
            ..ours_only.clone()
        };
        assert!(list.allows("any", &changed).is_none());
        let x = Difference {
            path: "x".into(),
            upstream: None,
            ours: None,
        };
        assert!(list.allows("node/a", &x).is_some());
        assert!(list.allows("provision/a", &x).is_none());
    }

    #[test]
    fn metric_families_are_compared_only_where_upstream_recorded_them() {
        let ours = outcome(&[
            ("pv/a", "1"),
            ("metric/workqueue_depth", "gauge [name]"),
            ("metric/csi_provisioner_claims_pending", "gauge []"),
        ]);
        let old_recording = outcome(&[("pv/a", "1")]);
        assert!(diff(&old_recording, &scope_metrics(&old_recording, ours.clone())).is_empty());
        let upstream = outcome(&[
            ("pv/a", "1"),
            ("metric/workqueue_depth", "gauge [name]"),
            ("metric/apiserver_audit_event_total", "counter []"),
        ]);
        let d = diff(&upstream, &scope_metrics(&upstream, ours));
        assert_eq!(d.len(), 1, "{d:?}");
        assert_eq!(d[0].path, "metric/apiserver_audit_event_total");
        assert_eq!(d[0].ours, None);
    }

    #[test]
    fn the_allow_list_file_parses() {
        let text = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/differential/allow.yaml"),
        )
        .unwrap();
        let list = AllowList::parse(&text).unwrap();
        assert!(list.reasons().iter().all(|w| !w.trim().is_empty()));
    }
}
