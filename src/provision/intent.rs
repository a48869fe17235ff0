//! The durable provisioning intent on a claim (see the state machine in [`super::plan`]): its
//! annotations, who acts on it in node mode, and what cleaning it up takes.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::PersistentVolumeClaim;

use super::plan::{ClaimContext, ClaimDecision, ProvisionSettings, annotation, plan};
use super::request::{self, RequestParts, create_volume_request, is_block, requested_bytes};
use super::secrets::SecretRef;
use crate::csi::v1::CreateVolumeRequest;
use crate::names;
use crate::node::ownership::selected_node;

/// Intent annotations for a volume name and provisioner secret.
pub fn intent_annotations(
    volume_name: &str,
    secret: Option<&SecretRef>,
) -> BTreeMap<&'static str, Option<String>> {
    BTreeMap::from([
        (names::ANN_INTENT_VOLUME_NAME, Some(volume_name.to_owned())),
        (
            names::ANN_INTENT_SECRET_NAME,
            secret.map(|s| s.name.clone()),
        ),
        (
            names::ANN_INTENT_SECRET_NAMESPACE,
            secret.map(|s| s.namespace.clone()),
        ),
    ])
}

/// A volume to delete because its claim no longer wants it.
#[derive(Debug, Clone)]
pub struct IntentCleanup {
    /// The intent's volume name.
    pub volume_name: String,
    /// The volume id, when CreateVolume's answer was recorded.
    pub volume_id: Option<String>,
    /// The provisioner secret recorded with the intent (for CreateVolume replay and DeleteVolume).
    pub secret: Option<SecretRef>,
    /// Without a volume id: the CreateVolume to replay (same name) to learn it. The driver answers
    /// with the existing volume, or creates it, which is then deleted just the same. A failed
    /// replay is judged by [`super::classify::replay_verdict`].
    pub replay: Option<CreateVolumeRequest>,
    /// Whether `replay` is the request the original call was built from (same class, same
    /// inputs); otherwise a minimal one (class gone or inputs no longer valid), whose refusal
    /// proves nothing.
    pub replay_is_exact: bool,
    /// Why the volume is no longer wanted.
    pub reason: CleanupReason,
}

/// Why an intent's volume is deleted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CleanupReason {
    /// The claim is being deleted.
    ClaimDeleted,
    /// The claim got bound to another PV.
    BoundElsewhere(String),
}

/// Whether the claim carries the provisioning intent.
pub fn has_intent(pvc: &PersistentVolumeClaim) -> bool {
    pvc.metadata
        .finalizers
        .as_ref()
        .is_some_and(|f| f.iter().any(|x| x == names::FINALIZER_PROVISIONING_INTENT))
}

pub(super) fn intent_secret(pvc: &PersistentVolumeClaim) -> Option<SecretRef> {
    Some(SecretRef::new(
        annotation(pvc, names::ANN_INTENT_SECRET_NAME)?,
        annotation(pvc, names::ANN_INTENT_SECRET_NAMESPACE)?,
    ))
}

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

pub(super) fn cleanup(
    pvc: &PersistentVolumeClaim,
    ctx: &ClaimContext<'_>,
    volume_name: String,
    reason: CleanupReason,
) -> ClaimDecision {
    let volume_id = annotation(pvc, names::ANN_INTENT_VOLUME_ID).map(str::to_owned);
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
