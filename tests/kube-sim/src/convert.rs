//! Views of stored objects: events.k8s.io/v1 <-> core/v1 Events, PartialObjectMetadata and
//! server-side Tables (what `kubectl get` prints).

use serde_json::{Map, Value, json};

use crate::resources::ResourceDef;

/// Field pairs (core/v1, events.k8s.io/v1) renamed between the two Event versions.
const EVENT_FIELDS: &[(&str, &str)] = &[
    ("involvedObject", "regarding"),
    ("message", "note"),
    ("reportingComponent", "reportingController"),
    ("source", "deprecatedSource"),
    ("firstTimestamp", "deprecatedFirstTimestamp"),
    ("lastTimestamp", "deprecatedLastTimestamp"),
    ("count", "deprecatedCount"),
];
const EVENT_SAME: &[&str] = &[
    "metadata",
    "eventTime",
    "series",
    "action",
    "reason",
    "related",
    "type",
    "reportingInstance",
];

fn rename(obj: &Value, from_core: bool) -> Map<String, Value> {
    let mut out = Map::new();
    let Some(m) = obj.as_object() else { return out };
    for k in EVENT_SAME {
        if let Some(v) = m.get(*k)
            && !v.is_null()
        {
            out.insert((*k).to_string(), v.clone());
        }
    }
    for (core, v1) in EVENT_FIELDS {
        let (src, dst) = if from_core { (core, v1) } else { (v1, core) };
        if let Some(v) = m.get(*src)
            && !v.is_null()
        {
            out.insert((*dst).to_string(), v.clone());
        }
    }
    out
}

/// The form a client of `rd` sees for a stored object.
pub fn to_external(rd: &ResourceDef, stored: &Value) -> Value {
    if rd.is_events_v1() {
        let mut m = rename(stored, true);
        m.insert("kind".into(), json!("Event"));
        m.insert("apiVersion".into(), json!("events.k8s.io/v1"));
        m.entry("eventTime").or_insert(Value::Null);
        return Value::Object(m);
    }
    stored.clone()
}

/// The stored form of an object a client of `rd` sent.
pub fn to_internal(rd: &ResourceDef, external: Value) -> Value {
    if rd.is_events_v1() {
        let mut m = rename(&external, false);
        m.insert("kind".into(), json!("Event"));
        m.insert("apiVersion".into(), json!("v1"));
        return Value::Object(m);
    }
    external
}

pub fn partial_metadata(obj: &Value) -> Value {
    json!({
        "kind": "PartialObjectMetadata",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": obj.get("metadata").cloned().unwrap_or_else(|| json!({})),
    })
}

/// What the Accept header asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    Full,
    Metadata,
    Table,
}

/// Picks the first Accept entry we can serve; protobuf is answered with JSON.
pub fn shape_from_accept(accept: &str) -> Shape {
    for part in accept.split(',') {
        let params: Vec<&str> = part.split(';').map(str::trim).collect();
        let media = params.first().copied().unwrap_or("");
        if media.contains("protobuf") {
            continue;
        }
        let as_ = params.iter().find_map(|p| p.strip_prefix("as="));
        match as_ {
            Some("PartialObjectMetadata") | Some("PartialObjectMetadataList") => {
                return Shape::Metadata;
            }
            Some("Table") => {
                let v = params
                    .iter()
                    .find_map(|p| p.strip_prefix("v="))
                    .unwrap_or("v1");
                if v == "v1" {
                    return Shape::Table;
                }
            }
            Some(_) => continue,
            None => return Shape::Full,
        }
    }
    Shape::Full
}

/// Formats an age like kubectl's `duration.HumanDuration`.
pub fn human_duration(secs: i64) -> String {
    if secs < 0 {
        return "0s".into();
    }
    let (m, h, d) = (secs / 60, secs / 3600, secs / 86400);
    if secs < 120 {
        format!("{secs}s")
    } else if m < 10 {
        let s = secs % 60;
        if s == 0 {
            format!("{m}m")
        } else {
            format!("{m}m{s}s")
        }
    } else if m < 180 {
        format!("{m}m")
    } else if h < 8 {
        let mm = m % 60;
        if mm == 0 {
            format!("{h}h")
        } else {
            format!("{h}h{mm}m")
        }
    } else if h < 48 {
        format!("{h}h")
    } else if h < 24 * 8 {
        let hh = h % 24;
        if hh == 0 {
            format!("{d}d")
        } else {
            format!("{d}d{hh}h")
        }
    } else if h < 24 * 365 * 2 {
        format!("{d}d")
    } else {
        format!("{}y", d / 365)
    }
}

