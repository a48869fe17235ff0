//! What a world leaves behind, normalised so two worlds compare: object UIDs, volume and snapshot
//! ids and the provisioner identity become stable tokens; times, resourceVersions and counts go.
//! The result is flat: one line per leaf, `path = value`, so a difference names its field.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use serde_json::{Map, Value, json};

use crate::world::{Tokens, World};

/// A flattened, normalised outcome: path -> JSON text of the value.
pub type Outcome = BTreeMap<String, String>;

/// Observes the world once (kube-sim's store, read without requests, or the real API server's
/// lists, and the drivers).
pub async fn observe(world: &mut World) -> Outcome {
    let states = world.states().await;
    let claims = world.objects("persistentvolumeclaims").await;
    for c in &claims {
        if let Ok(meta) = serde_json::from_value::<kube::api::ObjectMeta>(c["metadata"].clone()) {
            world.remember("PersistentVolumeClaim", &meta);
        }
    }
    let mut doc = Map::new();
    for pv in world.objects("persistentvolumes").await {
        let name = pv["metadata"]["name"].as_str().unwrap_or("?").to_owned();
        doc.insert(format!("pv/{name}"), pv_view(&pv));
    }
    for c in &claims {
        let key = format!(
            "claim/{}/{}",
            c["metadata"]["namespace"].as_str().unwrap_or(""),
            c["metadata"]["name"].as_str().unwrap_or("?")
        );
        doc.insert(key, claim_view(c));
    }
    for plural in ["volumesnapshots", "volumesnapshotcontents"] {
        for o in world.objects(plural).await {
            let key = format!(
                "{plural}/{}{}",
                o["metadata"]["namespace"]
                    .as_str()
                    .map(|n| format!("{n}/"))
                    .unwrap_or_default(),
                o["metadata"]["name"].as_str().unwrap_or("?")
            );
            doc.insert(key, meta_view(&o));
        }
    }
    // Capacity objects by namespace, class and segment: their names are generated.
    for c in world.objects("csistoragecapacities").await {
        let segment: Vec<String> = c["nodeTopology"]["matchLabels"]
            .as_object()
            .into_iter()
            .flatten()
            .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
            .collect();
        let key = format!(
            "capacity/{}/{}[{}]",
            c["metadata"]["namespace"].as_str().unwrap_or(""),
            c["storageClassName"].as_str().unwrap_or("?"),
            segment.join(",")
        );
        let mut view = meta_view(&c);
        for field in ["capacity", "maximumVolumeSize"] {
            if let Some(v) = c.get(field).filter(|v| !v.is_null()) {
                view[field] = v.clone();
            }
        }
        doc.insert(key, view);
    }
    // Events as a set: repeats and their counts depend on timing, their texts do not.
    let mut events: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for e in world.objects("events").await {
        let o = &e["involvedObject"];
        // The real control plane's own events on Nodes and Pods (the node lifecycle controller
        // and the scheduler) follow its clocks, not the sidecar; kube-sim makes none, and no
        // sidecar writes any.
        if world.is_real() && (o["kind"] == "Node" || o["kind"] == "Pod") {
            continue;
        }
        let key = format!(
            "event/{} {}{} {} {}: {}",
            o["kind"].as_str().unwrap_or(""),
            o["namespace"]
                .as_str()
                .filter(|n| !n.is_empty())
                .map(|n| format!("{n}/"))
                .unwrap_or_default(),
            o["name"].as_str().unwrap_or(""),
            e["type"].as_str().unwrap_or(""),
            e["reason"].as_str().unwrap_or(""),
            e["message"].as_str().unwrap_or(""),
        );
        let source = e["source"]["component"]
            .as_str()
            .or_else(|| e["reportingComponent"].as_str())
            .unwrap_or("")
            .to_owned();
        events.entry(key).or_default().insert(source);
    }
    for (k, sources) in events {
        doc.insert(k, json!(sources));
    }
    let mut requests: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for s in &states {
        for v in &s.volumes {
            doc.insert(
                format!("volume/{}", v.name),
                json!({
                    "capacity": v.capacity_bytes,
                    "parameters": v.parameters,
                    "mutableParameters": v.mutable_parameters,
                    "contentSource": v.content_source,
                    "segment": v.segment,
                    "secretKeys": v.secret_keys,
                }),
            );
        }
        for r in &s.create_requests {
            let text = serde_json::to_string(r).unwrap_or_default();
            requests.entry(r.name.clone()).or_default().insert(text);
        }
    }
    for (name, distinct) in requests {
        // Retries of the same request are one; a request that changed between retries shows.
        let list: Vec<Value> = distinct
            .iter()
            .filter_map(|t| serde_json::from_str::<Value>(t).ok())
            .map(|mut v| {
                v.as_object_mut().map(|m| m.remove("name"));
                v
            })
            .collect();
        doc.insert(format!("request/{name}"), Value::Array(list));
    }
    for (i, t) in world.timeouts.iter().enumerate() {
        doc.insert(format!("timeout/{i}"), json!(t));
    }
    let normalised = normalise(Value::Object(doc), &world.tokens);
    let mut out = world.checkpoints.clone();
    if let Value::Object(m) = normalised {
        for (k, v) in m {
            flatten(&k, &v, &mut out);
        }
    }
    out
}

