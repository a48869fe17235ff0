//! The provisioning executor: the one place that calls the driver for a claim (CreateVolume in
//! [`create_volume`], DeleteVolume in [`delete_volume`]) and creates the PV, in the order the plan
//! requires (secret, intent, CreateVolume, PV, intent removal). What each answer means is decided
//! by pure functions (`pv::PvTemplate::fill`, `model::claim::abandoned_since`, `pv::pv_holds_volume`,
//! `classify::provisioning_state`); this only performs the steps.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::api::PostParams;
use kube::{Api, ResourceExt};
use tracing::{debug, info, warn};

use super::claim_writes::clear_selected_node;
use super::{
    PV_CREATE_ATTEMPTS, ProvisionError, Provisioner, claim_key, class_label, fail,
    provisioning_event, source_label,
};
use crate::csi::v1;
use crate::k8s::events::{EventSpec, reference_to};
use crate::model::claim::abandoned_since;
use crate::model::secrets::{SecretFetchError, SecretRef};
use crate::names;
use crate::provision::classify::{
    ProvisioningState, infeasible_event_message, is_infeasible, provisioning_state,
};
use crate::provision::controller::intents::ledger::Entry;
use crate::provision::controller::intents::{Forget, Pending, Recorded};
use crate::provision::plan::ProvisionPlan;
use crate::provision::pv::{NewPv, pv_holds_volume};
use crate::retry::{ApiErrorClass, Attempt, classify, describe, retry_transient};
use crate::runtime::queue::{Action, LOCK_RETRY};

/// Why a DeleteVolume of this controller did not happen. `Display` is the text events carry.
#[derive(Debug, thiserror::Error)]
pub(super) enum DeleteVolumeError {
    /// The provisioner secret could not be read.
    #[error(transparent)]
    Secret(#[from] SecretFetchError),
    /// The driver refused.
    #[error("{}", crate::csi::rpc_error(.0))]
    Rpc(#[source] tonic::Status),
}

/// Why the PV of a created volume was not written. `Display` is the text events carry.
#[derive(Debug, thiserror::Error)]
pub(super) enum CreatePvError {
    /// Transient API errors outlasted the attempts; `last` says the last one.
    #[error("{last}; will retry (the volume is kept and reused)")]
    Transient {
        /// The last attempt's error.
        last: String,
    },
    /// A PV of this name exists for another volume.
    #[error(
        "PV {name} already exists for another volume (another instance provisioned this claim meanwhile); the volume created here is not used by it"
    )]
    OtherVolume {
        /// The PV name.
        name: String,
    },
    /// The API server will never accept this PV: the volume was deleted again.
    #[error("error creating PV {name}: {described}; the volume was deleted again")]
    RefusedVolumeDeleted {
        /// The PV name.
        name: String,
        /// The API server's answer.
        described: String,
    },
    /// The API server will never accept this PV, and deleting the volume failed too.
    #[error(
        "error creating PV {name}: {described}. Cleanup of volume {name} failed, volume is orphaned: {cleanup}"
    )]
    RefusedVolumeOrphaned {
        /// The PV name.
        name: String,
        /// The API server's answer.
        described: String,
        /// Why the volume could not be deleted.
        #[source]
        cleanup: DeleteVolumeError,
    },
}

/// Reads the provisioner secret's data for the request.
pub(super) async fn secret_data(
    state: &Provisioner,
    secret: &SecretRef,
) -> Result<HashMap<String, String>, SecretFetchError> {
    crate::model::secrets::credentials(&state.ctx.client, &secret.name, &secret.namespace).await
}

