//! The reclaim controller shell: for each PV event, look up what [`plan::decide`] needs (claim,
//! attachments, class, node locality), execute the one step it returns, and repeat until nothing is
//! left to do. Finalizer writes go through `k8s::patch` (fresh reads, no retry cap), so a PV never
//! gets stuck Terminating because of a lost race with another controller.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::runtime::reflector::ObjectRef;
use kube::{Api, ResourceExt};
use tracing::{debug, info, info_span, warn};

use super::plan::{
    self, AttachmentState, ClaimState, DeletionSecrets, Locality, ReclaimAction, ReclaimContext,
    SkipReason, StorageClassLookup,
};
use crate::csi::v1;
use crate::k8s::events::{EventSpec, reference_to};
use crate::k8s::lean::Lean;
use crate::k8s::patch::{self, DeleteOutcome, PatchOutcome};
use crate::names;
use crate::node_mode::ownership::may_delete_here;
use crate::retry::Backoff;
use crate::runtime::queue::Key;
use crate::runtime::skeleton::{self, LOCK_RETRY};
use crate::runtime::{Action, Context, Shutdown};

/// Longest pause between two looks at a PV that waits for its volume to be detached.
const DETACH_RECHECK_MAX: Duration = Duration::from_secs(10);
/// Retry delay when a cache the decision needs has not been filled yet.
const UNKNOWN_RETRY: Duration = Duration::from_secs(1);
/// Size of the deleted-volume memo at which entries of PVs that no longer exist are dropped.
const PRUNE_AT: usize = 4096;
/// Steps executed in one reconcile before yielding (each step re-reads the PV it wrote).
const MAX_STEPS: usize = 4;

/// Why a reconcile failed; the PV is retried with its backoff.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ReclaimFailure {
    /// Reported in a `VolumeFailedDelete` event already.
    #[error("{0}")]
    Reported(String),
    /// A VolumeAttachment still names the PV (reported once per wait).
    #[error("{0}")]
    Attached(String),
    /// A Kubernetes write failed.
    #[error(transparent)]
    Patch(#[from] patch::PatchError),
    /// A Kubernetes read failed.
    #[error("{what}: {}", crate::k8s::errors::describe(source))]
    Kube {
        /// What was attempted.
        what: String,
        /// The error.
        #[source]
        source: kube::Error,
    },
}

struct Reclaimer {
    ctx: Arc<Context>,
    backoff: Mutex<Backoff<String>>,
    /// PV UIDs whose DeleteVolume returned OK in this process: the PV update our own DELETE
    /// causes must not send DeleteVolume again (upstream issue 1235).
    deleted: Mutex<HashSet<String>>,
    /// PV UIDs this process finished (PV deleted and our finalizer removed): the watch events
    /// that follow (deletion timestamp, finalizer removal) are old news and cost no request.
    /// Without this, a mass deletion re-read claims, re-sent DELETEs and re-patched gone PVs
    /// for one PV in two.
    finished: Mutex<HashSet<String>>,
    /// Node mode: our NodeGetInfo segments.
    segments: Option<HashMap<String, String>>,
    /// PV UIDs waiting for a detach: the wait is logged at info once, then at debug per retry.
    waiting_for_detach: Mutex<HashSet<String>>,
    /// PV UIDs whose claim the cache showed gone while the phase still said Bound: given one
    /// [`UNKNOWN_RETRY`] for the PV controller's `Released` before a live GET confirms.
    awaiting_release: Mutex<HashSet<String>>,
}

