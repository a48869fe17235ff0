//! REST semantics on the store: create, update, patch, delete, get and list, with the real
//! server's preconditions, system fields, defaults, admission and validation.

use std::sync::Arc;

use serde_json::{Map, Value, json};

use crate::convert::{to_external, to_internal};
use crate::error::{ApiError, Cause};
use crate::resources::{self, ResourceDef};
use crate::store::Store;
use crate::util::{b64_encode, name_suffix, now};
use crate::validate;

pub const PV_PROTECTION: &str = "kubernetes.io/pv-protection";
pub const PVC_PROTECTION: &str = "kubernetes.io/pvc-protection";
const DEFAULT_CLASS_ANN: &str = "storageclass.kubernetes.io/is-default-class";

/// Server-side behaviour switches that are not control loops (admission plugins).
#[derive(Debug, Clone)]
pub struct Policy {
    /// StorageObjectInUseProtection: add pv/pvc-protection finalizers on create.
    pub protection_finalizers: bool,
}

/// Which part of an object a write addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sub {
    Main,
    Status,
}

pub fn meta(v: &Value) -> &Value {
    v.get("metadata").unwrap_or(&Value::Null)
}

pub fn meta_str<'a>(v: &'a Value, field: &str) -> &'a str {
    meta(v).get(field).and_then(Value::as_str).unwrap_or("")
}

pub fn meta_mut(v: &mut Value) -> &mut Map<String, Value> {
    if !v.is_object() {
        *v = json!({});
    }
    let obj = v.as_object_mut().expect("just made an object");
    let m = obj.entry("metadata").or_insert_with(|| json!({}));
    if !m.is_object() {
        *m = json!({});
    }
    m.as_object_mut().expect("just made an object")
}

pub fn is_deleting(v: &Value) -> bool {
    meta(v)
        .get("deletionTimestamp")
        .is_some_and(|t| !t.is_null())
}

pub fn finalizers(v: &Value) -> Vec<String> {
    meta(v)
        .get("finalizers")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(String::from)
                .collect()
        })
        .unwrap_or_default()
}

pub fn annotation<'a>(v: &'a Value, key: &str) -> Option<&'a str> {
    meta(v)
        .get("annotations")
        .and_then(|a| a.get(key))
        .and_then(Value::as_str)
}

pub fn set_annotation(v: &mut Value, key: &str, val: &str) {
    let m = meta_mut(v);
    let a = m.entry("annotations").or_insert_with(|| json!({}));
    if !a.is_object() {
        *a = json!({});
    }
    a[key] = json!(val);
}

/// Stamps apiVersion/kind of the stored form.
fn stamp_type(rd: &ResourceDef, v: &mut Value) {
    let storage_rd = resources::by_storage(rd.storage).unwrap_or(rd);
    v["apiVersion"] = json!(storage_rd.api_version());
    v["kind"] = json!(storage_rd.kind);
}

fn expect_object(rd: &ResourceDef, body: Value) -> Result<Value, ApiError> {
    if !body.is_object() {
        return Err(ApiError::bad_request(format!(
            "the object provided is unrecognized (must be of type {})",
            rd.kind
        )));
    }
    if let Some(k) = body.get("kind").and_then(Value::as_str)
        && !k.is_empty()
        && k != rd.kind
    {
        return Err(ApiError::bad_request(format!(
            "{k} in version {:?} cannot be handled as a {}: the kind in the body does not match the resource",
            body.get("apiVersion").and_then(Value::as_str).unwrap_or(""),
            rd.kind
        )));
    }
    Ok(body)
}

pub fn get(st: &Store, rd: &ResourceDef, ns: &str, name: &str) -> Result<Arc<Value>, ApiError> {
    st.get(rd.storage, ns, name)
        .ok_or_else(|| ApiError::not_found(rd, name))
}

fn check_namespace(st: &Store, rd: &ResourceDef, ns: &str) -> Result<(), ApiError> {
    if !rd.namespaced {
        return Ok(());
    }
    match st.get(resources::NAMESPACES, "", ns) {
        None => Err(ApiError::namespace_not_found(ns)),
        Some(n) if is_deleting(&n) => Err(ApiError::forbidden(format!(
            "unable to create new content in namespace {ns} because it is being terminated"
        ))
        .with_forbidden_details(rd, ns)),
        Some(_) => Ok(()),
    }
}

