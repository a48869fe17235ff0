//! The reclaim controller shell: for each PV event, gather what [`plan::decide`] needs once
//! ([`gather`]: claim, attachments, class, node locality, the PV as CSI), execute the one step it
//! returns, and repeat until nothing is left to do. Finalizer writes go through `k8s::patch`
//! (fresh reads, no retry cap), so a PV never gets stuck Terminating because of a lost race with
//! another controller.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::runtime::reflector::ObjectRef;
use kube::{Api, ResourceExt};
use tracing::{debug, info, info_span, warn};

use super::plan::{
    self, AttachmentState, ClaimLookup, ClaimState, DeletionSecrets, Locality, ReclaimAction,
    ReclaimContext, SkipReason, StorageClassLookup,
};
use crate::csi::v1;
use crate::k8s::cache::Lean;
use crate::k8s::events::{EventSpec, reference_to};
use crate::k8s::patch::{self, DeleteOutcome, PatchOutcome};
use crate::names;
use crate::node_mode::ownership::may_delete_here;
use crate::retry::delay_after;
use crate::runtime::queue::{self, Action, Key, LOCK_RETRY, QueueMetrics};
use crate::runtime::{Context, Shutdown};

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
    #[error("{what}: {}", crate::retry::describe(source))]
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
    /// Node mode: our NodeGetInfo segments.
    segments: Option<HashMap<String, String>>,
    /// What this process remembers per PV UID; nothing of it is needed after a restart (the PV
    /// says what is left to do).
    memory: Mutex<HashMap<String, PvMemory>>,
}

/// What the reclaimer remembers of one PV: only what saves requests or log lines, decided by
/// nothing but `plan`.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct PvMemory {
    /// Consecutive failed reconciles (the retry backoff).
    failures: u32,
    /// DeleteVolume returned OK in this process: the PV update our own DELETE causes must not
    /// send DeleteVolume again (upstream issue 1235).
    volume_deleted: bool,
    /// PV deleted and our finalizer removed by this process: the watch events that follow are old
    /// news and cost no request (a mass deletion otherwise re-read claims, re-sent DELETEs and
    /// re-patched gone PVs for one PV in two).
    finished: bool,
    /// A wait for a detach was logged at info (then at debug per retry).
    detach_logged: bool,
    /// The claim was seen gone from the cache while the phase still said Bound (see
    /// [`plan::claim_lookup`]).
    absence_seen: bool,
}