pub(super) async fn provision(
    state: &Provisioner,
    pvc: &Arc<PersistentVolumeClaim>,
    plan: Box<ProvisionPlan>,
) -> Result<Action, ProvisionError> {
    let ctx = &state.ctx;
    let key = claim_key(pvc);
    if let Err(remaining) = state
        .memory()
        .check_feasible(&key, &plan.class_uid, Instant::now())
    {
        // Upstream's words name the claim's UID.
        let uid = pvc.metadata.uid.as_deref().unwrap_or_default();
        debug!(claim = %key, "skipping volume provisioning for pvc {uid}, because provisioning previously failed with infeasible error");
        return Ok(Action::requeue(remaining));
    }
    for warning in &plan.warnings {
        debug!("{warning}");
    }
    let Some(_lock) = ctx.volume_locks.try_lock(&plan.volume_name) else {
        debug!(volume = %plan.volume_name, "volume busy with another operation; retrying shortly");
        return Ok(Action::requeue(LOCK_RETRY));
    };
    // This process created the PV moments ago and the cache has not caught up: nothing to do.
    if state.memory().recently_provisioned(&key, Instant::now()) {
        return Ok(Action::await_change());
    }
    // The cache, not a live read: if it lags behind a PV created moments ago, CreateVolume is
    // replayed for the same name (idempotent: the same volume) and the PV create answers
    // AlreadyExists, which is success for the same volume handle. Never a second volume.
    if state.ctx.stores.pvs.get(&plan.volume_name).is_some() {
        return Ok(Action::await_change());
    }
    provisioning_event(state, pvc);

    // The secret first: a claim whose secret is missing must not get an intent (and so a finalizer
    // that would need the secret to be removed) when nothing was sent to the driver.
    let mut request = plan.request.clone();
    if let Some(secret) = &plan.provisioner_secret {
        match secret_data(state, secret).await {
            Ok(data) => request.secrets = data,
            Err(e) => return Err(fail(state, pvc, e.to_string())),
        }
    }

    // Upstream's source protection, before anything is recorded or sent.
    if let Some(source) = &plan.source
        && let Err(message) = super::data_source::protect(state, source).await
    {
        return Err(fail(state, pvc, message));
    }

    let intent = match state.intents.record(pvc, intent_of(pvc, &plan)).await {
        Ok(Recorded::Durable(intent)) => intent,
        // Deleted meanwhile: nothing was started, so nothing can leak.
        Ok(Recorded::ClaimDeleting) => return Ok(Action::await_change()),
        // Without the record a claim deleted during CreateVolume could leak its volume: the user
        // is told why nothing happens, and the claim is retried with its backoff.
        Err(e) => return Err(fail(state, pvc, e.to_string())),
    };
    create_volume_and_pv(state, pvc, plan, request, &intent).await
}

/// The intent recorded before `plan`'s CreateVolume.
fn intent_of(pvc: &PersistentVolumeClaim, plan: &ProvisionPlan) -> Entry {
    Entry::new(
        pvc,
        &plan.request,
        plan.provisioner_secret.as_ref(),
        plan.pv.reclaim_policy.as_deref() == Some("Retain"),
    )
}

/// CreateVolume and the PV, once the intent is recorded.
async fn create_volume_and_pv(
    state: &Provisioner,
    pvc: &Arc<PersistentVolumeClaim>,
    plan: Box<ProvisionPlan>,
    request: v1::CreateVolumeRequest,
    intent: &Pending,
) -> Result<Action, ProvisionError> {
    let ctx = &state.ctx;
    let key = claim_key(pvc);
    let started = Instant::now();
    // CSI migration: `csi_sidecar_operations_seconds` marks the call as for a migrated volume.
    let answer = create_volume(state, request, plan.pv.in_tree.is_some()).await;
    // From now on retries must send this requirement, whatever happens to the nodes meanwhile.
    state
        .memory()
        .sent(&key, plan.request.accessibility_requirements.as_ref());
    let response = match answer {
        Ok(response) => response,
        Err(status) => return create_failed(state, pvc, &plan, status).await,
    };
    let NewPv { volume_id, mut pv } = match plan.pv.fill(&response) {
        Ok(new) => new,
        // The pin stays: the volume may exist, so a retry must be the identical request.
        Err(bad) => {
            let mut message = bad.to_string();
            if let Some(volume_id) = bad.volume_to_delete()
                && let Err(e) =
                    delete_volume(state, volume_id, plan.provisioner_secret.as_ref()).await
            {
                message = bad.with_failed_cleanup(&plan.volume_name, &e.to_string());
            }
            return Err(fail(state, pvc, message));
        }
    };
    info!(claim = %claim_key(pvc), volume = %plan.volume_name, volume_id = ?volume_id, "volume created");
    if claim_abandoned(state, pvc) {
        // Deleted while the volume was being created: no PV for a claim that is gone (it would
        // only be released and deleted again, at three more writes); the entry is dropped once
        // the volume is deleted, or resolved later if that fails.
        state.intents.set_id(intent, &volume_id).await;
        return match delete_volume(state, &volume_id, plan.provisioner_secret.as_ref()).await {
            Ok(()) => {
                info!(claim = %claim_key(pvc), volume = %plan.volume_name, "claim deleted during CreateVolume; volume deleted again");
                state.intents.forget(intent, Forget::Done).await?;
                Ok(Action::await_change())
            }
            Err(e) => {
                warn!(claim = %claim_key(pvc), volume = %plan.volume_name, "claim deleted during CreateVolume; deleting the volume failed, retrying: {e}");
                Ok(Action::await_change())
            }
        };
    }

    if let Some(mode) = &state.settings.node {
        // Node mode: each instance watches only PVs labelled with its node (node_mode::scope).
        crate::node_mode::scope::label_new_pv(
            &mut pv,
            &state.settings.driver,
            &mode.me.name,
            &mode.me.segments,
        );
    }
    if let Err(e) = create_pv(state, &pv, plan.provisioner_secret.as_ref()).await {
        if matches!(e, CreatePvError::OtherVolume { .. }) {
            // The id tells the resolver that the PV holds another volume: once the claim is bound
            // to it, this one is deleted (intents::resolution::Resolution::CheckPv).
            state.intents.set_id(intent, &volume_id).await;
        }
        // The volume exists and the pin stays: the retry replays the identical CreateVolume.
        return Err(fail(state, pvc, e.to_string()));
    }
    state.memory().provisioned(&key);
    state.intents.forget(intent, Forget::Done).await?;
    if let Some(source) = &plan.source {
        super::data_source::release_snapshot(state, pvc, source).await;
    }
    ctx.events.emit(
        reference_to(pvc.as_ref()),
        EventSpec::normal(
            names::EVENT_PROVISIONING_SUCCEEDED,
            format!("Successfully provisioned volume {}", plan.volume_name),
        ),
    );
    ctx.metrics
        .provision
        .succeeded(&class_label(pvc), &source_label(pvc), started.elapsed());
    Ok(Action::await_change())
}

