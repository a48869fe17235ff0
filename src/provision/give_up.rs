//! The per-class retry policy (ours): a StorageClass annotated
//! `csi-provisioner.rs/max-provisioning-failures: "N"` stops provisioning a claim after N
//! CreateVolume attempts that failed for sure (a backend out of quota or billing), with one
//! event and one claim annotation saying why; removing the annotation retries. Without the
//! annotation nothing changes: upstream's "retry forever with backoff".
//!
//! Only failures the driver calls final count (the volume was not created); a claim with an
//! attempt that may still be in progress is never stopped, so stopping can leak nothing.

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::api::storage::v1::StorageClass;

use crate::model::meta::annotation;
use crate::names;

/// The class's limit: `Ok(None)` without the annotation, an error naming the bad value.
pub(crate) fn max_failures(class: &StorageClass) -> Result<Option<u32>, String> {
    let Some(value) = annotation(&class.metadata, names::ANN_MAX_PROVISIONING_FAILURES) else {
        return Ok(None);
    };
    match value.trim().parse::<u32>() {
        Ok(n) if n > 0 => Ok(Some(n)),
        _ => Err(format!(
            "StorageClass {}: annotation {}={value:?} is not a positive integer; provisioning retries forever",
            class.metadata.name.as_deref().unwrap_or_default(),
            names::ANN_MAX_PROVISIONING_FAILURES
        )),
    }
}

/// Whether the retry policy stopped this claim (it carries [`names::ANN_PROVISIONING_STOPPED`]).
pub(crate) fn is_stopped(pvc: &PersistentVolumeClaim) -> bool {
    annotation(&pvc.metadata, names::ANN_PROVISIONING_STOPPED).is_some()
}

/// The claim annotation's value: how many attempts and the last error, kept short.
pub(crate) fn stopped_value(failures: u32, last_error: &str) -> String {
    let mut error: String = last_error.chars().take(512).collect();
    if error.len() < last_error.len() {
        error.push_str("...");
    }
    format!("stopped after {failures} failed attempts; last error: {error}")
}

/// The Warning event when provisioning stops.
pub(crate) fn stopped_message(class: &str, failures: u32, last_error: &str) -> String {
    format!(
        "provisioning stopped after {failures} failed attempts (StorageClass {class} sets {}={failures}): {last_error}; fix the cause, then remove the claim's annotation {} to retry",
        names::ANN_MAX_PROVISIONING_FAILURES,
        names::ANN_PROVISIONING_STOPPED
    )
}

#[cfg(test)]
#[path = "give_up_props_tests.rs"]
mod props_tests;

#[cfg(test)]
#[path = "give_up_tests.rs"]
mod tests;
