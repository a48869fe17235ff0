//! What the user and the operator see of a claim: events, logs and the metrics labels.

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use tracing::{debug, warn};

use super::{ProvisionError, Provisioner, claim_key};
use crate::k8s::events::{EventSource, EventSpec, reference_to};
use crate::names;
use crate::provision::plan::{ClearReason, IgnoreReason};

pub(super) fn ignore(state: &Provisioner, pvc: &PersistentVolumeClaim, reason: &IgnoreReason) {
    debug!(claim = %claim_key(pvc), ?reason, "nothing to do for claim");
    if let IgnoreReason::ExternalPopulator(_) = reason {
        // Upstream's library announces every attempt, then its CSI code, reporting as
        // `external-provisioner`, says the populator will do it: two events from two sources.
        provisioning_event(state, pvc);
        state
            .ctx
            .events
            .as_source(EventSource::csi_provisioner())
            .emit(
                reference_to(pvc),
                EventSpec::normal(
                    names::EVENT_PROVISIONING,
                    "Assuming an external populator will provision the volume",
                ),
            );
    }
}

pub(super) fn provisioning_event(state: &Provisioner, pvc: &PersistentVolumeClaim) {
    state.ctx.events.emit(
        reference_to(pvc),
        EventSpec::normal(
            names::EVENT_PROVISIONING,
            format!(
                "External provisioner is provisioning volume for claim \"{}\"",
                claim_key(pvc)
            ),
        ),
    );
}

/// The events of a claim whose selected node is cleared: upstream's failed attempt (announced
/// by its Normal `Provisioning` first), or our `SelectedNodeCleared`.
pub(super) fn selected_node_cleared(
    state: &Provisioner,
    pvc: &PersistentVolumeClaim,
    reason: &ClearReason,
) {
    if reason.is_failed_attempt() {
        provisioning_event(state, pvc);
        // Upstream's library counts such a reschedule as a failed provisioning attempt too.
        state
            .ctx
            .metrics
            .provision
            .failed(&class_label(pvc), &source_label(pvc));
    }
    state.ctx.events.emit(
        reference_to(pvc),
        EventSpec::warning(reason.event_reason(), reason.message()),
    );
}

pub(super) fn class_label(pvc: &PersistentVolumeClaim) -> String {
    pvc.spec
        .as_ref()
        .and_then(|s| s.storage_class_name.clone())
        .unwrap_or_default()
}

pub(super) fn source_label(pvc: &PersistentVolumeClaim) -> String {
    pvc.spec
        .as_ref()
        .and_then(|s| s.data_source.as_ref())
        .map(|d| d.kind.clone())
        .unwrap_or_default()
}

/// Reports a failure: `ProvisioningFailed` event, failure metric; returns the error to requeue with.
pub(super) fn fail(
    state: &Provisioner,
    pvc: &PersistentVolumeClaim,
    message: String,
) -> ProvisionError {
    warn!(claim = %claim_key(pvc), "provisioning failed: {message}");
    state.ctx.events.emit(
        reference_to(pvc),
        EventSpec::warning(names::EVENT_PROVISIONING_FAILED, message.clone()),
    );
    state
        .ctx
        .metrics
        .provision
        .failed(&class_label(pvc), &source_label(pvc));
    ProvisionError::Reported(message)
}

pub(super) fn kube_err(what: impl Into<String>) -> impl FnOnce(kube::Error) -> ProvisionError {
    let what = what.into();
    move |source| ProvisionError::Kube { what, source }
}