pub fn age(ts: Option<&str>) -> String {
    let Some(ts) = ts else {
        return "<unknown>".into();
    };
    match ts.parse::<jiff::Timestamp>() {
        Ok(t) => human_duration(jiff::Timestamp::now().as_second() - t.as_second()),
        Err(_) => "<unknown>".into(),
    }
}

fn s<'a>(v: &'a Value, p: &str) -> &'a str {
    v.pointer(p).and_then(Value::as_str).unwrap_or("")
}

fn modes(v: &Value) -> String {
    let m: Vec<&str> = v
        .pointer("/spec/accessModes")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(|m| match m {
                    "ReadWriteOnce" => "RWO",
                    "ReadOnlyMany" => "ROX",
                    "ReadWriteMany" => "RWX",
                    "ReadWriteOncePod" => "RWOP",
                    o => o,
                })
                .collect()
        })
        .unwrap_or_default();
    m.join(",")
}

fn deleting(v: &Value) -> bool {
    v.pointer("/metadata/deletionTimestamp")
        .is_some_and(|t| !t.is_null())
}

fn created(v: &Value) -> String {
    age(v
        .pointer("/metadata/creationTimestamp")
        .and_then(Value::as_str))
}

fn columns(rd: &ResourceDef) -> Vec<(&'static str, &'static str)> {
    let c: &[(&str, &str)] = match (rd.group, rd.plural) {
        ("", "persistentvolumes") => &[
            ("Name", "string"),
            ("Capacity", "string"),
            ("Access Modes", "string"),
            ("Reclaim Policy", "string"),
            ("Status", "string"),
            ("Claim", "string"),
            ("StorageClass", "string"),
            ("VolumeAttributesClass", "string"),
            ("Reason", "string"),
            ("Age", "string"),
        ],
        ("", "persistentvolumeclaims") => &[
            ("Name", "string"),
            ("Status", "string"),
            ("Volume", "string"),
            ("Capacity", "string"),
            ("Access Modes", "string"),
            ("StorageClass", "string"),
            ("VolumeAttributesClass", "string"),
            ("Age", "string"),
        ],
        ("storage.k8s.io", "storageclasses") => &[
            ("Name", "string"),
            ("Provisioner", "string"),
            ("ReclaimPolicy", "string"),
            ("VolumeBindingMode", "string"),
            ("AllowVolumeExpansion", "string"),
            ("Age", "string"),
        ],
        (_, "events") => &[
            ("Last Seen", "string"),
            ("Type", "string"),
            ("Reason", "string"),
            ("Object", "string"),
            ("Message", "string"),
        ],
        ("", "pods") => &[
            ("Name", "string"),
            ("Ready", "string"),
            ("Status", "string"),
            ("Restarts", "string"),
            ("Age", "string"),
        ],
        ("", "namespaces") => &[("Name", "string"), ("Status", "string"), ("Age", "string")],
        ("", "nodes") => &[
            ("Name", "string"),
            ("Status", "string"),
            ("Roles", "string"),
            ("Age", "string"),
            ("Version", "string"),
        ],
        _ => &[("Name", "string"), ("Age", "string")],
    };
    c.to_vec()
}