fn pick(v: &Value, keys: &[&str]) -> Value {
    let mut m = Map::new();
    for k in keys {
        if let Some(x) = v.get(*k).filter(|x| !x.is_null()) {
            m.insert((*k).to_owned(), x.clone());
        }
    }
    Value::Object(m)
}

fn meta_view(o: &Value) -> Value {
    let mut m = pick(&o["metadata"], &["labels", "annotations", "finalizers"]);
    if o["metadata"].get("deletionTimestamp").is_some() {
        m["deleting"] = json!(true);
    }
    json!({ "metadata": m })
}

fn pv_view(pv: &Value) -> Value {
    let mut v = meta_view(pv);
    let mut spec = pv["spec"].clone();
    if let Some(r) = spec.get_mut("claimRef").and_then(Value::as_object_mut) {
        r.remove("uid");
        r.remove("resourceVersion");
    }
    v["spec"] = spec;
    v["status"] = pick(&pv["status"], &["phase", "message", "reason"]);
    v
}

fn claim_view(c: &Value) -> Value {
    let mut v = meta_view(c);
    v["spec"] = pick(&c["spec"], &["volumeName"]);
    v["status"] = pick(&c["status"], &["phase", "capacity", "accessModes"]);
    v
}

/// Replaces every run-time identity inside strings (and map keys) by its token.
pub fn normalise(v: Value, tokens: &Tokens) -> Value {
    match v {
        Value::String(s) => Value::String(normalise_text(&s, tokens)),
        Value::Array(a) => Value::Array(a.into_iter().map(|x| normalise(x, tokens)).collect()),
        Value::Object(m) => Value::Object(
            m.into_iter()
                .map(|(k, x)| (normalise_text(&k, tokens), normalise(x, tokens)))
                .collect(),
        ),
        other => other,
    }
}

/// One string with UIDs, volume and snapshot ids and the provisioner identity replaced.
pub fn normalise_text(s: &str, tokens: &Tokens) -> String {
    let mut out = s.to_owned();
    // Ids first: a volume's name holds a claim UID that would otherwise be replaced inside it.
    for (id, name) in &tokens.volumes {
        if out.contains(id.as_str()) {
            out = out.replace(id.as_str(), &format!("<vol:{name}>"));
        }
    }
    for (id, name) in &tokens.snapshots {
        if out.contains(id.as_str()) {
            out = out.replace(id.as_str(), &format!("<snap:{name}>"));
        }
    }
    for (uid, token) in &tokens.uids {
        if out.contains(uid.as_str()) {
            out = out.replace(uid.as_str(), &format!("{{{token}}}"));
        }
        out = truncated_uid(&out, uid, token);
    }
    uuid_token(&identity_token(&out))
}

/// A UUID no token names (the random part of an event source such as
/// `<driver>_<host>_<uuid>`) becomes `<uuid>`, an RFC 3339 time in a message `<time>`.
fn uuid_token(s: &str) -> String {
    static UUID: std::sync::OnceLock<regex::Regex> = std::sync::OnceLock::new();
    let re = UUID.get_or_init(|| {
        regex::Regex::new("[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
            .expect("valid regex")
    });
    let s = re.replace_all(s, "<uuid>");
    static TIME: std::sync::OnceLock<regex::Regex> = std::sync::OnceLock::new();
    let time = TIME.get_or_init(|| {
        regex::Regex::new(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z").expect("valid regex")
    });
    time.replace_all(&s, "<time>").into_owned()
}

/// `--volume-name-uuid-length` names a volume by the first N characters of the claim's UID
/// without dashes: such a run becomes `{token~N}`.
fn truncated_uid(s: &str, uid: &str, token: &str) -> String {
    const MIN: usize = 8;
    let plain: Vec<u8> = uid.bytes().filter(|b| *b != b'-').collect();
    if plain.len() < MIN {
        return s.to_owned();
    }
    let head = std::str::from_utf8(&plain[..MIN]).unwrap_or_default();
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(at) = rest.find(head) {
        let tail = &rest.as_bytes()[at..];
        let n = tail.iter().zip(&plain).take_while(|(a, b)| a == b).count();
        out.push_str(&rest[..at]);
        out.push_str(&format!("{{{token}~{n}}}"));
        rest = &rest[at + n..];
    }
    out.push_str(rest);
    out
}

/// Upstream's provisioner identity is `<unix ms>-<random>-<driver>`; only its shape is compared.
fn identity_token(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = String::with_capacity(s.len());
    let mut i = 0;
    while i < s.len() {
        let rest = &s[i..];
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        let at_word_start = i == 0 || !bytes[i - 1].is_ascii_alphanumeric();
        if at_word_start && digits >= 12 && rest[digits..].starts_with('-') {
            let after = &rest[digits + 1..];
            let second = after.bytes().take_while(u8::is_ascii_digit).count();
            if second > 0 && after[second..].starts_with('-') {
                out.push_str("<ms>-<n>-");
                i += digits + 1 + second + 1;
                continue;
            }
        }
        let c = rest.chars().next().unwrap_or(' ');
        out.push(c);
        i += c.len_utf8();
    }
    out
}

fn segment(key: &str) -> String {
    if !key.is_empty() && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        format!(".{key}")
    } else {
        format!("[{key:?}]")
    }
}

/// Leaves of `v` under `path`; an empty map or list is a leaf of its own.
pub fn flatten(path: &str, v: &Value, out: &mut Outcome) {
    match v {
        Value::Object(m) if !m.is_empty() => {
            for (k, x) in m {
                flatten(&format!("{path}{}", segment(k)), x, out);
            }
        }
        Value::Array(a) if !a.is_empty() => {
            for (i, x) in a.iter().enumerate() {
                flatten(&format!("{path}[{i}]"), x, out);
            }
        }
        other => {
            out.insert(path.to_owned(), other.to_string());
        }
    }
}

/// Waits until the outcome has not changed for `quiet`; false when that did not happen within
/// `deadline`.
pub async fn settle(world: &mut World, quiet: Duration, deadline: Duration) -> bool {
    let start = tokio::time::Instant::now();
    let mut last = observe(world).await;
    let mut since = tokio::time::Instant::now();
    loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        world.crash_check().await;
        let now = observe(world).await;
        if now != last {
            last = now;
            since = tokio::time::Instant::now();
        } else if since.elapsed() >= quiet {
            return true;
        }
        if start.elapsed() > deadline {
            return false;
        }
    }
}

