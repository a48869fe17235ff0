//! Conflict-free finalizer and annotation patches that never depend on a stale cached copy.
//!
//! Upstream lost PVs to these bugs: finalizers removed with an Update of the informer's (stale) copy,
//! 409 conflicts, a retry cap of 6, and a PV stuck Terminating forever (external-provisioner issues
//! 1217, 1235, 1184; lib issue 87). Here every write is a JSON patch whose `test` ops state exactly
//! what the write relies on, so a stale input can only make the write *fail*, never do the wrong
//! thing; a failure re-reads the object and tries again, without a cap, with a short jittered
//! backoff:
//!
//! - remove finalizer: `test /metadata/finalizers/<i> == ours` + `remove /metadata/finalizers/<i>`.
//!   Someone else removing or inserting a finalizer moves ours; the `test` then fails (422) instead
//!   of removing theirs.
//! - add finalizer: `test /metadata/finalizers == <the list we read>` + `add /metadata/finalizers/-`
//!   (or, with no list yet, `test /metadata/resourceVersion` + `add /metadata/finalizers [ours]`,
//!   since `add` on a missing member would *replace* a list someone just created). A strategic
//!   merge patch would not need the read, but it is not supported by every API implementation we
//!   test against (kube-sim) and would still need a read to tell "being deleted" apart.
//! - annotations: `add`/`remove` of the single key; the key's own path is the only thing touched.
//! - every patch also `test`s `/metadata/uid` when we know it: a PV deleted and re-created under the
//!   same name is another object and is reported [`PatchOutcome::Gone`].
//!
//! The caller's (possibly cached) copy seeds the *first* attempt, which saves a GET in the common
//! case. Only a write may be based on it (the `test` ops guard it); a "nothing to do" or "being
//! deleted" conclusion is always confirmed on a fresh GET first.
//!
//! Drop-in RBAC: upstream's ClusterRole grants `update` but not `patch` on PVCs. Where the API
//! server refuses a PATCH with 403, [`apply_change`] makes the same change as GET + PUT (see there),
//! and remembers per resource to go straight to that for the rest of the process.
//!
//! Finalizer removal by value (strategic merge), for objects whose other finalizers change at the
//! same moment as ours.

use std::collections::HashSet;
use std::fmt::Debug;
use std::sync::{LazyLock, Mutex};
use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};
use json_patch::jsonptr::{PointerBuf, Token};
use json_patch::{AddOperation, PatchOperation, RemoveOperation, TestOperation};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{
    ApiResource, DeleteParams, DynamicObject, Patch, PatchParams, PostParams, Preconditions,
};
use kube::core::Status;
use kube::{Api, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::retry::{ApiErrorClass, classify};

/// Backoff between attempts that lost a race: short, because the race is with another controller's
/// single write, jittered so two controllers retrying the same object do not collide again.
#[cfg(not(test))]
const RETRY_MIN_DELAY: Duration = Duration::from_millis(10);
#[cfg(not(test))]
const RETRY_MAX_DELAY: Duration = Duration::from_secs(1);
// Unit tests lose dozens of scripted races; keep them fast.
#[cfg(test)]
const RETRY_MIN_DELAY: Duration = Duration::from_millis(1);
#[cfg(test)]
const RETRY_MAX_DELAY: Duration = Duration::from_millis(2);
/// After this many lost races in a row, each further retry is logged at warn level.
const WARN_AFTER_ATTEMPTS: u32 = 10;

/// What the writes here need of an object's type; every built-in kind has it.
pub(crate) trait Object:
    Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug
{
}

impl<K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug> Object for K {}

/// What one attempt should do, computed from one copy of the object by a pure function.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Step {
    /// The object already is as wanted.
    AlreadyDone,
    /// The object is being deleted and the wanted write is one the server refuses on deleting
    /// objects (adding a finalizer).
    ObjectDeleting,
    /// Send this JSON patch.
    Write(json_patch::Patch),
}