impl ApiError {
    fn with_forbidden_details(mut self, rd: &ResourceDef, _ns: &str) -> Self {
        self.details = json!({"kind": rd.plural});
        self
    }
}

fn apply_defaults(rd: &ResourceDef, v: &mut Value) {
    let set_default = |v: &mut Value, ptr: &[&str], val: Value| {
        let mut cur = v;
        for (i, k) in ptr.iter().enumerate() {
            if !cur.is_object() {
                return;
            }
            if i == ptr.len() - 1 {
                if cur.get(*k).is_none_or(Value::is_null) {
                    cur[*k] = val;
                }
                return;
            }
            if cur.get(*k).is_none_or(Value::is_null) {
                cur[*k] = json!({});
            }
            cur = &mut cur[*k];
        }
    };
    match (rd.group, rd.plural) {
        ("", "persistentvolumes") => {
            set_default(
                v,
                &["spec", "persistentVolumeReclaimPolicy"],
                json!("Retain"),
            );
            set_default(v, &["spec", "volumeMode"], json!("Filesystem"));
        }
        ("", "persistentvolumeclaims") => {
            set_default(v, &["spec", "volumeMode"], json!("Filesystem"))
        }
        ("storage.k8s.io", "storageclasses") => {
            set_default(v, &["reclaimPolicy"], json!("Delete"));
            set_default(v, &["volumeBindingMode"], json!("Immediate"));
        }
        ("", "namespaces") => {
            set_default(v, &["spec", "finalizers"], json!(["kubernetes"]));
            let name = meta_str(v, "name").to_string();
            let m = meta_mut(v);
            let labels = m.entry("labels").or_insert_with(|| json!({}));
            if labels.is_object() {
                labels["kubernetes.io/metadata.name"] = json!(name);
            }
        }
        ("", "pods") => {
            set_default(v, &["spec", "restartPolicy"], json!("Always"));
            set_default(v, &["spec", "schedulerName"], json!("default-scheduler"));
        }
        _ => {}
    }
}

/// Conversions the real server applies on every write (Secret `stringData` folds into
/// base64 `data`, default `type`; empty `omitempty` metadata lists and maps are dropped, as Go's
/// encoding never stores them: a finalizer list emptied by a patch reads back absent).
fn normalize(rd: &ResourceDef, v: &mut Value) {
    if let Some(meta) = v.get_mut("metadata").and_then(Value::as_object_mut) {
        for key in [
            "finalizers",
            "labels",
            "annotations",
            "ownerReferences",
            "managedFields",
        ] {
            let empty = match meta.get(key) {
                Some(Value::Array(a)) => a.is_empty(),
                Some(Value::Object(o)) => o.is_empty(),
                Some(Value::Null) => true,
                _ => false,
            };
            if empty {
                meta.remove(key);
            }
        }
    }
    if rd.group.is_empty() && rd.plural == "secrets" {
        if let Some(sd) = v.as_object_mut().and_then(|m| m.remove("stringData"))
            && let Some(sd) = sd.as_object()
        {
            if !v.get("data").is_some_and(Value::is_object) {
                v["data"] = json!({});
            }
            for (k, val) in sd {
                v["data"][k] = json!(b64_encode(val.as_str().unwrap_or("").as_bytes()));
            }
        }
        if v.get("type").is_none_or(Value::is_null) {
            v["type"] = json!("Opaque");
        }
    }
}

/// Status a new object starts with, as each type's PrepareForCreate sets it.
fn initial_status(rd: &ResourceDef, v: &mut Value) {
    let Some(m) = v.as_object_mut() else { return };
    match (rd.group, rd.plural) {
        ("", "persistentvolumes") => {
            m.insert(
                "status".into(),
                json!({"phase": "Pending", "lastPhaseTransitionTime": now()}),
            );
        }
        ("", "persistentvolumeclaims") => {
            m.insert("status".into(), json!({"phase": "Pending"}));
        }
        ("", "pods") => {
            m.insert(
                "status".into(),
                json!({"phase": "Pending", "qosClass": "BestEffort"}),
            );
        }
        ("", "namespaces") => {
            m.insert("status".into(), json!({"phase": "Active"}));
        }
        _ if rd.custom && rd.has_status => {
            m.remove("status");
        }
        _ => {}
    }
}

