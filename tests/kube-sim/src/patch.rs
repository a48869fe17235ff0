//! The three patch types: JSON merge patch, JSON patch and strategic merge patch (with the
//! merge keys and directives of the Kubernetes types this project touches).

use serde_json::{Map, Value};

/// Merge key of lists of objects that Kubernetes merges by key, by field name.
fn merge_key(field: &str) -> Option<&'static str> {
    Some(match field {
        "containers"
        | "initContainers"
        | "ephemeralContainers"
        | "volumes"
        | "env"
        | "imagePullSecrets"
        | "resourceClaims" => "name",
        "ports" => "containerPort",
        "volumeMounts" => "mountPath",
        "volumeDevices" => "devicePath",
        "conditions" | "addresses" => "type",
        "ownerReferences" => "uid",
        "topologySpreadConstraints" => "topologyKey",
        "hostAliases" => "ip",
        _ => return None,
    })
}

/// Lists of scalars that strategic merge patch merges as sets.
fn is_primitive_merge(field: &str) -> bool {
    field == "finalizers"
}

pub fn merge_patch(target: &mut Value, patch: &Value) {
    json_patch::merge(target, patch);
}

pub fn json_patch(target: &mut Value, patch: &Value) -> Result<(), JsonPatchError> {
    let p: json_patch::Patch =
        serde_json::from_value(patch.clone()).map_err(|e| JsonPatchError::Decode(e.to_string()))?;
    json_patch::patch(target, &p).map_err(|e| JsonPatchError::Apply(e.to_string()))
}