/// Runs the reclaim controller until shutdown.
pub(crate) async fn run(
    ctx: Arc<Context>,
    pvs: impl Stream<Item = Arc<Lean<PersistentVolume>>> + Send + 'static,
    pvcs: impl Stream<Item = Arc<Lean<PersistentVolumeClaim>>> + Send + 'static,
    shutdown: Shutdown,
) {
    let segments = ctx.config.node_deployment.as_ref().map(|_| {
        ctx.driver
            .node
            .as_ref()
            .map(|n| n.accessible_topology.clone().into_iter().collect())
            .unwrap_or_default()
    });
    let p = &ctx.config.provisioning;
    let state = Arc::new(Reclaimer {
        backoff: Mutex::new(Backoff::new(p.retry_interval_start, p.retry_interval_max)),
        deleted: Mutex::new(HashSet::new()),
        finished: Mutex::new(HashSet::new()),
        segments,
        waiting_for_detach: Mutex::new(HashSet::new()),
        awaiting_release: Mutex::new(HashSet::new()),
        ctx: ctx.clone(),
    });
    let mut triggers = vec![
        skeleton::keys_of(pvs).boxed(),
        // A claim that changes (bound, being deleted) matters to its PV.
        pvcs.filter_map(|pvc| async move {
            let volume = pvc.full().spec?.volume_name?;
            (!volume.is_empty()).then(|| Key::from(volume))
        })
        .boxed(),
    ];
    if let Some(index) = &ctx.stores.attachments {
        // A deletion waiting for a detach goes on as soon as the last attachment is gone.
        triggers.push(index.detachments().map(Key::from).boxed());
    }
    // Per-PV state of vanished PVs goes at each resync.
    let pruned = state.clone();
    let prune = move || pruned.forget_vanished_pvs();
    let span = info_span!("reclaim");
    skeleton::drive(
        &ctx,
        span,
        "PV",
        crate::metrics::workqueue::VOLUMES,
        ctx.stores.pvs.clone(),
        futures::stream::select_all(triggers),
        reconcile,
        error_policy,
        state,
        prune,
        shutdown,
    )
    .await;
}

fn error_policy(
    pv: Arc<Lean<PersistentVolume>>,
    error: &ReclaimFailure,
    state: Arc<Reclaimer>,
) -> Action {
    state.ctx.metrics.operator.retried("deletion");
    let mut delay = crate::sync::lock(&state.backoff).failed(&pv.name().to_owned());
    if matches!(error, ReclaimFailure::Attached(_)) {
        // The check is an in-memory index lookup, and no event announces the detach: look again
        // soon rather than after the full backoff.
        delay = delay.min(DETACH_RECHECK_MAX);
    }
    debug!(pv = %pv.name(), error = %error, ?delay, "will retry");
    Action::requeue(delay)
}

fn class_label(pv: &PersistentVolume) -> String {
    pv.spec
        .as_ref()
        .and_then(|s| s.storage_class_name.clone())
        .unwrap_or_default()
}

/// Whether the PV's claim exists: the cache first, a live GET to confirm an absence (a lagging
/// cache must never get a volume in use deleted). The PV controller marks the PV `Released`
/// moments after its claim goes, and that update answers for free, so the first absence of a PV
/// not being deleted waits for it ([`ClaimState::Unknown`]: retried after [`UNKNOWN_RETRY`]); only
/// a phase still lagging then is confirmed by the GET.
async fn claim_state(
    state: &Reclaimer,
    pv: &PersistentVolume,
) -> Result<ClaimState, ReclaimFailure> {
    let Some((namespace, name, _uid)) = plan::claim_to_check(pv) else {
        return Ok(ClaimState::Unknown);
    };
    let cached = state
        .ctx
        .stores
        .pvcs
        .get(&crate::k8s::lean::key(Some(namespace), name))
        .map(|c| c.full());
    if plan::claim_state(pv, cached.as_ref()) == ClaimState::Exists {
        return Ok(ClaimState::Exists);
    }
    let uid = pv.metadata.uid.clone().unwrap_or_default();
    if pv.metadata.deletion_timestamp.is_none()
        && crate::sync::lock(&state.awaiting_release).insert(uid)
    {
        return Ok(ClaimState::Unknown);
    }
    let api: Api<PersistentVolumeClaim> = Api::namespaced(state.ctx.client.clone(), namespace);
    match api.get_opt(name).await {
        Ok(found) => Ok(plan::claim_state(pv, found.as_ref())),
        Err(source) => Err(ReclaimFailure::Kube {
            what: format!("reading claim {namespace}/{name} of PV {}", pv.name_any()),
            source,
        }),
    }
}