/// How a patch call ended (errors other than "gone" are in [`PatchError`]).
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum PatchOutcome<K> {
    /// The patch was applied; the object as the server returned it.
    Patched(K),
    /// A fresh read showed there was nothing to do; that fresh object.
    Unchanged(K),
    /// The object is being deleted, so a finalizer cannot be added any more (the API server
    /// refuses new finalizers once `deletionTimestamp` is set); that fresh object.
    Deleting(K),
    /// The object no longer exists, or a different object (another UID) now has its name.
    Gone,
}

/// A patch or delete that failed for a reason other than a lost race or a missing object.
#[derive(Debug, thiserror::Error)]
#[error(
    "{action} on {kind} {name:?} failed ({class}): {}",
    crate::retry::describe(source)
)]
pub(crate) struct PatchError {
    /// What we tried, e.g. `remove finalizer external-provisioner.volume.kubernetes.io/finalizer`.
    pub(crate) action: String,
    /// Kind of the object (`PersistentVolume`).
    pub(crate) kind: String,
    /// Name of the object.
    pub(crate) name: String,
    /// What the failure means for the caller (back off, give up, fix RBAC...).
    pub(crate) class: ApiErrorClass,
    /// The API error.
    #[source]
    pub(crate) source: kube::Error,
}

/// Result of [`delete_with_uid`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum DeleteOutcome {
    /// The DELETE was accepted (the object may stay Terminating while finalizers remain).
    Deleted,
    /// The object was already gone, or its name now belongs to another object.
    Gone,
}

// === Pure patch builders ===

/// A JSON pointer from its tokens (escaped as RFC 6901 says).
pub(crate) fn pointer<'t>(tokens: impl IntoIterator<Item = Token<'t>>) -> PointerBuf {
    PointerBuf::from_tokens(tokens)
}

/// `/metadata/<field>`.
pub(crate) fn meta_path(field: &str) -> PointerBuf {
    pointer([Token::new("metadata"), Token::new(field.to_owned())])
}

/// `/metadata/annotations/<key>`, the key escaped.
pub(crate) fn annotation_path(key: &str) -> PointerBuf {
    pointer([
        Token::new("metadata"),
        Token::new("annotations"),
        Token::new(key.to_owned()),
    ])
}

/// A `test` operation.
pub(crate) fn test_op(path: PointerBuf, value: Value) -> PatchOperation {
    PatchOperation::Test(TestOperation { path, value })
}

/// An `add` operation.
pub(crate) fn add_op(path: PointerBuf, value: Value) -> PatchOperation {
    PatchOperation::Add(AddOperation { path, value })
}

/// Preconditions every write carries: the UID we read (if known).
pub(crate) fn guard(meta: &ObjectMeta) -> Vec<PatchOperation> {
    meta.uid
        .iter()
        .map(|uid| test_op(meta_path("uid"), Value::String(uid.clone())))
        .collect()
}

/// A `remove` operation.
pub(crate) fn remove_op(path: PointerBuf) -> PatchOperation {
    PatchOperation::Remove(RemoveOperation { path })
}

/// The `test` of the resourceVersion we read, if known.
pub(crate) fn version_test(meta: &ObjectMeta) -> Option<PatchOperation> {
    meta.resource_version
        .as_ref()
        .map(|rv| test_op(meta_path("resourceVersion"), Value::String(rv.clone())))
}

/// Guard for creating a whole metadata map/list that is absent in `meta`: `add` would replace a
/// member created concurrently, so pin the resourceVersion we read.
fn guard_absent(meta: &ObjectMeta) -> Vec<PatchOperation> {
    let mut ops = guard(meta);
    ops.extend(version_test(meta));
    ops
}

