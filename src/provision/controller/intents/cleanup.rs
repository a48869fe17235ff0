//! The clean-up of an intent whose claim no longer wants its volume (pure): learn the volume id
//! (replaying CreateVolume with the same name when it was never recorded), delete the volume,
//! drop the intent. The resolver (`provision::controller::intents::resolve`) performs the steps.

use crate::csi::v1::CreateVolumeRequest;
use crate::provision::classify::{ReplayVerdict, replay_needs_admin_message, replay_verdict};
use crate::provision::controller::intents::ledger::Entry;

/// The next step of an intent clean-up (the shell has found no PV holding the volume).
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum CleanupStep {
    /// Only drop the intent: the volume is gone, is the one a PV holds, or cannot be deleted by
    /// id (reported).
    DropIntent,
    /// Drop the intent and report the volume as kept: there is neither a volume id nor a request
    /// to find it by (a record of a build that did not keep requests, or one that does not
    /// decode), so whether it exists cannot be told.
    KeepAndReport,
    /// Delete the volume by id, then drop the intent.
    DeleteVolume {
        /// The volume id.
        volume_id: String,
    },
    /// Replay the recorded CreateVolume (same name) to learn the id, then judge the answer with
    /// [`after_replay`]. The driver answers with the existing volume, or creates it, which is then
    /// deleted just the same.
    Replay(Box<CreateVolumeRequest>),
}

/// What to do with an intent whose claim no longer wants its volume.
pub(crate) fn cleanup_step(entry: &Entry) -> CleanupStep {
    match (entry.id.as_deref(), entry.request()) {
        (Some(id), _) => CleanupStep::DeleteVolume {
            volume_id: id.to_owned(),
        },
        (None, Some(request)) => CleanupStep::Replay(Box::new(request)),
        (None, None) => CleanupStep::KeepAndReport,
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

/// Judges the replay for `volume`: `Ok(id)` is the answered volume id (empty when none),
/// `Err((code, text))` a refusal, where `text` is the `rpc error: ..` rendering for messages.
pub(crate) fn after_replay(volume: &str, answer: Result<&str, (tonic::Code, &str)>) -> AfterReplay {
    match answer {
        Ok("") => AfterReplay::NoVolumeId(format!(
            "CreateVolume for {volume} answered without a volume id, so the volume of this deleted claim cannot be deleted by the provisioner: delete it on the storage backend by hand"
        )),
        Ok(id) => AfterReplay::Delete(id.to_owned()),
        Err((code, message)) => match replay_verdict(code) {
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