/// Runs the reclaim controller until shutdown.
pub(crate) async fn run(
    ctx: Arc<Context>,
    pvs: impl Stream<Item = Arc<Lean<PersistentVolume>>> + Send + 'static,
    pvcs: impl Stream<Item = Arc<Lean<PersistentVolumeClaim>>> + Send + 'static,
    queue_metrics: QueueMetrics,
    shutdown: Shutdown,
) {
    let segments = ctx
        .config
        .node_deployment
        .as_ref()
        .map(|_| ctx.driver.node_segments().into_iter().collect());
    let state = Arc::new(Reclaimer {
        segments,
        memory: Mutex::new(HashMap::new()),
        ctx: ctx.clone(),
    });
    let mut triggers = vec![
        queue::keys_of(pvs).boxed(),
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
    queue::drive(
        &ctx,
        span,
        "PV",
        queue_metrics,
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
    let p = &state.ctx.config.provisioning;
    let failures = state.remember(pv.uid(), |m| {
        m.failures = m.failures.saturating_add(1);
        m.failures
    });
    let mut delay = delay_after(p.retry_interval_start, p.retry_interval_max, failures - 1);
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

/// Whether the PV's claim exists, learned as [`plan::claim_lookup`] says: from the cache, by
/// waiting once for the PV controller's `Released`, or by a live GET that confirms an absence (a
/// lagging cache must never get a volume in use deleted).
async fn claim_state(
    state: &Reclaimer,
    pv: &PersistentVolume,
) -> Result<ClaimState, ReclaimFailure> {
    let uid = pv.metadata.uid.as_deref().unwrap_or_default();
    let Some((namespace, name, _uid)) = plan::claim_to_check(pv) else {
        // Released (or never bound): the wait for `Released` is over, nothing to remember.
        state.remember(uid, |m| m.absence_seen = false);
        return Ok(ClaimState::Unknown);
    };
    let cached = state
        .ctx
        .stores
        .pvcs
        .get(&crate::k8s::cache::key(Some(namespace), name))
        .map(|c| c.full());
    let seen = state.recall(uid).absence_seen;
    match plan::claim_lookup(pv, cached.as_ref(), seen) {
        ClaimLookup::Known(known) => return Ok(known),
        ClaimLookup::WaitForRelease => {
            state.remember(uid, |m| m.absence_seen = true);
            return Ok(ClaimState::Unknown);
        }
        ClaimLookup::ReadLive => {}
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
    if !pv.uid().is_empty() && state.recall(pv.uid()).finished {
        return Ok(Action::await_change());
    }
    let mut current = pv.full();
    for _ in 0..MAX_STEPS {
        match step(&state, &current).await? {
            Next::Done(action) => {
                state.remember(pv.uid(), |m| m.failures = 0);
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

/// The facts of one step on `pv`, gathered once: the claim as [`claim_state`] learns it, the
/// attachment index, the class, node locality, the PV as CSI, and what this process remembers.
async fn gather<'a>(
    state: &'a Reclaimer,
    pv: &PersistentVolume,
) -> Result<ReclaimContext<'a>, ReclaimFailure> {
    let ctx = &state.ctx;
    let name = pv.name_any();
    let claim = claim_state(state, pv).await?;
    let attachment = match &ctx.stores.attachments {
        None => AttachmentState::Detached,
        Some(index) if !index.is_ready() => AttachmentState::Unknown,
        Some(index) => index
            .attached_node(&name)
            .map_or(AttachmentState::Detached, AttachmentState::AttachedTo),
    };
    let class = super::plan::storage_class_name(pv)
        .and_then(|c| ctx.stores.classes.get(&ObjectRef::new(c)));
    // CSI migration: an in-tree PV (and its in-tree class) of the plugin our driver took over
    // is decided on as the CSI PV it translates to; a translation error is the failure.
    let translated = crate::migration::as_csi(&ctx.driver.name, pv);
    let view = match &translated {
        Some(Ok(csi)) => csi,
        Some(Err(_)) | None => pv,
    };
    let translated_class = class
        .as_ref()
        .and_then(|c| crate::migration::class_as_csi(&ctx.driver.name, c));
    let storage_class = match (class, translated_class) {
        (_, Some(Ok(c))) => StorageClassLookup::Found(Arc::new(c)),
        (_, Some(Err(e))) => StorageClassLookup::Untranslatable(e),
        (Some(c), None) => StorageClassLookup::Found(c),
        (None, None) => StorageClassLookup::Missing,
    };
    let locality = match &state.segments {
        None => Locality::Central,
        Some(segments) => {
            match may_delete_here(view, segments, matches!(translated, Some(Ok(_)))) {
                Ok(accessible) => Locality::Node { accessible },
                Err(error) => Locality::InvalidNodeAffinity(error),
            }
        }
    };
    let uid = pv.metadata.uid.as_deref().unwrap_or_default();
    Ok(ReclaimContext {
        driver_name: &ctx.driver.name,
        claim,
        publish_unpublish: ctx.driver.controller.publish_unpublish_volume,
        attachment,
        locality,
        storage_class,
        volume_deleted: state.recall(uid).volume_deleted,
        translated,
    })
}

async fn step(state: &Reclaimer, pv: &PersistentVolume) -> Result<Next, ReclaimFailure> {
    let ctx = &state.ctx;
    let name = pv.name_any();
    let uid = pv.metadata.uid.clone().unwrap_or_default();
    let facts = gather(state, pv).await?;
    let decision = plan::decide(pv, &facts);
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
            let result = ctx
                .csi
                .delete_volume(
                    v1::DeleteVolumeRequest {
                        volume_id: volume_id.clone(),
                        secrets: secret_data,
                    },
                    facts.translated.is_some(),
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
            state.remember(&uid, |m| m.volume_deleted = true);
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
        SkipReason::ClaimUnknown | SkipReason::AttachmentsUnknown => Action::requeue(UNKNOWN_RETRY),
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
        state.remember(&uid, |m| m.finished = true);
        return Ok(Next::Done(Action::await_change()));
    }
    patch::remove_finalizer_by_value(api, pv, names::FINALIZER_PV_DELETION_PROTECTION).await?;
    state.remember(&uid, |m| m.finished = true);
    debug!(pv = %name, "PV deleted and deletion-protection finalizer removed");
    // The memory stays on purpose: a reconcile started from a cache that has not seen the
    // finalizer removal yet must not send DeleteVolume again. Memories of PVs that are gone are
    // pruned once they grow.
    if crate::sync::lock(&state.memory).len() >= PRUNE_AT {
        state.forget_vanished_pvs();
    }
    Ok(Next::Done(Action::await_change()))
}

impl Reclaimer {
    /// What this process remembers of PV `uid`.
    fn recall(&self, uid: &str) -> PvMemory {
        crate::sync::lock(&self.memory)
            .get(uid)
            .copied()
            .unwrap_or_default()
    }

    /// Changes what this process remembers of PV `uid`; a PV with nothing to remember takes no
    /// room (a Bound or Released PV at rest keeps none).
    fn remember<T>(&self, uid: &str, change: impl FnOnce(&mut PvMemory) -> T) -> T {
        let mut memory = crate::sync::lock(&self.memory);
        let mut one = memory.get(uid).copied().unwrap_or_default();
        let answer = change(&mut one);
        if one == PvMemory::default() {
            memory.remove(uid);
        } else {
            memory.insert(uid.to_owned(), one);
        }
        answer
    }

    /// Marks PV `uid` as waiting for a detach (or not); true when that starts a new wait.
    fn wait_for_detach(&self, uid: &str, waiting: bool) -> bool {
        self.remember(uid, |m| {
            !std::mem::replace(&mut m.detach_logged, waiting) && waiting
        })
    }

    /// Drops the memory of PVs no longer in the cache: a PV removed by someone else (or
    /// force-deleted) while it failed is never reconciled again.
    fn forget_vanished_pvs(&self) {
        let live: HashSet<String> = self
            .ctx
            .stores
            .pvs
            .state()
            .iter()
            .map(|pv| pv.uid().to_owned())
            .collect();
        crate::sync::lock(&self.memory).retain(|uid, _| live.contains(uid));
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
    let DeletionSecrets::Fetch(secret) = secrets else {
        return HashMap::new();
    };
    match crate::model::secrets::credentials(&state.ctx.client, &secret.name, &secret.namespace)
        .await
    {
        Ok(data) => data,
        Err(e) => {
            warn!(pv = %pv_name, "{e}; deleting without secrets");
            HashMap::new()
        }
    }
}

#[cfg(test)]
#[path = "controller_tests.rs"]
mod tests;
