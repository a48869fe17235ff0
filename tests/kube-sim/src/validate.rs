//! Validation of the fields this project writes, with the real server's field paths and texts.

use serde_json::Value;

use crate::error::Cause;
use crate::resources::ResourceDef;

const SUBDOMAIN_MSG: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";
const LABEL_MSG: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')";

fn is_label(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
}

/// Name rules: namespaces are DNS labels, everything else DNS subdomains.
pub fn name_causes(rd: &ResourceDef, name: &str) -> Vec<Cause> {
    let v = Value::String(name.to_string());
    let mut out = Vec::new();
    if rd.plural == crate::resources::NAMESPACES {
        if name.len() > 63 {
            out.push(Cause::invalid(
                "metadata.name",
                &v,
                "must be no more than 63 characters",
            ));
        }
        if !is_label(name) {
            out.push(Cause::invalid("metadata.name", &v, LABEL_MSG));
        }
    } else {
        if name.len() > 253 {
            out.push(Cause::invalid(
                "metadata.name",
                &v,
                "must be no more than 253 characters",
            ));
        }
        if !name.split('.').all(is_label) {
            out.push(Cause::invalid("metadata.name", &v, SUBDOMAIN_MSG));
        }
    }
    out
}

const ACCESS_MODES: &[&str] = &[
    "ReadOnlyMany",
    "ReadWriteMany",
    "ReadWriteOnce",
    "ReadWriteOncePod",
];
const PV_SOURCES: &[&str] = &[
    "hostPath",
    "gcePersistentDisk",
    "awsElasticBlockStore",
    "nfs",
    "iscsi",
    "glusterfs",
    "rbd",
    "cinder",
    "cephfs",
    "fc",
    "flocker",
    "flexVolume",
    "azureFile",
    "vsphereVolume",
    "quobyte",
    "azureDisk",
    "photonPersistentDisk",
    "portworxVolume",
    "scaleIO",
    "local",
    "storageos",
    "csi",
];

fn str_at<'a>(v: &'a Value, ptr: &str) -> &'a str {
    v.pointer(ptr).and_then(Value::as_str).unwrap_or("")
}

fn access_modes(obj: &Value, out: &mut Vec<Cause>, required_detail: &str) {
    match obj.pointer("/spec/accessModes").and_then(Value::as_array) {
        Some(m) if !m.is_empty() => {
            for mode in m {
                if !mode.as_str().is_some_and(|s| ACCESS_MODES.contains(&s)) {
                    out.push(Cause::not_supported("spec.accessModes", mode, ACCESS_MODES));
                }
            }
        }
        _ => out.push(Cause::required("spec.accessModes", required_detail)),
    }
}

fn pv(obj: &Value, out: &mut Vec<Cause>) {
    // In kube-apiserver's order: access modes, then capacity, which when missing is both
    // Required and NotSupported (Go prints the missing map as `core.ResourceList(nil)`).
    access_modes(obj, out, "");
    let cap = obj.pointer("/spec/capacity").and_then(Value::as_object);
    let unsupported = |shown: String| {
        Cause::new(
            crate::error::CauseKind::NotSupported,
            "spec.capacity",
            &format!("{shown}: supported values: \"storage\""),
        )
    };
    match cap {
        None => {
            out.push(Cause::required("spec.capacity", ""));
            out.push(unsupported("core.ResourceList(nil)".into()));
        }
        Some(c) if c.is_empty() => {
            out.push(Cause::required("spec.capacity", ""));
            out.push(unsupported("core.ResourceList{}".into()));
        }
        Some(c) => {
            if !c.contains_key("storage") || c.len() > 1 {
                out.push(Cause::not_supported(
                    "spec.capacity",
                    &Value::Object(c.clone()),
                    &["storage"],
                ));
            }
        }
    }
    let spec = obj.get("spec").and_then(Value::as_object);
    let sources: Vec<&&str> = PV_SOURCES
        .iter()
        .filter(|s| spec.is_some_and(|m| m.contains_key(**s)))
        .collect();
    match sources.len() {
        0 => out.push(Cause::required("spec", "must specify a volume type")),
        1 => {}
        _ => out.push(Cause::forbidden(
            &format!("spec.{}", sources[1]),
            "may not specify more than 1 volume type",
        )),
    }
    if sources.first().is_some_and(|s| **s == "csi") {
        if str_at(obj, "/spec/csi/driver").is_empty() {
            out.push(Cause::required("spec.csi.driver", ""));
        }
        if str_at(obj, "/spec/csi/volumeHandle").is_empty() {
            out.push(Cause::required("spec.csi.volumeHandle", ""));
        }
    }
    if sources.first().is_some_and(|s| **s == "local")
        && obj.pointer("/spec/nodeAffinity").is_none()
    {
        out.push(Cause::required(
            "spec.nodeAffinity",
            "Local volume requires node affinity",
        ));
    }
    if let Some(p) = obj.pointer("/spec/persistentVolumeReclaimPolicy")
        && !p
            .as_str()
            .is_some_and(|s| ["Delete", "Recycle", "Retain"].contains(&s))
    {
        out.push(Cause::not_supported(
            "spec.persistentVolumeReclaimPolicy",
            p,
            &["Delete", "Recycle", "Retain"],
        ));
    }
    volume_mode(obj, out);
}

