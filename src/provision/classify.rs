//! What a failed CreateVolume means for the claim (upstream `checkError`, reference §4.5): may the
//! volume still be in the making, should the scheduler pick another node, or is it a final answer.
//!
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
use tonic::Code;

use crate::model::meta::annotation;
use crate::names;

/// Upstream's provisioning states. Only [`ProvisioningState::InBackground`] says the volume may
/// exist or still appear; with the durable intent (`provision::controller::intents`), the shell keeps the
/// intent for every state except a success.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum ProvisioningState {
    /// The operation ended (failed for sure, nothing in progress). Still retried with backoff.
    Finished,
    /// The driver may still be creating the volume: retry the same request, even if the claim
    /// is deleted meanwhile.
    InBackground,
    /// Failed before anything reached the driver; the previous state stands.
    #[allow(
        dead_code,
        reason = "upstream's state, not produced until data sources and capacity checks can fail before the call"
    )]
    NoChange,
    /// Give up on this node: clear `volume.kubernetes.io/selected-node` so the scheduler picks again.
    Reschedule,
}

impl ProvisioningState {
    /// Upstream's string for the state (logs and metrics).
    #[cfg(test)]
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            ProvisioningState::Finished => "Finished",
            ProvisioningState::InBackground => "Background",
            ProvisioningState::NoChange => "NoChange",
            ProvisioningState::Reschedule => "Reschedule",
        }
    }
}

/// `may_reschedule` as upstream computes it: the driver supports topology and a node is selected.
pub(crate) fn may_reschedule(topology_supported: bool, selected_node: Option<&str>) -> bool {
    topology_supported && selected_node.is_some_and(|n| !n.is_empty())
}

/// The state of a CreateVolume that failed with gRPC `code`. Our own `--timeout` expiring shows
/// up as `Cancelled` or `DeadlineExceeded`: both mean the driver may still be working.
pub(crate) fn provisioning_state(code: Code, may_reschedule: bool) -> ProvisioningState {
    use ProvisioningState::*;
    match code {
        // CSI: no capacity in the requested topology; another node may have some.
        Code::ResourceExhausted if may_reschedule => Reschedule,
        Code::ResourceExhausted => Finished,
        // Client-side cancel/timeout, server going away, or CSI "operation pending".
        Code::Cancelled | Code::DeadlineExceeded | Code::Unavailable | Code::Aborted => {
            InBackground
        }
        // The driver answered: nothing is in progress.
        Code::Ok
        | Code::Unknown
        | Code::InvalidArgument
        | Code::NotFound
        | Code::AlreadyExists
        | Code::PermissionDenied
        | Code::FailedPrecondition
        | Code::OutOfRange
        | Code::Unimplemented
        | Code::Internal
        | Code::DataLoss
        | Code::Unauthenticated => Finished,
    }
}

/// `InvalidArgument` is "infeasible": the claim is held back for 5 minutes unless its
/// StorageClass changes (see [`crate::retry::InfeasibleHold`]).
pub(crate) fn is_infeasible(code: Code) -> bool {
    code == Code::InvalidArgument
}

/// What a failed CreateVolume *replay* (sent only to learn the id of an intent's volume before
/// deleting it, see `intents::cleanup`) says about that volume.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReplayVerdict {
    /// The volume does not exist: the intent can be finished without DeleteVolume.
    VolumeAbsent,
    /// Transient, or the driver did not get far enough to tell: retry with backoff.
    RetryLater,
    /// Nothing can be concluded (a volume of that name exists with other parameters): an
    /// administrator must check the backend.
    NeedsAdmin,
}

/// Classifies a failed replay. The replay is the exact request of the original call, so a refusal
/// for good proves the original was refused too, and no volume exists. Authentication and
/// internal errors are retried, never taken as proof.
pub(crate) fn replay_verdict(code: Code) -> ReplayVerdict {
    match code {
        Code::AlreadyExists => ReplayVerdict::NeedsAdmin,
        Code::InvalidArgument
        | Code::NotFound
        | Code::OutOfRange
        | Code::ResourceExhausted
        | Code::FailedPrecondition
        | Code::Unimplemented => ReplayVerdict::VolumeAbsent,
        Code::Ok
        | Code::Cancelled
        | Code::Unknown
        | Code::DeadlineExceeded
        | Code::PermissionDenied
        | Code::Aborted
        | Code::Internal
        | Code::Unavailable
        | Code::DataLoss
        | Code::Unauthenticated => ReplayVerdict::RetryLater,
    }
}

/// The event message when a replay cannot tell whether the intent's volume exists.
pub(crate) fn replay_needs_admin_message(volume_name: &str, error: &str) -> String {
    format!(
        "cannot tell whether volume {volume_name} exists: CreateVolume (sent to learn its id before deleting it) failed: {error}; \
         check the storage backend, delete the volume there if it exists, then remove the finalizer {} from the claim",
        crate::names::FINALIZER_PROVISIONING_INTENT
    )
}

/// Upstream's ProvisioningFailed message for an infeasible failure.
pub(crate) fn infeasible_event_message(error: &str) -> String {
    format!("Volume provisioning failed with infeasible error. Retries will be delayed. {error}")
}

// === The class's retry policy ===

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
#[path = "classify_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "classify_props_tests.rs"]
mod props_tests;