/// Step that adds `finalizer` to the object described by `meta`.
pub(crate) fn add_finalizer_step(meta: &ObjectMeta, finalizer: &str) -> Step {
    let current = meta.finalizers.as_deref().unwrap_or_default();
    if current.iter().any(|f| f == finalizer) {
        return Step::AlreadyDone;
    }
    if meta.deletion_timestamp.is_some() {
        return Step::ObjectDeleting;
    }
    let ours = Value::String(finalizer.to_owned());
    let ops = if current.is_empty() {
        let mut ops = guard_absent(meta);
        ops.push(add_op(meta_path("finalizers"), Value::Array(vec![ours])));
        ops
    } else {
        let mut ops = guard(meta);
        let list = current.iter().cloned().map(Value::String).collect();
        ops.push(test_op(meta_path("finalizers"), Value::Array(list)));
        ops.push(add_op(
            pointer([
                Token::new("metadata"),
                Token::new("finalizers"),
                Token::new("-"),
            ]),
            ours,
        ));
        ops
    };
    Step::Write(json_patch::Patch(ops))
}

/// Step that removes `finalizer` from the object described by `meta`.
pub(crate) fn remove_finalizer_step(meta: &ObjectMeta, finalizer: &str) -> Step {
    let current = meta.finalizers.as_deref().unwrap_or_default();
    let Some(index) = current.iter().position(|f| f == finalizer) else {
        return Step::AlreadyDone;
    };
    let path = pointer([
        Token::new("metadata"),
        Token::new("finalizers"),
        Token::from(index),
    ]);
    let mut ops = guard(meta);
    ops.push(test_op(path.clone(), Value::String(finalizer.to_owned())));
    ops.push(remove_op(path));
    Step::Write(json_patch::Patch(ops))
}

/// Step that sets annotation `key` to `value`.
pub(crate) fn set_annotation_step(meta: &ObjectMeta, key: &str, value: &str) -> Step {
    let current = meta.annotations.as_ref();
    if current.and_then(|a| a.get(key)).map(String::as_str) == Some(value) {
        return Step::AlreadyDone;
    }
    let value = Value::String(value.to_owned());
    let ops = match current {
        Some(map) if !map.is_empty() => {
            let mut ops = guard(meta);
            // `add` on an existing member replaces it: exactly "set this key", nothing else.
            ops.push(add_op(annotation_path(key), value));
            ops
        }
        _ => {
            let mut ops = guard_absent(meta);
            let mut map = serde_json::Map::new();
            map.insert(key.to_owned(), value);
            ops.push(add_op(meta_path("annotations"), Value::Object(map)));
            ops
        }
    };
    Step::Write(json_patch::Patch(ops))
}

/// Step that removes annotation `key`.
pub(crate) fn remove_annotation_step(meta: &ObjectMeta, key: &str) -> Step {
    if !meta
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(key))
    {
        return Step::AlreadyDone;
    }
    let mut ops = guard(meta);
    ops.push(remove_op(annotation_path(key)));
    Step::Write(json_patch::Patch(ops))
}

/// Step that removes annotation `key` only while it still has `value`: a decision taken on one
/// value (e.g. "node X has no driver") must not remove another value written meanwhile.
pub(crate) fn remove_annotation_if_step(meta: &ObjectMeta, key: &str, value: &str) -> Step {
    let current = meta.annotations.as_ref().and_then(|a| a.get(key));
    if current.map(String::as_str) != Some(value) {
        return Step::AlreadyDone;
    }
    let path = annotation_path(key);
    let mut ops = guard(meta);
    ops.push(test_op(path.clone(), Value::String(value.to_owned())));
    ops.push(remove_op(path));
    Step::Write(json_patch::Patch(ops))
}

// === Effectful shells ===

/// Adds `finalizer` to `obj` (PV, PVC, ...). `obj` may be a cached copy: its name and UID identify
/// the target, its finalizer list seeds the first attempt. Returns [`PatchOutcome::Deleting`] when
/// the object is being deleted (the server refuses new finalizers then).
pub(crate) async fn add_finalizer<K: Object>(
    api: &Api<K>,
    obj: &K,
    finalizer: &str,
) -> Result<PatchOutcome<K>, PatchError> {
    let action = format!("add finalizer {finalizer}");
    patch_fresh(api, obj, &action, |m| add_finalizer_step(m, finalizer)).await
}

