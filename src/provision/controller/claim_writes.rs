//! Writes to the claim: the provisioning intent (record and remove), the selected node, live reads.

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::{Api, ResourceExt};
use tracing::debug;

use super::report::kube_err;
use super::{ProvisionError, Provisioner, claim_name};
use crate::k8s::errors::ApiErrorClass;
use crate::k8s::patch::{self, PatchOutcome, Step};
use crate::names;
use crate::provision::intent::{intent_removal_step, intent_write_step};
use crate::provision::plan::ProvisionPlan;

/// The ProvisioningFailed message for an intent that could not be written.
pub(super) fn intent_failure(error: &patch::PatchError) -> String {
    let hint = match error.class {
        ApiErrorClass::Forbidden => {
            "; grant the sidecar's ServiceAccount update (or patch) on persistentvolumeclaims"
        }
        _ => "; retrying",
    };
    format!(
        "no volume is created until the provisioning intent is recorded on the claim, and that failed: {error}{hint}"
    )
}

/// Adds the intent finalizer and annotations in one write ([`intent_write_step`]).
pub(super) async fn write_intent(
    state: &Provisioner,
    pvc: &PersistentVolumeClaim,
    plan: &ProvisionPlan,
) -> Result<PatchOutcome<PersistentVolumeClaim>, patch::PatchError> {
    let wanted = plan.intent_annotations();
    patch::patch_fresh(
        &claims_api(state, pvc),
        pvc,
        "record provisioning intent",
        |meta| intent_write_step(meta, &wanted),
    )
    .await
}

/// Removes the intent finalizer and annotations (the PV exists, or the volume is deleted again).
/// `pvc` seeds the first attempt: pass the freshest copy at hand (e.g. the one the intent write
/// returned) to save a read.
pub(super) async fn finish_intent(
    state: &Provisioner,
    pvc: &PersistentVolumeClaim,
    volume_name: &str,
) -> Result<(), ProvisionError> {
    // No shortcut on `pvc`: it may be the copy read before this reconcile wrote the intent; the
    // patch below concludes "nothing to do" only from a fresh read.
    patch::patch_fresh(
        &claims_api(state, pvc),
        pvc,
        "remove provisioning intent",
        intent_removal_step,
    )
    .await?;
    debug!(claim = %claim_name(pvc), volume = %volume_name, "provisioning intent removed");
    Ok(())
}

/// [`finish_intent`] for a decision taken on the cached claim, which usually predates this
/// controller's own removal of the intent (the reconcile its own intent write queued): one read
/// settles that, where a write based on the cached copy would be refused and then read anyway.
pub(super) async fn finish_intent_read_first(
    state: &Provisioner,
    pvc: &PersistentVolumeClaim,
    volume_name: &str,
) -> Result<(), ProvisionError> {
    match live_claim(state, pvc).await? {
        Some(fresh) if intent_removal_step(&fresh.metadata) != Step::AlreadyDone => {
            finish_intent(state, &fresh, volume_name).await
        }
        _ => Ok(()),
    }
}

/// The claim as the API server has it now; `None` once it is gone (or its name is another
/// claim's).
pub(super) async fn live_claim(
    state: &Provisioner,
    pvc: &PersistentVolumeClaim,
) -> Result<Option<PersistentVolumeClaim>, ProvisionError> {
    let fresh = claims_api(state, pvc)
        .get_opt(&pvc.name_any())
        .await
        .map_err(kube_err(format!("reading claim {}", claim_name(pvc))))?;
    Ok(fresh.filter(|f| f.metadata.uid == pvc.metadata.uid))
}

pub(super) fn claims_api(
    state: &Provisioner,
    pvc: &PersistentVolumeClaim,
) -> Api<PersistentVolumeClaim> {
    Api::namespaced(
        state.ctx.client.clone(),
        &pvc.namespace().unwrap_or_default(),
    )
}

/// Removes `volume.kubernetes.io/selected-node` so the scheduler picks again.
pub(super) async fn clear_selected_node(
    state: &Provisioner,
    pvc: &PersistentVolumeClaim,
) -> Result<(), ProvisionError> {
    let Some(node) = crate::model::claim::selected_node(pvc).map(str::to_owned) else {
        return Ok(());
    };
    // Only the node the decision was about: the scheduler may have picked another meanwhile.
    patch::patch_fresh(
        &claims_api(state, pvc),
        pvc,
        "clear selected node",
        |meta| patch::remove_annotation_if_step(meta, names::ANN_SELECTED_NODE, &node),
    )
    .await?;
    Ok(())
}