fn add_finalizer(v: &mut Value, f: &str) {
    let m = meta_mut(v);
    let list = m.entry("finalizers").or_insert_with(|| json!([]));
    if let Some(a) = list.as_array_mut()
        && !a.iter().any(|x| x == f)
    {
        a.push(json!(f));
    }
}

/// The default StorageClass: the newest one annotated as default, as the admission plugin picks.
pub fn default_storage_class(st: &Store) -> Option<String> {
    let mut defaults: Vec<Arc<Value>> = st
        .list(resources::STORAGE_CLASSES, None)
        .into_iter()
        .filter(|sc| {
            annotation(sc, DEFAULT_CLASS_ANN) == Some("true")
                || annotation(sc, "storageclass.beta.kubernetes.io/is-default-class")
                    == Some("true")
        })
        .collect();
    defaults.sort_by(|a, b| {
        meta_str(b, "creationTimestamp")
            .cmp(meta_str(a, "creationTimestamp"))
            .then_with(|| meta_str(a, "name").cmp(meta_str(b, "name")))
    });
    defaults.first().map(|sc| meta_str(sc, "name").to_string())
}

fn admit_create(st: &Store, pol: &Policy, rd: &ResourceDef, v: &mut Value) {
    match (rd.group, rd.plural) {
        ("", "persistentvolumes") if pol.protection_finalizers => add_finalizer(v, PV_PROTECTION),
        ("", "persistentvolumeclaims") => {
            if pol.protection_finalizers {
                add_finalizer(v, PVC_PROTECTION);
            }
            if v.pointer("/spec/storageClassName")
                .is_none_or(Value::is_null)
                && let Some(sc) = default_storage_class(st)
            {
                v["spec"]["storageClassName"] = json!(sc);
            }
        }
        _ => {}
    }
}

pub fn create(
    st: &mut Store,
    pol: &Policy,
    rd: &'static ResourceDef,
    ns: &str,
    body: Value,
    dry: bool,
) -> Result<Value, ApiError> {
    create_keeping_uid(st, pol, rd, ns, body, dry, None)
}

/// [`create`], but with `uid` instead of a fresh one: a test hook for an object restored under its
/// old identity (as an etcd restore would), which no API request can do.
pub fn create_keeping_uid(
    st: &mut Store,
    pol: &Policy,
    rd: &'static ResourceDef,
    ns: &str,
    body: Value,
    dry: bool,
    uid: Option<&str>,
) -> Result<Value, ApiError> {
    let body = expect_object(rd, body)?;
    let ext_causes = if rd.is_events_v1() {
        validate::object_causes(rd, &to_internal(rd, body.clone()))
    } else {
        Vec::new()
    };
    let mut v = to_internal(rd, body);
    stamp_type(rd, &mut v);
    {
        let m = meta_mut(&mut v);
        if rd.namespaced {
            match m.get("namespace").and_then(Value::as_str) {
                Some(n) if !n.is_empty() && n != ns => {
                    return Err(ApiError::bad_request(
                        "the namespace of the provided object does not match the namespace sent on the request",
                    ));
                }
                _ => {
                    m.insert("namespace".into(), json!(ns));
                }
            }
        } else {
            m.remove("namespace");
        }
        if m.get("resourceVersion")
            .and_then(Value::as_str)
            .is_some_and(|s| !s.is_empty())
        {
            return Err(ApiError::unclassified(
                "resourceVersion should not be set on objects to be created",
            ));
        }
    }
    let mut name = meta_str(&v, "name").to_string();
    let generate = meta_str(&v, "generateName").to_string();
    if name.is_empty() {
        if generate.is_empty() {
            return Err(ApiError::invalid(
                rd,
                "",
                &[Cause::required(
                    "metadata.name",
                    "name or generateName is required",
                )],
            ));
        }
        name = format!("{generate}{}", name_suffix());
        for _ in 0..8 {
            if st.get(rd.storage, ns, &name).is_none() {
                break;
            }
            name = format!("{generate}{}", name_suffix());
        }
        meta_mut(&mut v).insert("name".into(), json!(name));
    }
    check_namespace(st, rd, ns)?;
    {
        let m = meta_mut(&mut v);
        let uid = uid.map_or_else(|| uuid::Uuid::new_v4().to_string(), str::to_owned);
        m.insert("uid".into(), json!(uid));
        m.insert("creationTimestamp".into(), json!(now()));
        m.remove("deletionTimestamp");
        m.remove("deletionGracePeriodSeconds");
        m.remove("selfLink");
        if rd.custom || rd.plural == resources::PODS {
            m.insert("generation".into(), json!(1));
        } else {
            m.remove("generation");
        }
    }
    initial_status(rd, &mut v);
    apply_defaults(rd, &mut v);
    normalize(rd, &mut v);
    admit_create(st, pol, rd, &mut v);
    // core/v1 Events keep their legacy validation, which never checks the name (an Event of an
    // object with a long name is longer than 253 characters); events.k8s.io/v1 checks it.
    let mut causes = match (rd.group, rd.plural) {
        ("", resources::EVENTS) => Vec::new(),
        _ => validate::name_causes(rd, &name),
    };
    causes.extend(if rd.is_events_v1() {
        ext_causes
    } else {
        validate::object_causes(rd, &v)
    });
    if !causes.is_empty() {
        return Err(ApiError::invalid(rd, &name, &causes));
    }
    if st.get(rd.storage, ns, &name).is_some() {
        return Err(ApiError::already_exists(rd, &name));
    }
    if dry {
        return Ok(v);
    }
    let obj = st.commit(rd.storage, ns, &name, Some(v));
    Ok((*obj).clone())
}