/// Removes `finalizer` from `obj`; never removes anyone else's finalizer, whatever happens to the
/// list concurrently. [`PatchOutcome::Unchanged`] means a fresh read no longer has it.
pub(crate) async fn remove_finalizer<K: Object>(
    api: &Api<K>,
    obj: &K,
    finalizer: &str,
) -> Result<PatchOutcome<K>, PatchError> {
    let action = format!("remove finalizer {finalizer}");
    patch_fresh(api, obj, &action, |m| remove_finalizer_step(m, finalizer)).await
}

/// Sets annotation `key` to `value` on `obj`.
pub(crate) async fn set_annotation<K: Object>(
    api: &Api<K>,
    obj: &K,
    key: &str,
    value: &str,
) -> Result<PatchOutcome<K>, PatchError> {
    let action = format!("set annotation {key}");
    patch_fresh(api, obj, &action, |m| set_annotation_step(m, key, value)).await
}

/// Removes annotation `key` from `obj`.
#[cfg(test)]
pub(crate) async fn remove_annotation<K: Object>(
    api: &Api<K>,
    obj: &K,
    key: &str,
) -> Result<PatchOutcome<K>, PatchError> {
    let action = format!("remove annotation {key}");
    patch_fresh(api, obj, &action, |m| remove_annotation_step(m, key)).await
}

/// The retry loop behind every helper above, for callers that need another guarded write (e.g. a
/// compare-and-set of an annotation): `build` computes a [`Step`] from one copy of the object's
/// metadata and must put into the patch's `test` ops everything the write relies on.
///
/// - The first attempt uses `seed` (maybe stale); `AlreadyDone`/`ObjectDeleting` conclusions from
///   it are re-checked on a fresh GET. A seed without a resourceVersion is read first.
/// - 409 and 422 (a failed `test`) re-read and retry without a cap. A 422 against a fresh read whose
///   resourceVersion has not moved is not a lost race but a rejected write: returned as an error.
/// - 404, or another UID under the name: [`PatchOutcome::Gone`]. Any other error is returned.
pub(crate) async fn patch_fresh<K: Object, F>(
    api: &Api<K>,
    seed: &K,
    action: &str,
    mut build: F,
) -> Result<PatchOutcome<K>, PatchError>
where
    F: FnMut(&ObjectMeta) -> Step,
{
    let name = seed.name_any();
    let uid = seed.meta().uid.clone();
    let kind = K::kind(&()).into_owned();
    let fail = |class, source| PatchError {
        action: action.to_owned(),
        kind: kind.clone(),
        name: name.clone(),
        class,
        source,
    };
    let mut delays = ExponentialBuilder::new()
        .with_min_delay(RETRY_MIN_DELAY)
        .with_max_delay(RETRY_MAX_DELAY)
        .with_jitter()
        .without_max_times()
        .build();

    // (object, whether it comes from a GET made by this call). A seed without a resourceVersion
    // only names the object: a write built from its empty lists would guard nothing and replace
    // the object's (in node mode, a clone source's finalizers with ours alone).
    let known = seed.meta().resource_version.is_some();
    let mut next: Option<(K, bool)> = known.then(|| (seed.clone(), false));
    // A 422 on a write computed from a fresh read at this resourceVersion (with its error).
    let mut rejected: Option<(Option<String>, kube::Error)> = None;
    let mut lost_races = 0u32;
    loop {
        let (obj, fresh) = match next.take() {
            Some(seeded) => seeded,
            None => match api.get_opt(&name).await {
                Ok(Some(obj)) => (obj, true),
                Ok(None) => return Ok(PatchOutcome::Gone),
                Err(err) => return Err(fail(classify(&err), err)),
            },
        };
        if uid.is_some() && obj.meta().uid != uid {
            return Ok(PatchOutcome::Gone);
        }
        if let Some((rv, err)) = rejected.take()
            && fresh
            && obj.meta().resource_version == rv
        {
            return Err(fail(ApiErrorClass::Invalid, err));
        }
        let patch = match build(obj.meta()) {
            Step::AlreadyDone if fresh => return Ok(PatchOutcome::Unchanged(obj)),
            Step::ObjectDeleting if fresh => return Ok(PatchOutcome::Deleting(obj)),
            // Never conclude "nothing to do" from a possibly stale copy.
            Step::AlreadyDone | Step::ObjectDeleting => continue,
            Step::Write(patch) => patch,
        };
        let sent = apply_change(api, &name, Change::Json(&patch)).await;
        let err = match sent {
            Ok(updated) => return Ok(PatchOutcome::Patched(updated)),
            Err(err) => err,
        };
        match classify(&err) {
            ApiErrorClass::NotFound => return Ok(PatchOutcome::Gone),
            ApiErrorClass::Conflict => {}
            ApiErrorClass::Invalid => {
                if fresh {
                    rejected = Some((obj.meta().resource_version.clone(), err));
                }
            }
            class => return Err(fail(class, err)),
        }
        lost_races += 1;
        let delay = delays.next().unwrap_or(RETRY_MAX_DELAY);
        if lost_races >= WARN_AFTER_ATTEMPTS {
            tracing::warn!(%action, %kind, %name, attempt = lost_races, ?delay,
                "write keeps losing races with other writers; retrying on a fresh read");
        } else {
            tracing::debug!(%action, %kind, %name, attempt = lost_races, ?delay,
                "write lost a race; retrying on a fresh read");
        }
        tokio::time::sleep(delay).await;
    }
}