/// Whether the claim was deleted (or is being deleted) since this reconcile read it, as the cache
/// says now ([`abandoned_since`]).
fn claim_abandoned(state: &Provisioner, pvc: &PersistentVolumeClaim) -> bool {
    let cached = state.ctx.stores.pvcs.get(&crate::k8s::cache::key(
        pvc.metadata.namespace.as_deref(),
        &pvc.name_any(),
    ));
    abandoned_since(pvc, cached.map(|c| c.full()).as_ref())
}

/// CreateVolume failed: classify as upstream does and act on the state.
pub(super) async fn create_failed(
    state: &Provisioner,
    pvc: &Arc<PersistentVolumeClaim>,
    plan: &ProvisionPlan,
    status: tonic::Status,
) -> Result<Action, ProvisionError> {
    let outcome = provisioning_state(status.code(), plan.may_reschedule);
    let message = crate::csi::rpc_error(&status);
    let infeasible = is_infeasible(status.code());
    state.memory().create_failed(
        &claim_key(pvc),
        outcome,
        infeasible.then(|| (plan.class_uid.as_str(), Instant::now())),
    );
    if outcome == ProvisioningState::Finished
        && let Some(max) = plan.max_failures
        && state.memory().final_failure(&claim_key(pvc)) >= max
    {
        return give_up(state, pvc, plan, max, &message).await;
    }
    if infeasible {
        return Err(fail(state, pvc, infeasible_event_message(&message)));
    }
    match outcome {
        ProvisioningState::Reschedule => {
            let error = fail(state, pvc, message);
            clear_selected_node(state, pvc).await?;
            debug!(claim = %claim_key(pvc), "selected node cleared for rescheduling: {error}");
            Ok(Action::await_change())
        }
        // InBackground keeps the intent (the volume may still appear); Finished and NoChange are
        // retried with backoff too, as upstream does.
        ProvisioningState::InBackground
        | ProvisioningState::Finished
        | ProvisioningState::NoChange => Err(fail(state, pvc, message)),
    }
}