/// Fields of `new` that the server takes from the stored object whatever the client sent.
fn keep_system_fields(rd: &ResourceDef, old: &Value, new: &mut Value, sub: Sub) {
    stamp_type(rd, new);
    if sub == Sub::Status {
        // Status writes change only status (metadata and spec stay as stored).
        let status = new.get("status").cloned();
        *new = old.clone();
        match status {
            Some(s) => new["status"] = s,
            None => {
                if let Some(m) = new.as_object_mut() {
                    m.remove("status");
                }
            }
        }
        return;
    }
    if rd.has_status {
        match old.get("status") {
            Some(s) => new["status"] = s.clone(),
            None => {
                if let Some(m) = new.as_object_mut() {
                    m.remove("status");
                }
            }
        }
    }
    let om = meta(old).clone();
    let nm = meta_mut(new);
    for k in [
        "uid",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "generation",
        "name",
        "namespace",
        "generateName",
    ] {
        match om.get(k) {
            Some(v) => nm.insert(k.into(), v.clone()),
            None => nm.remove(k),
        };
    }
    nm.remove("selfLink");
}

fn spec_part(v: &Value) -> Value {
    let mut c = v.clone();
    if let Some(m) = c.as_object_mut() {
        m.remove("metadata");
        m.remove("status");
    }
    c
}

fn without_rv(v: &Value) -> Value {
    let mut c = v.clone();
    if let Some(m) = c.get_mut("metadata").and_then(Value::as_object_mut) {
        m.remove("resourceVersion");
        m.remove("managedFields");
    }
    c
}

