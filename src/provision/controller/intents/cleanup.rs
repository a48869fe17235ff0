//! The clean-up of an intent whose claim no longer wants its volume (pure): learn the volume id
//! (replaying CreateVolume with the same name when it was never recorded), delete the volume,
//! drop the intent. The resolver (`provision::controller::intents::resolve`) performs the steps.

use crate::csi::v1::CreateVolumeRequest;
use crate::model::secrets::SecretRef;
use crate::provision::classify::{ReplayVerdict, replay_needs_admin_message, replay_verdict};

/// A volume to delete because its claim no longer wants it.
#[derive(Debug, Clone)]
pub(crate) struct IntentCleanup {
    /// The intent's volume name.
    pub(crate) volume_name: String,
    /// The volume id, when CreateVolume's answer was recorded.
    pub(crate) volume_id: Option<String>,
    /// The provisioner secret recorded with the intent (for CreateVolume replay and DeleteVolume).
    pub(crate) secret: Option<SecretRef>,
    /// Without a volume id: the CreateVolume to replay (same name) to learn it. The driver answers
    /// with the existing volume, or creates it, which is then deleted just the same. A failed
    /// replay is judged by [`replay_verdict`].
    pub(crate) replay: Option<CreateVolumeRequest>,
    /// Whether `replay` is the request the original call was sent with; otherwise a minimal one,
    /// whose refusal proves nothing.
    pub(crate) replay_is_exact: bool,
}

/// The next step of an intent clean-up (the shell has found no PV holding the volume).
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum CleanupStep {
    /// Only drop the intent: there is neither a volume id nor a request to learn it by.
    DropIntent,
    /// Delete the volume by id, then drop the intent.
    DeleteVolume {
        /// The volume id.
        volume_id: String,
    },
    /// Replay CreateVolume (same name) to learn the id, then judge the answer with
    /// [`after_replay`].
    Replay(Box<CreateVolumeRequest>),
}

/// What to do with an intent whose claim no longer wants its volume.
pub(crate) fn cleanup_step(cleanup: &IntentCleanup) -> CleanupStep {
    match (cleanup.volume_id.as_deref(), &cleanup.replay) {
        (Some(id), _) => CleanupStep::DeleteVolume {
            volume_id: id.to_owned(),
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
#[path = "cleanup_tests.rs"]
mod tests;
