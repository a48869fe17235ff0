//! Finalizer removal by value (strategic merge), for objects whose other finalizers change at the
//! same moment as ours.

use kube::api::{Patch, PatchParams};
use kube::{Api, ResourceExt};
use serde_json::Value;

use super::{Object, PATCH_REFUSED, PatchError, PatchOutcome, remove_finalizer};
use crate::k8s::errors::{ApiErrorClass, classify};

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
