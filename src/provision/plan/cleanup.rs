//! What an intent whose claim no longer wants its volume takes: who acts on it (in node mode only
//! the selected node's instance) and the CreateVolume to replay when its volume id is unknown.

use k8s_openapi::api::core::v1::PersistentVolumeClaim;

use super::build::plan;
use super::{ClaimContext, ClaimDecision, ProvisionSettings};
use crate::csi::v1::CreateVolumeRequest;
use crate::model::claim::selected_node;
use crate::model::meta::non_empty_annotation;
use crate::names;
use crate::provision::intent::{CleanupReason, IntentCleanup, intent_secret};
use crate::provision::request::{
    self, RequestParts, create_volume_request, is_block, requested_bytes,
};

/// Who acts on an intent: in node mode only the selected node's instance.
pub(super) enum IntentOwner {
    Me,
    Nobody,
    Other,
}

pub(super) fn intent_owner(
    pvc: &PersistentVolumeClaim,
    settings: &ProvisionSettings,
) -> IntentOwner {
    match (&settings.node, selected_node(pvc)) {
        (None, _) => IntentOwner::Me,
        (Some(mode), Some(node)) if node == mode.me.name => IntentOwner::Me,
        (Some(_), Some(_)) => IntentOwner::Other,
        (Some(_), None) => IntentOwner::Nobody,
    }
}

/// The clean-up of an intent whose volume `reason` says is no longer wanted.
pub(super) fn cleanup(
    pvc: &PersistentVolumeClaim,
    ctx: &ClaimContext<'_>,
    volume_name: String,
    reason: CleanupReason,
) -> ClaimDecision {
    let volume_id =
        non_empty_annotation(&pvc.metadata, names::ANN_INTENT_VOLUME_ID).map(str::to_owned);
    let secret = intent_secret(pvc);
    let (replay, replay_is_exact) = if volume_id.is_some() {
        (None, false)
    } else {
        let exact = ctx
            .class
            .and_then(|class| plan(pvc, ctx, class, true).ok())
            .filter(|p| p.volume_name == volume_name)
            .map(|p| p.request);
        match exact {
            Some(req) => (Some(req), true),
            None => (Some(minimal_request(pvc, &volume_name)), false),
        }
    };
    ClaimDecision::CleanupIntent(Box::new(IntentCleanup {
        volume_name,
        volume_id,
        secret,
        replay,
        replay_is_exact,
        reason,
    }))
}

/// A CreateVolume with only what the claim itself says (no class, no topology), for replaying
/// when the original inputs are gone.
fn minimal_request(pvc: &PersistentVolumeClaim, volume_name: &str) -> CreateVolumeRequest {
    let modes = pvc
        .spec
        .as_ref()
        .and_then(|s| s.access_modes.clone())
        .filter(|m| !m.is_empty())
        .unwrap_or_else(|| vec!["ReadWriteOnce".to_owned()]);
    let capabilities = request::volume_capabilities(&modes, is_block(pvc), "", &[], false)
        .or_else(|_| {
            request::volume_capabilities(
                &["ReadWriteOnce".to_owned()],
                is_block(pvc),
                "",
                &[],
                false,
            )
        })
        .unwrap_or_default();
    create_volume_request(RequestParts {
        name: volume_name.to_owned(),
        required_bytes: requested_bytes(pvc).unwrap_or(0),
        capabilities,
        ..RequestParts::default()
    })
}