#[derive(Debug)]
pub enum JsonPatchError {
    /// The body is not a JSON patch document (400).
    Decode(String),
    /// An operation failed, e.g. a `test` (422); the text is for logs.
    Apply(#[allow(dead_code)] String),
}

/// Applies a strategic merge patch to `target` in place.
pub fn strategic_merge(target: &mut Value, patch: &Value) -> Result<(), String> {
    match (target.as_object_mut(), patch.as_object()) {
        (Some(t), Some(p)) => merge_map(t, p),
        _ => Err("strategic merge patch must be a JSON object".into()),
    }
}

fn merge_map(target: &mut Map<String, Value>, patch: &Map<String, Value>) -> Result<(), String> {
    if let Some(d) = patch.get("$patch").and_then(Value::as_str) {
        match d {
            "replace" => {
                *target = patch
                    .iter()
                    .filter(|(k, _)| !k.starts_with('$'))
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect();
                return Ok(());
            }
            "delete" => {
                target.clear();
                return Ok(());
            }
            "merge" => {}
            other => return Err(format!("Unknown patch type: {other}")),
        }
    }
    for (k, pv) in patch {
        if let Some(field) = k.strip_prefix("$deleteFromPrimitiveList/") {
            if let (Some(Value::Array(list)), Some(del)) = (target.get_mut(field), pv.as_array()) {
                list.retain(|x| !del.contains(x));
            }
            continue;
        }
        if k.starts_with('$') {
            // $setElementOrder/... and $retainKeys are applied after merging below.
            continue;
        }
        if pv.is_null() {
            target.remove(k);
            continue;
        }
        match (target.get_mut(k), pv) {
            (Some(Value::Object(tm)), Value::Object(pm)) => {
                let delete_self = pm.get("$patch").and_then(Value::as_str) == Some("delete");
                if delete_self {
                    target.remove(k);
                } else {
                    merge_map(tm, pm)?;
                }
            }
            (Some(Value::Array(tl)), Value::Array(pl)) => merge_list(k, tl, pl)?,
            (_, Value::Object(pm)) => {
                if pm.get("$patch").and_then(Value::as_str) == Some("delete") {
                    target.remove(k);
                } else {
                    let mut fresh = Map::new();
                    merge_map(&mut fresh, pm)?;
                    target.insert(k.clone(), Value::Object(fresh));
                }
            }
            (_, Value::Array(pl)) => {
                let mut fresh = Vec::new();
                merge_list(k, &mut fresh, pl)?;
                target.insert(k.clone(), Value::Array(fresh));
            }
            _ => {
                target.insert(k.clone(), pv.clone());
            }
        }
    }
    if let Some(keep) = patch.get("$retainKeys").and_then(Value::as_array) {
        let keep: Vec<&str> = keep.iter().filter_map(Value::as_str).collect();
        target.retain(|k, _| keep.contains(&k.as_str()));
    }
    Ok(())
}

fn merge_list(field: &str, target: &mut Vec<Value>, patch: &[Value]) -> Result<(), String> {
    let replace = patch
        .iter()
        .any(|v| v.get("$patch").and_then(Value::as_str) == Some("replace"));
    if replace {
        *target = patch
            .iter()
            .filter(|v| v.get("$patch").is_none())
            .cloned()
            .collect();
        return Ok(());
    }
    if is_primitive_merge(field) {
        for v in patch {
            if !target.contains(v) {
                target.push(v.clone());
            }
        }
        return Ok(());
    }
    let Some(key) = merge_key(field) else {
        *target = patch.to_vec();
        return Ok(());
    };
    for item in patch {
        let Some(pm) = item.as_object() else {
            return Err(format!(
                "list {field} must contain objects with merge key {key}"
            ));
        };
        let Some(kv) = pm.get(key) else {
            return Err(format!(
                "map: {item} does not contain declared merge key: {key}"
            ));
        };
        let pos = target.iter().position(|t| t.get(key) == Some(kv));
        let delete = pm.get("$patch").and_then(Value::as_str) == Some("delete");
        match (pos, delete) {
            (Some(i), true) => {
                target.remove(i);
            }
            (None, true) => {}
            (Some(i), false) => {
                if let Some(tm) = target[i].as_object_mut() {
                    merge_map(tm, pm)?;
                }
            }
            (None, false) => {
                let mut fresh = Map::new();
                merge_map(&mut fresh, pm)?;
                target.push(Value::Object(fresh));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn finalizers_merge_as_a_set_and_delete_from_primitive_list() {
        let mut o = json!({"metadata": {"finalizers": ["a", "b"]}});
        strategic_merge(&mut o, &json!({"metadata": {"finalizers": ["b", "c"]}})).unwrap();
        assert_eq!(o["metadata"]["finalizers"], json!(["a", "b", "c"]));
        strategic_merge(
            &mut o,
            &json!({"metadata": {"$deleteFromPrimitiveList/finalizers": ["a"]}}),
        )
        .unwrap();
        assert_eq!(o["metadata"]["finalizers"], json!(["b", "c"]));
    }

    #[test]
    fn keyed_lists_merge_by_key_and_other_lists_are_replaced() {
        let mut o = json!({"status": {"conditions": [{"type": "A", "status": "True"}, {"type": "B", "status": "False"}]},
                           "spec": {"accessModes": ["ReadWriteOnce"]}});
        strategic_merge(
            &mut o,
            &json!({"status": {"conditions": [{"type": "B", "status": "True"}, {"type": "A", "$patch": "delete"}]},
                    "spec": {"accessModes": ["ReadOnlyMany"]}}),
        )
        .unwrap();
        assert_eq!(
            o["status"]["conditions"],
            json!([{"type": "B", "status": "True"}])
        );
        assert_eq!(o["spec"]["accessModes"], json!(["ReadOnlyMany"]));
    }

    #[test]
    fn null_deletes_and_retain_keys() {
        let mut o =
            json!({"metadata": {"annotations": {"a": "1", "b": "2"}}, "spec": {"x": 1, "y": 2}});
        strategic_merge(&mut o, &json!({"metadata": {"annotations": {"a": null}}, "spec": {"$retainKeys": ["y"], "y": 3}}))
            .unwrap();
        assert_eq!(
            o,
            json!({"metadata": {"annotations": {"b": "2"}}, "spec": {"y": 3}})
        );
    }
}
