//! Label and field selectors as list and watch accept them.

use serde_json::Value;

use crate::error::ApiError;
use crate::resources::ResourceDef;

#[derive(Debug, Clone, PartialEq)]
enum LabelReq {
    Eq(String, String),
    NotEq(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
}

/// A parsed `labelSelector`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LabelSelector(Vec<LabelReq>);

/// Splits on commas that are not inside parentheses.
fn split_top(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut depth = 0;
    let mut cur = String::new();
    for c in s.chars() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(std::mem::take(&mut cur));
                continue;
            }
            _ => {}
        }
        cur.push(c);
    }
    out.push(cur);
    out.into_iter()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect()
}

fn set_values(s: &str) -> Result<Vec<String>, ApiError> {
    let s = s.trim();
    let inner = s
        .strip_prefix('(')
        .and_then(|x| x.strip_suffix(')'))
        .ok_or_else(|| {
            ApiError::bad_request(format!(
                "unable to parse requirement: found '{s}', expected: '('"
            ))
        })?;
    Ok(inner
        .split(',')
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
        .collect())
}

impl LabelSelector {
    pub fn parse(s: &str) -> Result<Self, ApiError> {
        let mut reqs = Vec::new();
        for part in split_top(s) {
            let req = if let Some(k) = part.strip_prefix('!') {
                LabelReq::NotExists(k.trim().to_string())
            } else if let Some((k, v)) = part.split_once("!=") {
                LabelReq::NotEq(k.trim().into(), v.trim().into())
            } else if let Some((k, v)) = part.split_once("==") {
                LabelReq::Eq(k.trim().into(), v.trim().into())
            } else if let Some((k, v)) = part.split_once('=') {
                LabelReq::Eq(k.trim().into(), v.trim().into())
            } else if let Some((k, v)) = part.split_once(" notin ") {
                LabelReq::NotIn(k.trim().into(), set_values(v)?)
            } else if let Some((k, v)) = part.split_once(" in ") {
                LabelReq::In(k.trim().into(), set_values(v)?)
            } else if part.contains(' ') || part.contains('(') {
                return Err(ApiError::bad_request(format!(
                    "unable to parse requirement: invalid label selector {part:?}"
                )));
            } else {
                LabelReq::Exists(part)
            };
            reqs.push(req);
        }
        Ok(Self(reqs))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn matches(&self, obj: &Value) -> bool {
        let labels = obj.pointer("/metadata/labels");
        let get = |k: &str| labels.and_then(|l| l.get(k)).and_then(Value::as_str);
        self.0.iter().all(|r| match r {
            LabelReq::Eq(k, v) => get(k) == Some(v.as_str()),
            LabelReq::NotEq(k, v) => get(k) != Some(v.as_str()),
            LabelReq::In(k, vs) => get(k).is_some_and(|x| vs.iter().any(|v| v == x)),
            LabelReq::NotIn(k, vs) => get(k).is_none_or(|x| !vs.iter().any(|v| v == x)),
            LabelReq::Exists(k) => get(k).is_some(),
            LabelReq::NotExists(k) => get(k).is_none(),
        })
    }
}

/// A parsed `fieldSelector` (only `=`, `==` and `!=`, as the real server).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FieldSelector(Vec<(String, bool, String)>);

/// Field labels each resource supports, beyond metadata.name and metadata.namespace.
fn supported_fields(rd: &ResourceDef) -> &'static [&'static str] {
    match (rd.group, rd.plural) {
        ("", "pods") => &[
            "spec.nodeName",
            "spec.restartPolicy",
            "spec.schedulerName",
            "spec.serviceAccountName",
            "spec.hostNetwork",
            "status.phase",
            "status.podIP",
            "status.nominatedNodeName",
        ],
        ("", "events") | ("events.k8s.io", "events") => &[
            "involvedObject.kind",
            "involvedObject.namespace",
            "involvedObject.name",
            "involvedObject.uid",
            "involvedObject.apiVersion",
            "involvedObject.resourceVersion",
            "involvedObject.fieldPath",
            "reason",
            "reportingComponent",
            "source",
            "type",
        ],
        // PVs and claims have no field labels beyond metadata (kube-apiserver 1.20 answers so).
        ("", "namespaces") => &["status.phase"],
        ("", "secrets") => &["type"],
        ("", "nodes") => &["spec.unschedulable"],
        _ => &[],
    }
}