async fn reconcile(
    pv: Arc<Lean<PersistentVolume>>,
    state: Arc<Reclaimer>,
) -> Result<Action, ReclaimFailure> {
    if !pv.uid().is_empty() && crate::sync::lock(&state.finished).contains(pv.uid()) {
        return Ok(Action::await_change());
    }
    let mut current = pv.full();
    for _ in 0..MAX_STEPS {
        match step(&state, &current).await? {
            Next::Done(action) => {
                crate::sync::lock(&state.backoff).reset(&current.name_any());
                return Ok(action);
            }
            Next::Continue(updated) => current = *updated,
        }
    }
    Ok(Action::requeue(Duration::from_millis(10)))
}

/// What to do after one step.
enum Next {
    /// Stop here with this action.
    Done(Action),
    /// The PV changed (here is the fresh copy): decide again.
    Continue(Box<PersistentVolume>),
}

async fn step(state: &Reclaimer, pv: &PersistentVolume) -> Result<Next, ReclaimFailure> {
    let ctx = &state.ctx;
    let name = pv.name_any();
    let uid = pv.metadata.uid.clone().unwrap_or_default();
    let claim = claim_state(state, pv).await?;
    let attachment = match &ctx.stores.attachments {
        None => AttachmentState::Detached,
        Some(index) if !index.is_ready() => AttachmentState::Unknown,
        Some(index) => index
            .attached_node(&name)
            .map_or(AttachmentState::Detached, AttachmentState::AttachedTo),
    };
    let class = crate::model::volume::storage_class_name(pv)
        .map(|c| ctx.stores.classes.get(&ObjectRef::new(c)));
    // CSI migration: an in-tree PV (and its in-tree class) of the plugin our driver took over
    // is decided on as the CSI PV it translates to; a translation error is the failure.
    let translated = crate::migration::as_csi(&ctx.driver.name, pv);
    let (view, translation_error) = match &translated {
        Some(Ok(csi)) => (csi, None),
        Some(Err(e)) => (pv, Some(e.clone())),
        None => (pv, None),
    };
    let translated_class = match &class {
        Some(Some(c)) => crate::migration::class_as_csi(&ctx.driver.name, c),
        _ => None,
    };
    let storage_class = match (&class, &translated_class) {
        (_, Some(Ok(c))) => StorageClassLookup::Found(c),
        (_, Some(Err(e))) => StorageClassLookup::Untranslatable(e),
        (Some(Some(c)), None) => StorageClassLookup::Found(c.as_ref()),
        (Some(None) | None, None) => StorageClassLookup::Missing,
    };
    let locality = match &state.segments {
        None => Locality::Central,
        Some(segments) => match may_delete_here(view, segments) {
            Ok(accessible) => Locality::Node { accessible },
            Err(error) => Locality::InvalidNodeAffinity(error),
        },
    };
    let volume_deleted = crate::sync::lock(&state.deleted).contains(&uid);
    let decision = plan::decide(
        view,
        &ReclaimContext {
            driver_name: &ctx.driver.name,
            claim,
            publish_unpublish: ctx.driver.controller.publish_unpublish_volume,
            attachment,
            locality,
            storage_class,
            volume_deleted,
            translation_error: translation_error.as_deref(),
        },
    );
    let api: Api<PersistentVolume> = Api::all(ctx.client.clone());
    match decision {
        ReclaimAction::Skip(reason) => {
            let phase = pv.status.as_ref().and_then(|s| s.phase.as_deref());
            debug!(pv = %name, phase = %phase.unwrap_or_default(), ?reason, "nothing to do for PV");
            if pv.metadata.deletion_timestamp.is_none() {
                ctx.events.end_episode(&plan::wait_for_detach_episode(pv));
                state.wait_for_detach(&uid, false);
            }
            Ok(Next::Done(after_skip(reason)))
        }
        ReclaimAction::AddFinalizer => {
            let outcome =
                patch::add_finalizer(&api, pv, names::FINALIZER_PV_DELETION_PROTECTION).await?;
            debug!(pv = %name, "deletion-protection finalizer added");
            Ok(after_patch(outcome))
        }
        ReclaimAction::RemoveFinalizer(reason) => {
            let outcome =
                patch::remove_finalizer(&api, pv, names::FINALIZER_PV_DELETION_PROTECTION).await?;
            info!(pv = %name, ?reason, "deletion-protection finalizer removed");
            Ok(after_patch(outcome))
        }
        ReclaimAction::WaitForDetach { node } => {
            let message = plan::detach_message(&name, &node);
            if state.wait_for_detach(&uid, true) {
                info!(pv = %name, "{message}; deleting the volume once it is detached");
                // A refused deletion, as upstream counts it (dashboards alert on it); once per
                // wait, like its event, not at every re-check.
                ctx.metrics.delete.failed(&class_label(pv));
            } else {
                debug!(pv = %name, "{message}");
            }
            // One event per waiting episode, not one per retry (upstream issue 1574).
            ctx.events.emit(
                reference_to(pv),
                EventSpec::warning(names::EVENT_VOLUME_FAILED_DELETE, message.clone())
                    .once_per(plan::wait_for_detach_episode(pv)),
            );
            Err(ReclaimFailure::Attached(message))
        }
        ReclaimAction::Fail(err) => {
            let message = err.to_string();
            ctx.events.emit(
                reference_to(pv),
                EventSpec::warning(names::EVENT_VOLUME_FAILED_DELETE, message.clone()),
            );
            ctx.metrics.delete.failed(&class_label(pv));
            Err(ReclaimFailure::Reported(message))
        }
        ReclaimAction::DeleteVolume { volume_id, secrets } => {
            let Some(_lock) = ctx.volume_locks.try_lock(&name) else {
                return Ok(Next::Done(Action::requeue(LOCK_RETRY)));
            };
            let started = Instant::now();
            let secret_data = fetch_secrets(state, &name, &secrets).await;
            let result = crate::csi::metrics::migrated(
                translated.is_some(),
                ctx.csi.delete_volume(v1::DeleteVolumeRequest {
                    volume_id: volume_id.clone(),
                    secrets: secret_data,
                }),
            )
            .await;
            if let Err(status) = result {
                let message = crate::csi::rpc_error(&status);
                warn!(pv = %name, %volume_id, "DeleteVolume failed: {message}");
                ctx.events.emit(
                    reference_to(pv),
                    EventSpec::warning(names::EVENT_VOLUME_FAILED_DELETE, message.clone()),
                );
                ctx.metrics.delete.failed(&class_label(pv));
                return Err(ReclaimFailure::Reported(message));
            }
            info!(pv = %name, %volume_id, "volume deleted");
            ctx.capacity.volume_changed(pv);
            crate::sync::lock(&state.deleted).insert(uid.clone());
            ctx.metrics
                .delete
                .succeeded(&class_label(pv), started.elapsed());
            ctx.events.end_episode(&plan::wait_for_detach_episode(pv));
            state.wait_for_detach(&uid, false);
            finish(state, &api, pv, pv.metadata.deletion_timestamp.is_none()).await
        }
        ReclaimAction::DeletePvObject { issue_delete } => {
            finish(state, &api, pv, issue_delete).await
        }
    }
}

