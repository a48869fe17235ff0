//! Discovery documents: /version, /api, /apis, group and group-version resource lists.

use serde_json::{Value, json};

use crate::resources::{GROUPS, RESOURCES, ResourceDef};

pub fn version() -> Value {
    json!({
        "major": "1",
        "minor": "33",
        "gitVersion": "v1.33.0-kube-sim",
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2025-08-27T00:00:00Z",
        "goVersion": "go1.24.6",
        "compiler": "gc",
        "platform": "linux/amd64"
    })
}

pub fn api_versions(server: &str) -> Value {
    json!({
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server}]
    })
}

fn group_doc(g: &str) -> Value {
    // Every group serves one version: v1, except gateway.networking.k8s.io (v1beta1).
    let version = crate::resources::RESOURCES
        .iter()
        .find(|r| r.group == g)
        .map_or("v1", |r| r.version);
    let gv = json!({"groupVersion": format!("{g}/{version}"), "version": version});
    json!({"name": g, "versions": [gv.clone()], "preferredVersion": gv})
}

pub fn api_group_list() -> Value {
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": GROUPS.iter().map(|g| group_doc(g)).collect::<Vec<_>>()})
}

pub fn api_group(g: &str) -> Option<Value> {
    GROUPS.contains(&g).then(|| {
        let mut d = group_doc(g);
        d["kind"] = json!("APIGroup");
        d["apiVersion"] = json!("v1");
        d
    })
}

fn resource_entry(r: &ResourceDef) -> Value {
    let mut e = json!({
        "name": r.plural,
        "singularName": r.singular,
        "namespaced": r.namespaced,
        "kind": r.kind,
        "verbs": ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"],
    });
    if !r.short_names.is_empty() {
        e["shortNames"] = json!(r.short_names);
    }
    if r.plural == "pods" {
        e["categories"] = json!(["all"]);
    }
    e
}

pub fn resource_list(group: &str, version: &str) -> Option<Value> {
    let rs: Vec<&ResourceDef> = RESOURCES
        .iter()
        .filter(|r| r.group == group && r.version == version)
        .collect();
    if rs.is_empty() {
        return None;
    }
    let mut out = Vec::new();
    for r in rs {
        out.push(resource_entry(r));
        if r.has_status {
            out.push(json!({"name": format!("{}/status", r.plural), "singularName": "", "namespaced": r.namespaced,
                            "kind": r.kind, "verbs": ["get", "patch", "update"]}));
        }
    }
    let gv = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    Some(
        json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": out}),
    )
}