/// Shared tail of update and patch: preconditions, system fields, validation and commit.
pub fn apply_update(
    st: &mut Store,
    rd: &'static ResourceDef,
    old: &Value,
    mut new: Value,
    sub: Sub,
    dry: bool,
) -> Result<Value, ApiError> {
    let name = meta_str(old, "name").to_string();
    let ns = meta_str(old, "namespace").to_string();
    let new_rv = meta_str(&new, "resourceVersion");
    if !new_rv.is_empty() && new_rv != meta_str(old, "resourceVersion") {
        return Err(ApiError::modified(rd, &name));
    }
    let new_uid = meta_str(&new, "uid");
    let old_uid = meta_str(old, "uid");
    if !new_uid.is_empty() && new_uid != old_uid {
        return Err(ApiError::conflict(
            rd,
            &name,
            // etcd's storage error, as kube-apiserver passes it on (its key under /registry).
            &format!(
                "StorageError: invalid object, Code: 4, Key: /registry/{}/{}{name}, ResourceVersion: 0, AdditionalErrorMsg: Precondition failed: UID in precondition: {new_uid}, UID in object meta: {old_uid}",
                rd.plural,
                if ns.is_empty() {
                    String::new()
                } else {
                    format!("{ns}/")
                },
            ),
        ));
    }
    keep_system_fields(rd, old, &mut new, sub);
    normalize(rd, &mut new);
    if rd.plural == resources::PV && rd.group.is_empty() {
        let phase_changed = old.pointer("/status/phase") != new.pointer("/status/phase");
        let time_kept = new.pointer("/status/lastPhaseTransitionTime")
            == old.pointer("/status/lastPhaseTransitionTime");
        if phase_changed && time_kept && new.get("status").is_some_and(Value::is_object) {
            new["status"]["lastPhaseTransitionTime"] = json!(now());
        }
    }
    if (rd.custom || rd.plural == resources::PODS) && spec_part(old) != spec_part(&new) {
        let g = meta(old)
            .get("generation")
            .and_then(Value::as_i64)
            .unwrap_or(0)
            + 1;
        meta_mut(&mut new).insert("generation".into(), json!(g));
    }
    let mut causes = validate::update_causes(rd, old, &new);
    if !rd.is_events_v1() {
        causes.extend(validate::object_causes(rd, &new));
    }
    if !causes.is_empty() {
        return Err(ApiError::invalid(rd, &name, &causes));
    }
    if without_rv(old) == without_rv(&new) {
        // The real server skips writes that change nothing: no new resourceVersion, no event.
        return Ok(old.clone());
    }
    if dry {
        return Ok(new);
    }
    let is_namespace = rd.plural == resources::NAMESPACES && rd.group.is_empty();
    if is_deleting(&new) && finalizers(&new).is_empty() && !is_namespace {
        let last = st.commit(rd.storage, &ns, &name, None);
        return Ok((*last).clone());
    }
    let obj = st.commit(rd.storage, &ns, &name, Some(new));
    Ok((*obj).clone())
}

fn check_name(body: &Value, name: &str, ns: &str, rd: &ResourceDef) -> Result<(), ApiError> {
    let bn = meta_str(body, "name");
    if !bn.is_empty() && bn != name {
        return Err(ApiError::bad_request(format!(
            "the name of the object ({bn}) does not match the name on the URL ({name})"
        )));
    }
    let bns = meta_str(body, "namespace");
    if rd.namespaced && !bns.is_empty() && bns != ns {
        return Err(ApiError::bad_request(
            "the namespace of the provided object does not match the namespace sent on the request",
        ));
    }
    Ok(())
}

pub fn update(
    st: &mut Store,
    rd: &'static ResourceDef,
    ns: &str,
    name: &str,
    body: Value,
    sub: Sub,
    dry: bool,
) -> Result<Value, ApiError> {
    let body = expect_object(rd, body)?;
    check_name(&body, name, ns, rd)?;
    let old = get(st, rd, ns, name)?;
    if rd.is_events_v1() {
        let causes = validate::object_causes(rd, &to_internal(rd, body.clone()));
        if !causes.is_empty() {
            return Err(ApiError::invalid(rd, name, &causes));
        }
    }
    let new = to_internal(rd, body);
    apply_update(st, rd, &old, new, sub, dry)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchType {
    Merge,
    Json,
    Strategic,
}

impl PatchType {
    pub fn from_content_type(ct: &str) -> Option<Self> {
        match ct.split(';').next().unwrap_or("").trim() {
            "application/merge-patch+json" => Some(Self::Merge),
            "application/json-patch+json" => Some(Self::Json),
            "application/strategic-merge-patch+json" => Some(Self::Strategic),
            _ => None,
        }
    }
}

pub const PATCH_TYPES: &str = "application/json-patch+json, application/merge-patch+json, application/strategic-merge-patch+json";

#[allow(clippy::too_many_arguments)]
pub fn patch(
    st: &mut Store,
    rd: &'static ResourceDef,
    ns: &str,
    name: &str,
    ptype: PatchType,
    body: &[u8],
    sub: Sub,
    dry: bool,
) -> Result<Value, ApiError> {
    let old = get(st, rd, ns, name)?;
    let p: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))?;
    let mut doc = to_external(rd, &old);
    match ptype {
        PatchType::Merge => {
            if !p.is_object() {
                return Err(ApiError::bad_request(
                    "json: cannot unmarshal into Go value of type map[string]interface {}",
                ));
            }
            crate::patch::merge_patch(&mut doc, &p);
        }
        PatchType::Json => match crate::patch::json_patch(&mut doc, &p) {
            Ok(()) => {}
            Err(crate::patch::JsonPatchError::Decode(e)) => return Err(ApiError::bad_request(e)),
            Err(crate::patch::JsonPatchError::Apply(_)) => {
                // Same as the real server: 422 with the generic message (jsonpatch's text is dropped).
                return Err(ApiError::new(
                    422,
                    "Invalid",
                    "the server rejected our request due to an error in our request",
                ));
            }
        },
        PatchType::Strategic => {
            if rd.custom {
                return Err(ApiError::unsupported_media(
                    "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml",
                ));
            }
            crate::patch::strategic_merge(&mut doc, &p).map_err(ApiError::bad_request)?;
        }
    }
    check_name(&doc, name, ns, rd)?;
    // A patch carries no UID precondition: a UID it changes is an immutable field (an update's
    // UID is a precondition instead, a 409).
    let (new_uid, old_uid) = (meta_str(&doc, "uid"), meta_str(&old, "uid"));
    if !new_uid.is_empty() && new_uid != old_uid {
        let cause = Cause::invalid("metadata.uid", &json!(new_uid), "field is immutable");
        return Err(ApiError::invalid(rd, name, &[cause]));
    }
    if rd.is_events_v1() {
        let causes = validate::object_causes(rd, &to_internal(rd, doc.clone()));
        if !causes.is_empty() {
            return Err(ApiError::invalid(rd, name, &causes));
        }
    }
    let new = to_internal(rd, doc);
    apply_update(st, rd, &old, new, sub, dry)
}