/// What a skipped PV waits for: a change of the PV or its claim, or (when something was not known
/// yet, e.g. the VolumeAttachment index still listing after a restart) a short while, since no
/// event announces that the missing knowledge arrived.
fn after_skip(reason: SkipReason) -> Action {
    match reason {
        SkipReason::ClaimUnknown
        | SkipReason::StorageClassUnknown
        | SkipReason::AttachmentsUnknown => Action::requeue(UNKNOWN_RETRY),
        SkipReason::NotOurs
        | SkipReason::NeverBound
        | SkipReason::NotDeletePolicy
        | SkipReason::DeletingWithoutFinalizer
        | SkipReason::ClaimInUse { .. }
        | SkipReason::NotReleased
        | SkipReason::NotOnThisNode
        | SkipReason::MigrationUnsupported => Action::await_change(),
    }
}

fn after_patch(outcome: PatchOutcome<PersistentVolume>) -> Next {
    match outcome {
        PatchOutcome::Patched(pv) | PatchOutcome::Unchanged(pv) | PatchOutcome::Deleting(pv) => {
            Next::Continue(Box::new(pv))
        }
        PatchOutcome::Gone => Next::Done(Action::await_change()),
    }
}

/// After DeleteVolume: delete the PV object (UID precondition), then remove our finalizer.
async fn finish(
    state: &Reclaimer,
    api: &Api<PersistentVolume>,
    pv: &PersistentVolume,
    issue_delete: bool,
) -> Result<Next, ReclaimFailure> {
    let name = pv.name_any();
    let uid = pv.metadata.uid.clone().unwrap_or_default();
    if issue_delete && patch::delete_with_uid(api, &name, &uid).await? == DeleteOutcome::Gone {
        crate::sync::lock(&state.finished).insert(uid);
        return Ok(Next::Done(Action::await_change()));
    }
    patch::remove_finalizer_by_value(api, pv, names::FINALIZER_PV_DELETION_PROTECTION).await?;
    crate::sync::lock(&state.finished).insert(uid);
    debug!(pv = %name, "PV deleted and deletion-protection finalizer removed");
    // The UID stays in `deleted` on purpose: a reconcile started from a cache that has not seen
    // the finalizer removal yet must not send DeleteVolume again. Entries of PVs that are gone are
    // pruned once the set grows.
    state.prune_deleted();
    Ok(Next::Done(Action::await_change()))
}