impl FieldSelector {
    pub fn parse(s: &str, rd: &ResourceDef) -> Result<Self, ApiError> {
        let mut out = Vec::new();
        for part in split_top(s) {
            let (k, eq, v) = if let Some((k, v)) = part.split_once("!=") {
                (k, false, v)
            } else if let Some((k, v)) = part.split_once("==") {
                (k, true, v)
            } else if let Some((k, v)) = part.split_once('=') {
                (k, true, v)
            } else {
                return Err(ApiError::bad_request(format!(
                    "invalid selector: '{s}'; can't understand '{part}'"
                )));
            };
            let mut k = k.trim().to_string();
            // events.k8s.io field labels are converted to the core names the store uses.
            if rd.is_events_v1() {
                if let Some(rest) = k.strip_prefix("regarding.") {
                    k = format!("involvedObject.{rest}");
                } else if k == "reportingController" {
                    k = "reportingComponent".into();
                }
            }
            if k != "metadata.name"
                && k != "metadata.namespace"
                && !supported_fields(rd).contains(&k.as_str())
            {
                // A type with its own field-label conversion names the label; the others get
                // the default conversion's text.
                return Err(ApiError::bad_request(
                    match supported_fields(rd).is_empty() {
                        false => format!("field label not supported: {k}"),
                        true => format!(
                            "{k:?} is not a known field selector: only \"metadata.name\", \"metadata.namespace\""
                        ),
                    },
                ));
            }
            out.push((k, eq, v.trim().to_string()));
        }
        Ok(Self(out))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Matches against the stored (core) form of the object.
    pub fn matches(&self, obj: &Value) -> bool {
        self.0.iter().all(|(k, eq, v)| {
            let actual = field_value(obj, k);
            (actual == *v) == *eq
        })
    }
}

fn field_value(obj: &Value, field: &str) -> String {
    let path = match field {
        "source" => "/source/component".to_string(),
        "reportingComponent" => "/reportingComponent".to_string(),
        f => format!("/{}", f.replace('.', "/")),
    };
    match obj.pointer(&path) {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Bool(b)) => b.to_string(),
        Some(Value::Number(n)) => n.to_string(),
        _ => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn label_selector_forms() {
        let o = json!({"metadata": {"labels": {"a": "1", "b": "2"}}});
        for (sel, want) in [
            ("a=1", true),
            ("a==1,b=2", true),
            ("a!=1", false),
            ("a in (1, 3)", true),
            ("a notin (1)", false),
            ("c", false),
            ("!c", true),
            ("a,b in (2),!c", true),
        ] {
            assert_eq!(
                LabelSelector::parse(sel).unwrap().matches(&o),
                want,
                "{sel}"
            );
        }
    }

    #[test]
    fn unsupported_field_is_rejected() {
        // Texts as kube-apiserver 1.20 answers them (tests/kube_sim_vs_real.rs).
        let rd = crate::resources::core("persistentvolumeclaims");
        let e = FieldSelector::parse("spec.volumeName=x", rd).unwrap_err();
        assert_eq!(
            e.message,
            "\"spec.volumeName\" is not a known field selector: only \"metadata.name\", \"metadata.namespace\""
        );
        let e = FieldSelector::parse("status.phase=Bound", rd).unwrap_err();
        assert_eq!(e.code, 400);
        let secrets = crate::resources::core("secrets");
        let e = FieldSelector::parse("spec.x=x", secrets).unwrap_err();
        assert_eq!(e.message, "field label not supported: spec.x");
    }
}
