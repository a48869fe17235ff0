//! The controller's own writes to a claim (the selected node) and the claim's API. The intent
//! record is the intent log's (`provision::controller::intents`).

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::{Api, ResourceExt};

use super::{ProvisionError, Provisioner};
use crate::k8s::patch;
use crate::names;

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