impl Reclaimer {
    /// Marks PV `uid` as waiting for a detach (or not); true when that starts a new wait.
    fn wait_for_detach(&self, uid: &str, waiting: bool) -> bool {
        let mut set = crate::sync::lock(&self.waiting_for_detach);
        if waiting {
            set.insert(uid.to_owned())
        } else {
            set.remove(uid);
            false
        }
    }

    fn prune_deleted(&self) {
        let len = crate::sync::lock(&self.deleted)
            .len()
            .max(crate::sync::lock(&self.finished).len());
        if len >= PRUNE_AT {
            self.forget_vanished_pvs();
        }
    }

    /// Drops the per-PV state of PVs no longer in the cache: a PV removed by someone else (or
    /// force-deleted) while it failed is never reconciled again.
    fn forget_vanished_pvs(&self) {
        let live: HashSet<String> = self
            .ctx
            .stores
            .pvs
            .state()
            .iter()
            .filter(|pv| !pv.uid().is_empty())
            .map(|pv| pv.uid().to_owned())
            .collect();
        crate::sync::lock(&self.deleted).retain(|uid| live.contains(uid));
        crate::sync::lock(&self.finished).retain(|uid| live.contains(uid));
        // The backoff is keyed by name (a PV re-created under its name starts over anyway).
        let names: HashSet<String> = self
            .ctx
            .stores
            .pvs
            .state()
            .iter()
            .map(|pv| pv.name().to_owned())
            .collect();
        crate::sync::lock(&self.backoff).retain(|name| names.contains(name));
        // PVs force-deleted (finalizer removed by hand) while they waited for a detach.
        crate::sync::lock(&self.waiting_for_detach).retain(|uid| live.contains(uid));
        crate::sync::lock(&self.awaiting_release).retain(|uid| live.contains(uid));
    }
}

/// The provisioner secret's data for DeleteVolume. A failed fetch is logged and the volume is
/// deleted without secrets, as upstream does (the secret may be gone with its namespace).
async fn fetch_secrets(
    state: &Reclaimer,
    pv_name: &str,
    secrets: &DeletionSecrets,
) -> HashMap<String, String> {
    if let DeletionSecrets::NoneWithWarning(warning) = secrets {
        warn!(pv = %pv_name, "{warning}");
    }
    let Some(secret) = secrets.secret_ref() else {
        return HashMap::new();
    };
    match crate::k8s::secrets::credentials(&state.ctx.client, &secret.name, &secret.namespace).await
    {
        Ok(data) => data,
        Err(e) => {
            warn!(pv = %pv_name, "{e}; deleting without secrets");
            HashMap::new()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pv_skipped_for_lack_of_knowledge_is_looked_at_again_soon() {
        for reason in [
            SkipReason::ClaimUnknown,
            SkipReason::StorageClassUnknown,
            SkipReason::AttachmentsUnknown,
        ] {
            assert_eq!(
                after_skip(reason),
                Action::requeue(UNKNOWN_RETRY),
                "{reason:?}"
            );
        }
        for reason in [
            SkipReason::NotOurs,
            SkipReason::NeverBound,
            SkipReason::ClaimInUse { deleting: true },
            SkipReason::NotReleased,
            SkipReason::NotOnThisNode,
        ] {
            assert_eq!(after_skip(reason), Action::await_change(), "{reason:?}");
        }
    }
}
