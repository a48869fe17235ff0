//! The minimum of OpenAPI that kubectl needs: a v3 index and per group-version documents that
//! declare the `fieldValidation` query parameter (so kubectl 1.2x leaves validation to the
//! server), and an empty protobuf v2 document (older kubectl validates against it and skips
//! kinds it does not describe).

use serde_json::{Map, Value, json};

use crate::resources::{RESOURCES, ResourceDef};

fn gv_key(r: &ResourceDef) -> String {
    if r.group.is_empty() {
        format!("api/{}", r.version)
    } else {
        format!("apis/{}/{}", r.group, r.version)
    }
}

/// `/openapi/v3`: where each group-version document lives.
pub fn v3_index() -> Value {
    let mut paths = Map::new();
    for r in RESOURCES {
        let k = gv_key(r);
        let url = format!("/openapi/v3/{k}?hash=kube-sim");
        paths.insert(k, json!({"serverRelativeURL": url}));
    }
    json!({"paths": paths})
}

fn param(name: &str, location: &str) -> Value {
    json!({"name": name, "in": location, "required": location == "path", "schema": {"type": "string", "uniqueItems": true}})
}

/// `/openapi/v3/api/v1` or `/openapi/v3/apis/<group>/<version>`.
pub fn v3_group_version(gv: &str) -> Option<Value> {
    let rs: Vec<&ResourceDef> = RESOURCES.iter().filter(|r| gv_key(r) == gv).collect();
    if rs.is_empty() {
        return None;
    }
    let mut paths = Map::new();
    for r in rs {
        let prefix = format!("/{}", gv_key(r));
        let base = if r.namespaced {
            format!("{prefix}/namespaces/{{namespace}}/{}", r.plural)
        } else {
            format!("{prefix}/{}", r.plural)
        };
        let gvk = json!({"group": r.group, "version": r.version, "kind": r.kind});
        let mut params = vec![param("name", "path")];
        if r.namespaced {
            params.push(param("namespace", "path"));
        }
        params.push(param("fieldValidation", "query"));
        params.push(param("dryRun", "query"));
        params.push(param("fieldManager", "query"));
        // No strategic-merge content type: kubectl then builds patches from its compiled-in types.
        let body = json!({"content": {"application/json-patch+json": {"schema": {"type": "object"}},
                                      "application/merge-patch+json": {"schema": {"type": "object"}}}});
        // kubectl reads the parameters of the operation itself, not of the path.
        let op = |action: &str, params: &[Value]| {
            json!({"operationId": format!("{action}{}", r.kind), "x-kubernetes-action": action, "x-kubernetes-group-version-kind": gvk,
                   "requestBody": body, "parameters": params, "responses": {"200": {"description": "OK"}}})
        };
        paths.insert(
            format!("{base}/{{name}}"),
            json!({"patch": op("patch", &params), "put": op("put", &params)}),
        );
        let mut cparams = vec![param("fieldValidation", "query"), param("dryRun", "query")];
        if r.namespaced {
            cparams.push(param("namespace", "path"));
        }
        paths.insert(base, json!({"post": op("post", &cparams)}));
    }
    Some(
        json!({"openapi": "3.0.0", "info": {"title": "Kubernetes", "version": "v1.33.0"}, "paths": paths, "components": {"schemas": {}}}),
    )
}

fn pb_field(out: &mut Vec<u8>, field: u8, bytes: &[u8]) {
    out.push((field << 3) | 2);
    let mut n = bytes.len();
    loop {
        let b = (n & 0x7f) as u8;
        n >>= 7;
        if n == 0 {
            out.push(b);
            break;
        }
        out.push(b | 0x80);
    }
    out.extend_from_slice(bytes);
}

/// `/openapi/v2` as `openapi_v2.Document` protobuf: swagger "2.0", info, empty paths.
pub fn v2_protobuf() -> Vec<u8> {
    let mut info = Vec::new();
    pb_field(&mut info, 1, b"Kubernetes");
    pb_field(&mut info, 2, b"v1.33.0");
    let mut doc = Vec::new();
    pb_field(&mut doc, 1, b"2.0");
    pb_field(&mut doc, 2, &info);
    pb_field(&mut doc, 8, &[]);
    doc
}

/// `/openapi/v2` as JSON for clients that ask for it.
pub fn v2_json() -> Value {
    json!({"swagger": "2.0", "info": {"title": "Kubernetes", "version": "v1.33.0"}, "paths": {}, "definitions": {}})
}