fn cells(rd: &ResourceDef, v: &Value) -> Vec<Value> {
    let name = s(v, "/metadata/name").to_string();
    match (rd.group, rd.plural) {
        ("", "persistentvolumes") => {
            let status = if deleting(v) {
                "Terminating"
            } else {
                s(v, "/status/phase")
            };
            let claim = if v.pointer("/spec/claimRef").is_some() {
                format!(
                    "{}/{}",
                    s(v, "/spec/claimRef/namespace"),
                    s(v, "/spec/claimRef/name")
                )
            } else {
                String::new()
            };
            let vac = s(v, "/spec/volumeAttributesClassName");
            vec![
                json!(name),
                json!(s(v, "/spec/capacity/storage")),
                json!(modes(v)),
                json!(s(v, "/spec/persistentVolumeReclaimPolicy")),
                json!(status),
                json!(claim),
                json!(s(v, "/spec/storageClassName")),
                json!(if vac.is_empty() { "<unset>" } else { vac }),
                json!(s(v, "/status/reason")),
                json!(created(v)),
            ]
        }
        ("", "persistentvolumeclaims") => {
            let status = if deleting(v) {
                "Terminating"
            } else {
                s(v, "/status/phase")
            };
            let vac = s(v, "/spec/volumeAttributesClassName");
            let bound = !s(v, "/spec/volumeName").is_empty();
            let (cap, am) = if bound {
                (
                    s(v, "/status/capacity/storage").to_string(),
                    status_modes(v),
                )
            } else {
                (String::new(), String::new())
            };
            vec![
                json!(name),
                json!(status),
                json!(s(v, "/spec/volumeName")),
                json!(cap),
                json!(am),
                json!(s(v, "/spec/storageClassName")),
                json!(if vac.is_empty() { "<unset>" } else { vac }),
                json!(created(v)),
            ]
        }
        ("storage.k8s.io", "storageclasses") => {
            let default = s(
                v,
                "/metadata/annotations/storageclass.kubernetes.io~1is-default-class",
            ) == "true";
            let shown = if default {
                format!("{name} (default)")
            } else {
                name
            };
            vec![
                json!(shown),
                json!(s(v, "/provisioner")),
                json!(s(v, "/reclaimPolicy")),
                json!(s(v, "/volumeBindingMode")),
                json!(
                    v.get("allowVolumeExpansion")
                        .and_then(Value::as_bool)
                        .unwrap_or(false)
                        .to_string()
                ),
                json!(created(v)),
            ]
        }
        (_, "events") => {
            let last = [
                s(v, "/series/lastObservedTime"),
                s(v, "/lastTimestamp"),
                s(v, "/eventTime"),
                s(v, "/metadata/creationTimestamp"),
            ]
            .into_iter()
            .find(|t| !t.is_empty());
            let obj = format!(
                "{}/{}",
                s(v, "/involvedObject/kind").to_lowercase(),
                s(v, "/involvedObject/name")
            );
            vec![
                json!(age(last)),
                json!(s(v, "/type")),
                json!(s(v, "/reason")),
                json!(obj),
                json!(s(v, "/message")),
            ]
        }
        ("", "pods") => {
            let n = v
                .pointer("/spec/containers")
                .and_then(Value::as_array)
                .map_or(0, Vec::len);
            let running = s(v, "/status/phase") == "Running";
            let status = if deleting(v) {
                "Terminating"
            } else {
                s(v, "/status/phase")
            };
            vec![
                json!(name),
                json!(format!("{}/{n}", if running { n } else { 0 })),
                json!(status),
                json!(0),
                json!(created(v)),
            ]
        }
        ("", "namespaces") => vec![json!(name), json!(s(v, "/status/phase")), json!(created(v))],
        ("", "nodes") => vec![
            json!(name),
            json!("Ready"),
            json!("<none>"),
            json!(created(v)),
            json!("v1.34.0"),
        ],
        _ => vec![json!(name), json!(created(v))],
    }
}

fn status_modes(v: &Value) -> String {
    let mut tmp = v.clone();
    if let Some(m) = v.pointer("/status/accessModes") {
        tmp["spec"]["accessModes"] = m.clone();
    }
    modes(&tmp)
}

/// A meta.k8s.io/v1 Table of `items` (stored form) for the client's resource view.
pub fn table(rd: &ResourceDef, items: &[Value], list_meta: Value) -> Value {
    let cols: Vec<Value> = columns(rd)
        .into_iter()
        .enumerate()
        .map(|(i, (n, t))| {
            let mut c =
                json!({"name": n, "type": t, "format": "", "description": "", "priority": 0});
            if i == 0 && n == "Name" {
                c["format"] = json!("name");
            }
            c
        })
        .collect();
    let rows: Vec<Value> = items
        .iter()
        .map(|o| json!({"cells": cells(rd, o), "object": partial_metadata(o)}))
        .collect();
    json!({"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": list_meta, "columnDefinitions": cols, "rows": rows})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_round_trip_between_versions() {
        let core = json!({"apiVersion": "v1", "kind": "Event", "metadata": {"name": "e"}, "involvedObject": {"kind": "Pod", "name": "p"},
                          "message": "m", "reason": "R", "count": 2, "source": {"component": "c"}});
        let rd = crate::resources::find("events.k8s.io", "v1", "events").unwrap();
        let v1 = to_external(rd, &core);
        assert_eq!(v1["regarding"]["name"], "p");
        assert_eq!(v1["note"], "m");
        assert_eq!(v1["deprecatedCount"], 2);
        assert_eq!(to_internal(rd, v1), core);
    }

    #[test]
    fn accept_header_shapes() {
        assert_eq!(
            shape_from_accept("application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"),
            Shape::Metadata
        );
        assert_eq!(
            shape_from_accept("application/json;as=Table;v=v1;g=meta.k8s.io,application/json"),
            Shape::Table
        );
        assert_eq!(
            shape_from_accept("application/vnd.kubernetes.protobuf,application/json"),
            Shape::Full
        );
        assert_eq!(human_duration(3725), "62m");
        assert_eq!(human_duration(65), "65s");
    }
}