/// The metric families the world's sidecars serve now, as `metric/<family>` = `<type> [label
/// names]` (names and types only: values depend on timing). `go_*` is left out: the Go runtime's
/// own families, which a Rust binary cannot have (docs/observability.md).
// Shared with the crash-point suite, which compares no metrics.
#[allow(dead_code)]
pub async fn observe_metrics(world: &World) -> Outcome {
    let mut union: BTreeMap<String, crate::common::exposition::Family> = BTreeMap::new();
    for address in world.metrics.values() {
        let Some((_, body)) = crate::common::exposition::scrape(address, "/metrics", None).await
        else {
            // A sidecar stopped by the scenario.
            continue;
        };
        for (name, family) in crate::common::exposition::families(&body) {
            let entry = union.entry(name).or_insert_with(|| family.clone());
            entry.labels.extend(family.labels);
        }
    }
    union
        .into_iter()
        .filter(|(name, _)| !name.starts_with("go_"))
        .map(|(name, family)| {
            let labels: Vec<&str> = family.labels.iter().map(String::as_str).collect();
            (
                format!("metric/{name}"),
                format!("{} [{}]", family.kind, labels.join(",")),
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_uids_and_identity_become_tokens() {
        let mut t = Tokens::default();
        t.uids.insert("1111-2222".into(), "default/c1".into());
        t.volumes.insert("vol-abc".into(), "pvc-1111-2222".into());
        let s = normalise_text(
            "pvc-1111-2222 on vol-abc by 1732555555123-4321-mock.csi.rs",
            &t,
        );
        assert_eq!(
            s,
            "pvc-{default/c1} on <vol:pvc-{default/c1}> by <ms>-<n>-mock.csi.rs"
        );
        let v = normalise(json!({"h": "vol-abc"}), &t);
        assert_eq!(v["h"], "<vol:pvc-{default/c1}>");
    }

    #[test]
    fn a_uid_cut_short_without_dashes_is_still_its_claim() {
        let mut t = Tokens::default();
        t.uids.insert(
            "2179178f-aaaa-bbbb-cccc-ddddeeeeffff".into(),
            "default/c1".into(),
        );
        assert_eq!(
            normalise_text("data-2179178faa", &t),
            "data-{default/c1~10}"
        );
    }

    #[test]
    fn flat_paths_quote_keys_that_are_not_words() {
        let mut out = Outcome::new();
        flatten(
            "pv/x",
            &json!({"metadata": {"annotations": {"a.b/c": "1"}, "finalizers": []}, "n": [1, 2]}),
            &mut out,
        );
        assert_eq!(out["pv/x.metadata.annotations[\"a.b/c\"]"], "\"1\"");
        assert_eq!(out["pv/x.metadata.finalizers"], "[]");
        assert_eq!(out["pv/x.n[1]"], "2");
    }

    #[test]
    fn short_numbers_are_not_identities() {
        assert_eq!(identity_token("pvc-12-3"), "pvc-12-3");
        assert_eq!(identity_token("x 123456789012-7-d"), "x <ms>-<n>-d");
    }
}
