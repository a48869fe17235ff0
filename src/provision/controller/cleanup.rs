//! Clean-up of abandoned provisioning intents: the claim was deleted (or bound elsewhere) while its
//! volume may exist without a PV. Learn the volume id (replaying CreateVolume with the same name if
//! it was never recorded), delete the volume, then drop the intent.

#[allow(clippy::wildcard_imports)]
use super::*;

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
/// needed), delete the volume, then drop the intent.
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
    // Never delete a volume whose PV exists: a live read, since the cache may lag.
    let pvs: Api<PersistentVolume> = Api::all(ctx.client.clone());
    if pvs
        .get_opt(&cleanup.volume_name)
        .await
        .map_err(kube_err(format!("reading PV {}", cleanup.volume_name)))?
        .is_some()
    {
        finish_intent(state, &claim, &cleanup.volume_name).await?;
        return Ok(Action::await_change());
    }
    let recorded_id = claim
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(names::ANN_INTENT_VOLUME_ID))
        .filter(|id| !id.is_empty())
        .cloned();
    let known_id = cleanup.volume_id.clone().or(recorded_id);
    let volume_id = match known_id.clone() {
        Some(id) => Some(id),
        None => match &cleanup.replay {
            None => None,
            Some(request) => {
                let mut request = request.clone();
                if let Some(secret) = &cleanup.secret {
                    match secret_data(state, secret).await {
                        Ok(data) => request.secrets = data,
                        Err(message) => return Err(cleanup_failed(state, pvc, message)),
                    }
                }
                match ctx.csi.create_volume(request).await {
                    Ok(response) => {
                        let id = response
                            .volume
                            .map(|v| v.volume_id)
                            .filter(|id| !id.is_empty());
                        if id.is_none() {
                            // A driver that breaks the spec this way leaves nothing to delete by;
                            // say so once and let the claim go rather than hold it forever.
                            let message = format!(
                                "CreateVolume for {} answered without a volume id, so the volume of this deleted claim cannot be deleted by the provisioner: delete it on the storage backend by hand",
                                cleanup.volume_name
                            );
                            warn!(claim = %claim_name(pvc), "{message}");
                            ctx.events.emit(
                                reference_to(pvc.as_ref()),
                                EventSpec::warning(
                                    names::EVENT_PROVISIONING_CLEANUP_FAILED,
                                    message,
                                ),
                            );
                        }
                        id
                    }
                    Err(status) => {
                        let message = format!(
                            "rpc error: code = {:?} desc = {}",
                            status.code(),
                            status.message()
                        );
                        // The intent stays unless the refusal proves the volume never existed.
                        let event = match replay_verdict(status.code(), cleanup.replay_is_exact) {
                            ReplayVerdict::VolumeAbsent => None,
                            ReplayVerdict::RetryLater => Some(format!(
                                "cannot find the volume {} of a deleted claim to delete it: {message}; will retry",
                                cleanup.volume_name
                            )),
                            ReplayVerdict::NeedsAdmin => {
                                Some(replay_needs_admin_message(&cleanup.volume_name, &message))
                            }
                        };
                        if let Some(event) = event {
                            return Err(cleanup_failed(state, pvc, event));
                        }
                        None
                    }
                }
            }
        },
    };
    if let Some(volume_id) = &volume_id {
        if known_id.is_none() {
            // Remember the id: if the delete fails, the next attempt needs no replay.
            if let Ok(PatchOutcome::Patched(updated)) =
                record_volume_id(state, &claim, volume_id).await
            {
                claim = updated;
            }
        }
        if let Err(message) = delete_volume(state, volume_id, cleanup.secret.as_ref()).await {
            return Err(cleanup_failed(
                state,
                pvc,
                format!("error deleting volume {volume_id} of a deleted claim: {message}"),
            ));
        }
        info!(claim = %claim_name(pvc), volume = %cleanup.volume_name, %volume_id, reason = ?cleanup.reason, "volume of an abandoned provisioning deleted");
    }
    state.pins().forget(&claim_key(pvc));
    finish_intent(state, &claim, &cleanup.volume_name).await?;
    Ok(Action::await_change())
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