fn volume_mode(obj: &Value, out: &mut Vec<Cause>) {
    if let Some(m) = obj.pointer("/spec/volumeMode")
        && !m
            .as_str()
            .is_some_and(|s| s == "Block" || s == "Filesystem")
    {
        out.push(Cause::not_supported(
            "spec.volumeMode",
            m,
            &["Block", "Filesystem"],
        ));
    }
}

fn pvc(obj: &Value, out: &mut Vec<Cause>) {
    access_modes(obj, out, "at least 1 access mode is required");
    if obj.pointer("/spec/resources/requests/storage").is_none() {
        out.push(Cause::required("spec.resources[storage]", ""));
    }
    volume_mode(obj, out);
}

fn storage_class(obj: &Value, out: &mut Vec<Cause>) {
    if str_at(obj, "/provisioner").is_empty() {
        out.push(Cause::required("provisioner", ""));
    }
    if let Some(p) = obj.get("reclaimPolicy")
        && !p.as_str().is_some_and(|s| s == "Delete" || s == "Retain")
    {
        out.push(Cause::not_supported(
            "reclaimPolicy",
            p,
            &["Delete", "Retain"],
        ));
    }
    if let Some(m) = obj.get("volumeBindingMode")
        && !m
            .as_str()
            .is_some_and(|s| s == "Immediate" || s == "WaitForFirstConsumer")
    {
        out.push(Cause::not_supported(
            "volumeBindingMode",
            m,
            &["Immediate", "WaitForFirstConsumer"],
        ));
    }
}

fn pod(obj: &Value, out: &mut Vec<Cause>) {
    match obj.pointer("/spec/containers").and_then(Value::as_array) {
        Some(c) if !c.is_empty() => {
            for (i, c) in c.iter().enumerate() {
                if str_at(c, "/name").is_empty() {
                    out.push(Cause::required(&format!("spec.containers[{i}].name"), ""));
                }
                if str_at(c, "/image").is_empty() {
                    out.push(Cause::required(&format!("spec.containers[{i}].image"), ""));
                }
            }
        }
        _ => out.push(Cause::required("spec.containers", "")),
    }
}

/// Event rules shared by both API versions (the store form is core/v1).
fn event(obj: &Value, events_v1: bool, out: &mut Vec<Cause>) {
    let ns = str_at(obj, "/metadata/namespace");
    let inv_ns = str_at(obj, "/involvedObject/namespace");
    let inv_ns_v = Value::String(inv_ns.to_string());
    let has_time = obj.get("eventTime").is_some_and(|t| !t.is_null());
    if events_v1 {
        if !has_time {
            out.push(Cause::required("eventTime", ""));
        }
        let ty = obj.get("type").cloned().unwrap_or(Value::Null);
        if !ty.as_str().is_some_and(|t| t == "Normal" || t == "Warning") {
            out.push(Cause::invalid(
                "type",
                &Value::String(String::new()),
                &format!("has invalid value: {}", ty.as_str().unwrap_or("")),
            ));
        }
    }
    if !has_time {
        let ok = if inv_ns.is_empty() {
            ns.is_empty() || ns == "default"
        } else {
            ns == inv_ns
        };
        if !ok {
            out.push(Cause::invalid(
                "involvedObject.namespace",
                &inv_ns_v,
                "does not match event.namespace",
            ));
        }
        return;
    }
    if inv_ns.is_empty() && ns != "default" && ns != "kube-system" {
        out.push(Cause::invalid(
            "involvedObject.namespace",
            &inv_ns_v,
            "does not match event.namespace",
        ));
    }
    let ctl = if events_v1 {
        "reportingController"
    } else {
        "reportingComponent"
    };
    if str_at(obj, "/reportingComponent").is_empty() {
        out.push(Cause::required(ctl, ""));
    }
    if str_at(obj, "/reportingInstance").is_empty() {
        out.push(Cause::required("reportingInstance", ""));
    }
    if str_at(obj, "/action").is_empty() {
        out.push(Cause::required("action", ""));
    }
    if str_at(obj, "/reason").is_empty() {
        out.push(Cause::required("reason", ""));
    }
    let note = str_at(obj, "/message");
    if note.len() > 1024 {
        let f = if events_v1 { "note" } else { "message" };
        out.push(Cause::invalid(
            f,
            &Value::String(String::new()),
            "can have at most 1024 characters",
        ));
    }
}

