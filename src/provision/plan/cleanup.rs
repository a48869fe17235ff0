//! What an intent whose claim no longer wants its volume takes: who acts on it (in node mode only
//! the selected node's instance) and the CreateVolume to replay when its volume id is unknown.

use k8s_openapi::api::core::v1::PersistentVolumeClaim;

use super::build::plan;
use super::{ClaimContext, ClaimDecision, ProvisionSettings};
use crate::csi::v1::CreateVolumeRequest;
use crate::model::claim::selected_node;
use crate::model::meta::non_empty_annotation;
use crate::names;
use crate::provision::classify::{ReplayVerdict, replay_needs_admin_message, replay_verdict};
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

/// The next step of an intent clean-up, once the shell has read the live claim (still carrying
/// the intent) and whether the volume's PV exists.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum CleanupStep {
    /// Only drop the intent: the PV exists (the volume is wanted after all), or there is neither
    /// a volume id nor a request to learn it by.
    DropIntent,
    /// Delete the volume by id, then drop the intent.
    DeleteVolume {
        /// The volume id.
        volume_id: String,
        /// Whether the id was just learned and is worth recording on the claim first, so that a
        /// failed delete needs no second replay.
        record_id: bool,
    },
    /// Replay CreateVolume (same name) to learn the id, then judge the answer with
    /// [`after_replay`].
    Replay(Box<CreateVolumeRequest>),
}

/// What to do with an intent whose claim no longer wants its volume. `live` is the claim as the
/// API server has it now (the cache may predate our own last writes, such as the volume id).
pub(crate) fn cleanup_step(
    cleanup: &IntentCleanup,
    live: &PersistentVolumeClaim,
    pv_exists: bool,
) -> CleanupStep {
    if pv_exists {
        // Never delete a volume whose PV exists.
        return CleanupStep::DropIntent;
    }
    let recorded = non_empty_annotation(&live.metadata, names::ANN_INTENT_VOLUME_ID);
    match (cleanup.volume_id.as_deref().or(recorded), &cleanup.replay) {
        (Some(id), _) => CleanupStep::DeleteVolume {
            volume_id: id.to_owned(),
            record_id: false,
        },
        (None, Some(request)) => CleanupStep::Replay(Box::new(request.clone())),
        (None, None) => CleanupStep::DropIntent,
    }
}

/// What a CreateVolume replay's answer means for the clean-up.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum AfterReplay {
    /// Delete the volume of this id (and record the id first).
    Delete(String),
    /// The driver answered without a volume id (against the spec): nothing can be deleted by id;
    /// warn once with this message and drop the intent rather than hold the claim forever.
    NoVolumeId(String),
    /// The refusal proves the volume never existed: drop the intent.
    VolumeAbsent,
    /// Keep the intent and retry with backoff; this is the event message.
    Retry(String),
}

/// Judges a replay: `Ok(id)` is the answered volume id (empty when none), `Err((code, text))` a
/// refusal, where `text` is the `rpc error: ..` rendering for messages.
pub(crate) fn after_replay(
    cleanup: &IntentCleanup,
    answer: Result<&str, (tonic::Code, &str)>,
) -> AfterReplay {
    let volume = &cleanup.volume_name;
    match answer {
        Ok("") => AfterReplay::NoVolumeId(format!(
            "CreateVolume for {volume} answered without a volume id, so the volume of this deleted claim cannot be deleted by the provisioner: delete it on the storage backend by hand"
        )),
        Ok(id) => AfterReplay::Delete(id.to_owned()),
        Err((code, message)) => match replay_verdict(code, cleanup.replay_is_exact) {
            ReplayVerdict::VolumeAbsent => AfterReplay::VolumeAbsent,
            ReplayVerdict::RetryLater => AfterReplay::Retry(format!(
                "cannot find the volume {volume} of a deleted claim to delete it: {message}; will retry"
            )),
            ReplayVerdict::NeedsAdmin => {
                AfterReplay::Retry(replay_needs_admin_message(volume, message))
            }
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::pvc;

    fn abandoned(volume_id: Option<&str>, replay: bool, exact: bool) -> IntentCleanup {
        IntentCleanup {
            volume_name: "pvc-1".to_owned(),
            volume_id: volume_id.map(str::to_owned),
            secret: None,
            replay: replay.then(|| CreateVolumeRequest {
                name: "pvc-1".to_owned(),
                ..CreateVolumeRequest::default()
            }),
            replay_is_exact: exact,
            reason: CleanupReason::ClaimDeleted,
        }
    }

    #[test]
    fn a_volume_whose_pv_exists_is_never_deleted_only_its_intent_dropped() {
        let claim = pvc("ns", "c").build();
        let step = cleanup_step(&abandoned(Some("id-1"), false, false), &claim, true);
        assert_eq!(step, CleanupStep::DropIntent);
    }

    #[test]
    fn a_known_id_is_deleted_directly_and_the_live_claims_recorded_id_counts() {
        let claim = pvc("ns", "c").build();
        assert_eq!(
            cleanup_step(&abandoned(Some("id-1"), true, true), &claim, false),
            CleanupStep::DeleteVolume {
                volume_id: "id-1".to_owned(),
                record_id: false
            }
        );
        // The cached claim predates our write of the id; the live one has it: no replay.
        let live = pvc("ns", "c")
            .annotation(names::ANN_INTENT_VOLUME_ID, "id-2")
            .build();
        assert_eq!(
            cleanup_step(&abandoned(None, true, true), &live, false),
            CleanupStep::DeleteVolume {
                volume_id: "id-2".to_owned(),
                record_id: false
            }
        );
    }

    #[test]
    fn without_an_id_the_create_is_replayed_and_without_a_request_the_intent_is_dropped() {
        let claim = pvc("ns", "c").build();
        assert!(matches!(
            cleanup_step(&abandoned(None, true, true), &claim, false),
            CleanupStep::Replay(request) if request.name == "pvc-1"
        ));
        assert_eq!(
            cleanup_step(&abandoned(None, false, false), &claim, false),
            CleanupStep::DropIntent
        );
    }

    #[test]
    fn a_replay_answer_decides_between_delete_drop_and_retry() {
        let exact = abandoned(None, true, true);
        assert_eq!(
            after_replay(&exact, Ok("id-9")),
            AfterReplay::Delete("id-9".to_owned())
        );
        assert!(
            matches!(after_replay(&exact, Ok("")), AfterReplay::NoVolumeId(m) if m.contains("pvc-1"))
        );
        // An exact replay refused for good proves the original was refused too.
        assert_eq!(
            after_replay(&exact, Err((tonic::Code::InvalidArgument, "rpc error"))),
            AfterReplay::VolumeAbsent
        );
        // A minimal replay's refusal proves nothing; a transient error is retried.
        let minimal = abandoned(None, true, false);
        assert!(matches!(
            after_replay(&minimal, Err((tonic::Code::InvalidArgument, "rpc error"))),
            AfterReplay::Retry(_)
        ));
        assert!(matches!(
            after_replay(&exact, Err((tonic::Code::Unavailable, "rpc error: x"))),
            AfterReplay::Retry(m) if m.contains("will retry") && m.contains("rpc error: x")
        ));
    }
}
