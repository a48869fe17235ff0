//! Clean-up of abandoned provisioning intents: the claim was deleted (or bound elsewhere) while its
//! volume may exist without a PV. Learn the volume id (replaying CreateVolume with the same name if
//! it was never recorded), delete the volume, then drop the intent.

use std::sync::Arc;

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use tracing::{info, warn};

use super::claim_writes::{claims_api, finish_intent, live_claim};
use super::execute::{create_volume, delete_volume, pv_exists, secret_data};
use super::{ProvisionError, Provisioner, claim_key, claim_name};
use crate::csi::v1;
use crate::k8s::events::{EventSpec, reference_to};
use crate::k8s::patch::{self, PatchOutcome};
use crate::k8s::secrets::SecretFetchError;
use crate::names;
use crate::provision::plan::{self, AfterReplay, CleanupStep, IntentCleanup};
use crate::runtime::Action;
use crate::runtime::skeleton::LOCK_RETRY;

/// Records the volume id on the claim so a later clean-up needs no CreateVolume replay.
async fn record_volume_id(
    state: &Provisioner,
    pvc: &PersistentVolumeClaim,
    volume_id: &str,
) -> Result<PatchOutcome<PersistentVolumeClaim>, ProvisionError> {
    let api = claims_api(state, pvc);
    Ok(patch::set_annotation(&api, pvc, names::ANN_INTENT_VOLUME_ID, volume_id).await?)
}

/// The claim no longer wants its volume: learn the id (replaying CreateVolume with the same name if
/// needed), delete the volume, then drop the intent. Each step is decided by
/// [`plan::cleanup_step`] and [`plan::after_replay`]; this only performs them.
pub(super) async fn cleanup_intent(
    state: &Provisioner,
    pvc: &Arc<PersistentVolumeClaim>,
    cleanup: IntentCleanup,
) -> Result<Action, ProvisionError> {
    let ctx = &state.ctx;
    let Some(_lock) = ctx.volume_locks.try_lock(&cleanup.volume_name) else {
        return Ok(Action::requeue(LOCK_RETRY));
    };
    // The cached claim may predate this controller's own last writes (the volume id it recorded,
    // the intent it removed): a live read keeps a finished clean-up from running twice.
    let Some(mut claim) = live_claim(state, pvc).await? else {
        return Ok(Action::await_change());
    };
    if !plan::has_intent(&claim) {
        return Ok(Action::await_change());
    }
    // The cache may lag: whether the PV exists is a live read.
    let pv_exists = pv_exists(state, &cleanup.volume_name).await?;
    let mut step = plan::cleanup_step(&cleanup, &claim, pv_exists);
    if let CleanupStep::Replay(request) = step {
        let verdict = match replay_for_id(state, &cleanup, *request).await {
            Ok(verdict) => verdict,
            Err(e) => return Err(cleanup_failed(state, pvc, e.to_string())),
        };
        step = match verdict {
            AfterReplay::Delete(volume_id) => CleanupStep::DeleteVolume {
                volume_id,
                record_id: true,
            },
            AfterReplay::NoVolumeId(message) => {
                warn!(claim = %claim_name(pvc), "{message}");
                ctx.events.emit(
                    reference_to(pvc.as_ref()),
                    EventSpec::warning(names::EVENT_PROVISIONING_CLEANUP_FAILED, message),
                );
                CleanupStep::DropIntent
            }
            AfterReplay::VolumeAbsent => CleanupStep::DropIntent,
            AfterReplay::Retry(message) => return Err(cleanup_failed(state, pvc, message)),
        };
    }
    if let CleanupStep::DeleteVolume {
        volume_id,
        record_id,
    } = &step
    {
        if *record_id
            && let Ok(PatchOutcome::Patched(updated)) =
                record_volume_id(state, &claim, volume_id).await
        {
            // Remembered: if the delete fails, the next attempt needs no replay.
            claim = updated;
        }
        if let Err(e) = delete_volume(state, volume_id, cleanup.secret.as_ref()).await {
            return Err(cleanup_failed(
                state,
                pvc,
                format!("error deleting volume {volume_id} of a deleted claim: {e}"),
            ));
        }
        info!(claim = %claim_name(pvc), volume = %cleanup.volume_name, %volume_id, reason = ?cleanup.reason, "volume of an abandoned provisioning deleted");
    }
    if !pv_exists {
        state.memory().unpin(&claim_key(pvc));
    }
    finish_intent(state, &claim, &cleanup.volume_name).await?;
    Ok(Action::await_change())
}

/// Replays CreateVolume (same name, with the provisioner secret) to learn the id of an abandoned
/// volume, and judges the answer ([`plan::after_replay`]). `Err`: the secret could not be read.
pub(super) async fn replay_for_id(
    state: &Provisioner,
    cleanup: &IntentCleanup,
    mut request: v1::CreateVolumeRequest,
) -> Result<AfterReplay, SecretFetchError> {
    if let Some(secret) = &cleanup.secret {
        request.secrets = secret_data(state, secret).await?;
    }
    Ok(match create_volume(state, request).await {
        Ok(response) => plan::after_replay(
            cleanup,
            Ok(response
                .volume
                .as_ref()
                .map_or("", |v| v.volume_id.as_str())),
        ),
        Err(status) => plan::after_replay(
            cleanup,
            Err((status.code(), &crate::csi::rpc_error(&status))),
        ),
    })
}

fn cleanup_failed(
    state: &Provisioner,
    pvc: &PersistentVolumeClaim,
    message: String,
) -> ProvisionError {
    warn!(claim = %claim_name(pvc), "{message}");
    state.ctx.events.emit(
        reference_to(pvc),
        EventSpec::warning(names::EVENT_PROVISIONING_CLEANUP_FAILED, message.clone()),
    );
    ProvisionError::Reported(message)
}