/// The class's retry policy is exhausted: the stop goes on the claim (one write, so it survives a
/// restart and shows in `kubectl describe`), with one Warning event; nothing is retried until the
/// annotation is removed.
async fn give_up(
    state: &Provisioner,
    pvc: &Arc<PersistentVolumeClaim>,
    plan: &ProvisionPlan,
    failures: u32,
    message: &str,
) -> Result<Action, ProvisionError> {
    use crate::provision::classify::{stopped_message, stopped_value};
    let value = stopped_value(failures, message);
    crate::k8s::patch::set_annotation(
        &super::claim_writes::claims_api(state, pvc),
        pvc.as_ref(),
        crate::names::ANN_PROVISIONING_STOPPED,
        &value,
    )
    .await
    .map_err(|e| {
        fail(
            state,
            pvc,
            format!("{message}; recording that provisioning stops failed: {e}"),
        )
    })?;
    state.memory().stopped(&claim_key(pvc));
    let error = fail(
        state,
        pvc,
        stopped_message(&plan.class_name, failures, message),
    );
    debug!(claim = %claim_key(pvc), "{error}");
    Ok(Action::await_change())
}

/// Creates the PV, retrying transient API errors. `AlreadyExists` for the same volume is success.
/// `secret`: the provisioner secret, for deleting the volume again if the PV can never be saved.
pub(super) async fn create_pv(
    state: &Provisioner,
    pv: &PersistentVolume,
    secret: Option<&SecretRef>,
) -> Result<(), CreatePvError> {
    let api: Api<PersistentVolume> = Api::all(state.ctx.client.clone());
    let name = pv.name_any();
    let handle = pv
        .spec
        .as_ref()
        .and_then(|s| s.csi.as_ref())
        .map(|c| c.volume_handle.clone());
    let created = retry_transient(
        PV_CREATE_ATTEMPTS,
        Duration::from_millis(100),
        Duration::from_secs(5),
        |attempt| {
            let (api, name) = (&api, &name);
            async move {
                // Leader election: a replica whose lease may have passed to another must not write.
                state.ctx.leadership.acting().await;
                match api.create(&PostParams::default(), pv).await {
                    Ok(_) => Attempt::Done(Ok(None)),
                    Err(e) => match classify(&e) {
                        class @ (ApiErrorClass::AlreadyExists | ApiErrorClass::Invalid) => {
                            Attempt::Done(Ok(Some((class, describe(&e)))))
                        }
                        class => {
                            let error =
                                format!("error creating PV {name} ({class}): {}", describe(&e));
                            debug!(attempt, "{error}");
                            Attempt::Transient {
                                error,
                                retry_after: class.retry_after(),
                            }
                        }
                    },
                }
            }
        },
    )
    .await
    .map_err(|last| CreatePvError::Transient { last })?;
    match created {
        None => {
            info!(pv = %name, "PV created");
            Ok(())
        }
        Some((ApiErrorClass::AlreadyExists, _)) => {
            let cached = state.ctx.stores.pvs.get(&name);
            let existing = match cached {
                Some(pv) => Some(pv.full()),
                None => api.get_opt(&name).await.ok().flatten(),
            };
            if pv_holds_volume(existing.as_ref(), handle.as_deref()) {
                return Ok(());
            }
            Err(CreatePvError::OtherVolume { name })
        }
        Some((_, described)) => {
            // The API server will never accept this PV: delete the volume rather than leak it.
            let cleanup = match &handle {
                Some(id) => delete_volume(state, id, secret).await.err(),
                None => None,
            };
            Err(match cleanup {
                None => CreatePvError::RefusedVolumeDeleted { name, described },
                Some(cleanup) => CreatePvError::RefusedVolumeOrphaned {
                    name,
                    described,
                    cleanup,
                },
            })
        }
    }
}

/// Every CreateVolume of this controller goes through here (provisioning, and the resolver's
/// replay that learns an abandoned volume's id).
pub(super) async fn create_volume(
    state: &Provisioner,
    request: v1::CreateVolumeRequest,
    migrated: bool,
) -> Result<v1::CreateVolumeResponse, tonic::Status> {
    state.ctx.csi.create_volume(request, migrated).await
}

/// Every DeleteVolume of this controller goes through here (a volume the API server will not
/// take a PV for, an answer that fails the checks, an abandoned intent's volume), with the
/// provisioner secret when one was used.
pub(super) async fn delete_volume(
    state: &Provisioner,
    volume_id: &str,
    secret: Option<&SecretRef>,
) -> Result<(), DeleteVolumeError> {
    let secrets = match secret {
        Some(s) => secret_data(state, s).await?,
        None => HashMap::new(),
    };
    state
        .ctx
        .csi
        .delete_volume(
            v1::DeleteVolumeRequest {
                volume_id: volume_id.to_owned(),
                secrets,
            },
            false,
        )
        .await
        .map(|_| ())
        .map_err(DeleteVolumeError::Rpc)
}