#[derive(Debug, Clone, Default)]
pub struct DeleteOpts {
    pub uid: Option<String>,
    pub resource_version: Option<String>,
    pub dry: bool,
}

impl DeleteOpts {
    /// Reads DeleteOptions from a JSON body (kube-rs and kubectl send one).
    pub fn from_body(body: &[u8]) -> Result<Self, ApiError> {
        if body.iter().all(u8::is_ascii_whitespace) {
            return Ok(Self::default());
        }
        let v: Value = serde_json::from_slice(body)
            .map_err(|e| ApiError::bad_request(format!("error decoding DeleteOptions: {e}")))?;
        let s = |p: &str| v.pointer(p).and_then(Value::as_str).map(String::from);
        Ok(Self {
            uid: s("/preconditions/uid"),
            resource_version: s("/preconditions/resourceVersion"),
            dry: v
                .get("dryRun")
                .and_then(Value::as_array)
                .is_some_and(|a| !a.is_empty()),
        })
    }
}

/// Outcome of a delete: gone now, or kept with a deletionTimestamp until finalizers are removed.
#[derive(Debug)]
pub enum Deleted {
    Gone(Value),
    Pending(Value),
}

pub fn delete(
    st: &mut Store,
    rd: &'static ResourceDef,
    ns: &str,
    name: &str,
    opts: &DeleteOpts,
) -> Result<Deleted, ApiError> {
    let old = get(st, rd, ns, name)?;
    if let Some(uid) = &opts.uid
        && uid != meta_str(&old, "uid")
    {
        let have = meta_str(&old, "uid");
        return Err(ApiError::delete_precondition(rd, name, "UID", uid, have));
    }
    if let Some(rv) = &opts.resource_version
        && rv != meta_str(&old, "resourceVersion")
    {
        let have = meta_str(&old, "resourceVersion");
        return Err(ApiError::delete_precondition(
            rd,
            name,
            "ResourceVersion",
            rv,
            have,
        ));
    }
    let is_namespace = rd.plural == resources::NAMESPACES && rd.group.is_empty();
    if finalizers(&old).is_empty() && !is_namespace {
        if opts.dry {
            return Ok(Deleted::Gone((*old).clone()));
        }
        let last = st.commit(rd.storage, ns, name, None);
        return Ok(Deleted::Gone((*last).clone()));
    }
    if is_deleting(&old) {
        return Ok(Deleted::Pending((*old).clone()));
    }
    let mut new = (*old).clone();
    {
        let m = meta_mut(&mut new);
        m.insert("deletionTimestamp".into(), json!(now()));
        m.insert("deletionGracePeriodSeconds".into(), json!(0));
    }
    if is_namespace {
        new["status"] = json!({"phase": "Terminating"});
    }
    if opts.dry {
        return Ok(Deleted::Pending(new));
    }
    let obj = st.commit(rd.storage, ns, name, Some(new));
    Ok(Deleted::Pending((*obj).clone()))
}