/// The body of a write to one object.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Change<'a> {
    /// A JSON patch; its `test` ops are its preconditions.
    Json(&'a json_patch::Patch),
    /// A merge patch; a `metadata.resourceVersion` in it is its precondition.
    Merge(&'a Value),
}

/// Resources (plural names) whose PATCH was refused with 403 in this process.
static PATCH_REFUSED: LazyLock<Mutex<HashSet<String>>> = LazyLock::new(Default::default);

/// Writes `change` to object `name` with a PATCH, or, where RBAC grants `update` but not `patch`
/// (upstream's ClusterRole on PVCs, kept by users who swap only the image), with the same change
/// made by GET + PUT:
///
/// - the object is read raw (every field, also those our typed structs do not know, so the PUT
///   drops nothing a newer API server added);
/// - the change is applied to that copy locally: a JSON patch's `test` ops are checked against it
///   (a failure is answered as the server would, 422 Invalid), a merge patch's resourceVersion
///   replaces the one read;
/// - the PUT carries that resourceVersion, so anything written in between makes it fail with 409.
///
/// The write therefore means exactly what the PATCH meant; it costs one more request. A 403 on the
/// PUT too is returned as it is (RBAC lacks both verbs, or an admission webhook refused).
pub(crate) async fn apply_change<K: Object>(
    api: &Api<K>,
    name: &str,
    change: Change<'_>,
) -> Result<K, kube::Error> {
    let plural = K::plural(&()).into_owned();
    let refused = crate::sync::lock(&PATCH_REFUSED).contains(&plural);
    if !refused {
        let patch = match change {
            Change::Json(patch) => Patch::Json(patch.clone()),
            Change::Merge(patch) => Patch::Merge(patch),
        };
        match api.patch(name, &PatchParams::default(), &patch).await {
            Err(kube::Error::Api(status)) if status.code == 403 => {
                let first = crate::sync::lock(&PATCH_REFUSED).insert(plural.clone());
                if first {
                    tracing::warn!(resource = %plural, error = %status.message,
                        "the API server refuses to PATCH {plural}; writing them with GET and PUT \
                         instead (one more request per write). Grant the verb patch on {plural} \
                         (see deploy/rbac.yaml) to avoid that");
                }
            }
            other => return other,
        }
    }
    update_instead(api, name, change).await
}

/// [`apply_change`] without PATCH: raw GET, change applied locally, PUT with the read version.
async fn update_instead<K: Object>(
    api: &Api<K>,
    name: &str,
    change: Change<'_>,
) -> Result<K, kube::Error> {
    let resource = ApiResource::erase::<K>(&());
    let client: kube::Client = api.clone().into_client();
    let raw: Api<DynamicObject> = match api.namespace() {
        Some(ns) => Api::namespaced_with(client, ns, &resource),
        None => Api::all_with(client, &resource),
    };
    let current = raw.get(name).await?;
    let mut doc = serde_json::to_value(&current).map_err(kube::Error::SerdeError)?;
    match change {
        Change::Json(patch) => {
            if let Err(e) = json_patch::patch(&mut doc, &patch.0) {
                // What the server answers to a failed `test` (or an impossible op) in a PATCH.
                let status = Status::failure(
                    &format!("the change no longer applies to {name}: {e}"),
                    kube::core::response::reason::INVALID,
                )
                .with_code(422);
                return Err(kube::Error::Api(status.boxed()));
            }
        }
        Change::Merge(patch) => json_patch::merge(&mut doc, patch),
    }
    let changed: DynamicObject = serde_json::from_value(doc).map_err(kube::Error::SerdeError)?;
    let written = raw.replace(name, &PostParams::default(), &changed).await?;
    let typed = serde_json::to_value(&written).map_err(kube::Error::SerdeError)?;
    serde_json::from_value(typed).map_err(kube::Error::SerdeError)
}

/// Deletes `name` only if it still has `uid` (a DELETE precondition), so a re-created object of the
/// same name is never deleted by mistake. A UID mismatch (409) or 404 is [`DeleteOutcome::Gone`].
pub(crate) async fn delete_with_uid<K: Object>(
    api: &Api<K>,
    name: &str,
    uid: &str,
) -> Result<DeleteOutcome, PatchError> {
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: Some(uid.to_owned()),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match api.delete(name, &params).await {
        Ok(_) => Ok(DeleteOutcome::Deleted),
        Err(err) => match classify(&err) {
            ApiErrorClass::NotFound | ApiErrorClass::Conflict => Ok(DeleteOutcome::Gone),
            class => Err(PatchError {
                action: "delete".to_owned(),
                kind: K::kind(&()).into_owned(),
                name: name.to_owned(),
                class,
                source: err,
            }),
        },
    }
}

/// Removes `finalizer` from `obj` by value, in one request whatever else changed meanwhile: a
/// strategic merge patch with `$deleteFromPrimitiveList`, guarded by the UID. A deleted PV loses
/// `kubernetes.io/pv-protection` at about the moment we remove ours, which made the index-based
/// JSON patch of [`remove_finalizer`] fail and re-read for one PV in four. Falls back to
/// [`remove_finalizer`] where the server refuses the patch (RBAC without `patch`, a UID that
/// changed, a type without strategic merge).
pub(crate) async fn remove_finalizer_by_value<K: Object>(
    api: &Api<K>,
    obj: &K,
    finalizer: &str,
) -> Result<PatchOutcome<K>, PatchError> {
    let plural = K::plural(&()).into_owned();
    let refused = crate::sync::lock(&PATCH_REFUSED).contains(&plural);
    if refused || !obj.finalizers().iter().any(|f| f == finalizer) {
        return remove_finalizer(api, obj, finalizer).await;
    }
    let mut meta = serde_json::Map::new();
    if let Some(uid) = &obj.meta().uid {
        meta.insert("uid".to_owned(), Value::String(uid.clone()));
    }
    meta.insert(
        "$deleteFromPrimitiveList/finalizers".to_owned(),
        Value::Array(vec![Value::String(finalizer.to_owned())]),
    );
    let patch = serde_json::json!({ "metadata": meta });
    match api
        .patch(
            &obj.name_any(),
            &PatchParams::default(),
            &Patch::Strategic(&patch),
        )
        .await
    {
        Ok(updated) => Ok(PatchOutcome::Patched(updated)),
        Err(err) if classify(&err) == ApiErrorClass::NotFound => Ok(PatchOutcome::Gone),
        Err(_) => remove_finalizer(api, obj, finalizer).await,
    }
}

#[cfg(test)]
#[path = "patch_tests.rs"]
mod tests;
