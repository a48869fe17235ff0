//! Object metadata: annotations, finalizers and labels.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// The annotation as stored, an empty value included (Go's `v, ok := m[k]`).
pub(crate) fn annotation<'a>(meta: &'a ObjectMeta, key: &str) -> Option<&'a str> {
    meta.annotations.as_ref()?.get(key).map(String::as_str)
}

/// The annotation when it holds a value: an empty one counts as unset (Go's `m[k] != ""`).
pub(crate) fn non_empty_annotation<'a>(meta: &'a ObjectMeta, key: &str) -> Option<&'a str> {
    annotation(meta, key).filter(|value| !value.is_empty())
}

/// The label as stored.
pub(crate) fn label<'a>(meta: &'a ObjectMeta, key: &str) -> Option<&'a str> {
    meta.labels.as_ref()?.get(key).map(String::as_str)
}

/// Whether the object carries `finalizer`.
pub(crate) fn has_finalizer(meta: &ObjectMeta, finalizer: &str) -> bool {
    meta.finalizers
        .as_ref()
        .is_some_and(|all| all.iter().any(|f| f == finalizer))
}

#[cfg(test)]
#[path = "meta_tests.rs"]
mod tests;