/// Validates the stored (core) form of an object for create or update.
pub fn object_causes(rd: &ResourceDef, obj: &Value) -> Vec<Cause> {
    let mut out = Vec::new();
    match (rd.group, rd.plural) {
        ("", "persistentvolumes") => pv(obj, &mut out),
        ("", "persistentvolumeclaims") => pvc(obj, &mut out),
        ("", "pods") => pod(obj, &mut out),
        ("", "events") => event(obj, false, &mut out),
        ("events.k8s.io", "events") => event(obj, true, &mut out),
        ("storage.k8s.io", "storageclasses") => storage_class(obj, &mut out),
        _ => {}
    }
    out
}

/// Rules that compare an update with the stored object.
pub fn update_causes(rd: &ResourceDef, old: &Value, new: &Value) -> Vec<Cause> {
    let mut out = Vec::new();
    if old
        .pointer("/metadata/deletionTimestamp")
        .is_some_and(|t| !t.is_null())
    {
        let before: Vec<&Value> = old
            .pointer("/metadata/finalizers")
            .and_then(Value::as_array)
            .map(|a| a.iter().collect())
            .unwrap_or_default();
        // Sorted and de-duplicated, as Go's sets.String.List() prints them.
        let added: Vec<String> = new
            .pointer("/metadata/finalizers")
            .and_then(Value::as_array)
            .map(|a| {
                let set: std::collections::BTreeSet<String> = a
                    .iter()
                    .filter(|f| !before.contains(f))
                    .map(|f| format!("{:?}", f.as_str().unwrap_or("")))
                    .collect();
                set.into_iter().collect()
            })
            .unwrap_or_default();
        if !added.is_empty() {
            out.push(Cause::forbidden(
                "metadata.finalizers",
                &format!("no new finalizers can be added if the object is being deleted, found new finalizers []string{{{}}}", added.join(", ")),
            ));
        }
    }
    match (rd.group, rd.plural) {
        ("", "persistentvolumeclaims") => {
            let mut o = old.get("spec").cloned().unwrap_or(Value::Null);
            let n = new.get("spec").cloned().unwrap_or(Value::Null);
            // The binder sets volumeName once; requests and the attributes class may change.
            if let (Some(om), Some(nm)) = (o.as_object_mut(), n.as_object()) {
                if om.get("volumeName").is_none_or(|v| v.as_str() == Some("")) {
                    match nm.get("volumeName") {
                        Some(v) => om.insert("volumeName".into(), v.clone()),
                        None => om.remove("volumeName"),
                    };
                }
                match nm.get("volumeAttributesClassName") {
                    Some(v) => om.insert("volumeAttributesClassName".into(), v.clone()),
                    None => om.remove("volumeAttributesClassName"),
                };
                if let (Some(r), Some(nr)) = (om.get_mut("resources"), nm.get("resources")) {
                    *r = nr.clone();
                }
            }
            if o != n {
                out.push(Cause::forbidden(
                    "spec",
                    "spec is immutable after creation except resources.requests and volumeAttributesClassName for bound claims",
                ));
            }
        }
        ("", "persistentvolumes") => {
            let src = |v: &Value| -> Option<Value> {
                PV_SOURCES
                    .iter()
                    .find_map(|s| v.pointer(&format!("/spec/{s}")).cloned())
            };
            if src(old) != src(new) {
                out.push(Cause::forbidden(
                    "spec.persistentvolumesource",
                    "spec.persistentvolumesource is immutable after creation",
                ));
            }
        }
        ("storage.k8s.io", "storageclasses") => {
            if old.get("parameters") != new.get("parameters") {
                out.push(Cause::forbidden(
                    "parameters",
                    "updates to parameters are forbidden.",
                ));
            }
            if old.get("provisioner") != new.get("provisioner") {
                out.push(Cause::forbidden(
                    "provisioner",
                    "updates to provisioner are forbidden.",
                ));
            }
            if old.get("reclaimPolicy") != new.get("reclaimPolicy") {
                out.push(Cause::forbidden(
                    "reclaimPolicy",
                    "updates to reclaimPolicy are forbidden.",
                ));
            }
            if old.get("volumeBindingMode") != new.get("volumeBindingMode") {
                out.push(Cause::forbidden("volumeBindingMode", "field is immutable"));
            }
        }
        _ => {}
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn pv_needs_capacity_source_and_modes() {
        let rd = crate::resources::core("persistentvolumes");
        let c = object_causes(rd, &json!({"spec": {}}));
        let fields: Vec<_> = c.iter().map(Cause::full).collect();
        assert_eq!(
            fields,
            [
                "spec.accessModes: Required value",
                "spec.capacity: Required value",
                "spec.capacity: Unsupported value: core.ResourceList(nil): supported values: \"storage\"",
                "spec: Required value: must specify a volume type"
            ]
        );
        assert!(object_causes(rd, &json!({"spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"], "csi": {"driver": "d", "volumeHandle": "h"}}})).is_empty());
    }

    #[test]
    fn names() {
        let rd = crate::resources::core("persistentvolumes");
        assert!(name_causes(rd, "pvc-1.a").is_empty());
        assert_eq!(name_causes(rd, "Bad_Name").len(), 1);
        assert_eq!(
            name_causes(crate::resources::core("namespaces"), "a.b").len(),
            1
        );
    }
}
