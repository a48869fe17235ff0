//! The provisioning controller shell: reads a claim's context from the caches, asks
//! [`plan::decide_claim`] what to do and executes it (intent finalizer, secrets, CreateVolume, PV,
//! events, metrics, per-claim backoff). Every decision lives in the pure modules next to this one.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::{CSINode, StorageClass, VolumeAttributesClass};
use kube::api::PostParams;
use kube::runtime::controller::{Action, Config as ControllerConfig, Controller};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, ResourceExt};
use tracing::{Instrument, debug, info, info_span, warn};

use super::classify::{
    ProvisioningState, ReplayVerdict, infeasible_event_message, is_infeasible, provisioning_state,
    replay_needs_admin_message, replay_verdict,
};
use super::intent::{intent_removal_step, intent_write_step};
use super::plan::{
    self, ClaimContext, ClaimDecision, IgnoreReason, IntentCleanup, Lookup, NodeMode,
    ProvisionPlan, ProvisionSettings, SourceLookup,
};
use super::pv::{accept_answer, build_pv};
use super::secrets::SecretRef;
use super::topology::{RequirementCache, StaticTopology, TopologyView};
use crate::app::{Context, Shutdown};
use crate::csi::v1;
use crate::k8s::errors::{ApiErrorClass, classify, describe};
use crate::k8s::events::{EventSpec, reference_to};
use crate::k8s::patch::{self, PatchOutcome, Step};
use crate::names;
use crate::node::ownership::{
    self, Competition, CsiNodeLookup, NodeIdentity, Recheck, recheck_before_claiming,
};
use crate::retry::{Backoff, InfeasibleHold};

mod cleanup;
mod compete;
mod gone_node;

use cleanup::cleanup_intent;
use compete::compete;
use gone_node::intent_on_gone_node;

/// Upstream keeps a claim that failed with InvalidArgument out of the queue for 5 minutes.
const INFEASIBLE_RETENTION: Duration = Duration::from_secs(5 * 60);
/// Re-check every claim this often even without changes (upstream's resync is 15 minutes).
const RESYNC: Duration = Duration::from_secs(10 * 60);
/// How often the set of nodes running our driver is compared with the last one, to look at the
/// pending claims selected to a node that left it.
const NODE_DEPARTURE_POLL: Duration = Duration::from_secs(2);
/// Retry delay when the volume name is busy with a delete in this process.
const LOCK_RETRY: Duration = Duration::from_millis(500);
/// Attempts to create the PV object before the claim is requeued (and CreateVolume replayed).
const PV_CREATE_ATTEMPTS: u32 = 5;

/// Why a reconcile failed; the claim is retried with its backoff.
#[derive(Debug, thiserror::Error)]
pub enum ProvisionError {
    /// Reported to the user in a `ProvisioningFailed` event already.
    #[error("{0}")]
    Reported(String),
    /// A Kubernetes write failed.
    #[error(transparent)]
    Patch(#[from] patch::PatchError),
    /// A Kubernetes call failed.
    #[error("{what}: {source}")]
    Kube {
        /// What was attempted.
        what: String,
        /// The error.
        #[source]
        source: kube::Error,
    },
}

/// State shared by every reconcile of this controller.
struct Provisioner {
    ctx: Arc<Context>,
    settings: ProvisionSettings,
    backoff: Mutex<Backoff<String>>,
    infeasible: Mutex<InfeasibleHold<String>>,
    /// Node mode: the competition for unselected Immediate-binding claims.
    competition: Mutex<Competition>,
    /// Node mode: when each competing claim may be claimed (UID -> instant).
    compete_at: Mutex<HashMap<String, Instant>>,
    /// Node mode: since when each deleted claim's intent has been waiting for a missing node.
    node_gone_since: Mutex<HashMap<String, Instant>>,
    /// Node mode: the fixed topology view built from NodeGetInfo (as upstream).
    node_topology: Option<StaticTopology>,
    /// Accessibility requirements of claims whose CreateVolume may still be in progress, so a retry
    /// sends the identical request even if nodes changed meanwhile (upstream's per-PVC cache).
    pinned: Mutex<RequirementCache>,
}

impl Provisioner {
    fn pins(&self) -> std::sync::MutexGuard<'_, RequirementCache> {
        self.pinned.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Drops the per-claim state (backoff, hold-back, pins, competition) of claims that are no
    /// longer in the cache. A claim deleted while it failed is never reconciled again (the
    /// controller finds nothing in its store), so without this a long-running sidecar would keep
    /// an entry for every claim that ever failed.
    fn forget_vanished_claims(&self) {
        let live: HashSet<String> = self
            .ctx
            .stores
            .pvcs
            .state()
            .iter()
            .map(|c| claim_key(c))
            .collect();
        let keep = |key: &str| live.contains(key);
        lock(&self.backoff).retain(|k| keep(k));
        lock(&self.infeasible).retain(|k| keep(k));
        lock(&self.competition).retain(keep);
        lock(&self.compete_at).retain(|k, _| keep(k));
        lock(&self.node_gone_since).retain(|k, _| keep(k));
        self.pins().retain(keep);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn settings_of(ctx: &Context) -> ProvisionSettings {
    let c = &ctx.config.provisioning;
    let driver = &ctx.driver;
    ProvisionSettings {
        driver: driver.name.clone(),
        provisioner_identity: ctx.identity.clone(),
        volume_name_prefix: c.volume_name_prefix.clone(),
        volume_name_uuid_length: c.volume_name_uuid_length,
        default_fs_type: c.default_fstype.clone().unwrap_or_default(),
        extra_create_metadata: c.extra_create_metadata,
        strict_topology: c.strict_topology,
        immediate_topology: c.immediate_topology,
        controller_publish_read_only: c.controller_publish_readonly,
        topology: ctx.config.feature_gates.topology && driver.supports_topology(),
        volume_attributes_class: ctx.volume_attributes_class,
        cross_namespace_data_source: ctx.config.feature_gates.cross_namespace_volume_data_source,
        plugin: driver.plugin,
        controller: driver.controller,
        node: ctx.config.node_deployment.as_ref().map(|n| NodeMode {
            me: NodeIdentity {
                name: n.node_name.clone(),
                segments: driver
                    .node
                    .as_ref()
                    .map(|i| i.accessible_topology.clone().into_iter().collect())
                    .unwrap_or_default(),
            },
            immediate_binding: n.immediate_binding,
        }),
    }
}

/// Runs the provisioning controller until shutdown.
pub async fn run(
    ctx: Arc<Context>,
    pvcs: impl Stream<Item = Arc<PersistentVolumeClaim>> + Send + 'static,
    pvs: impl Stream<Item = Arc<PersistentVolume>> + Send + 'static,
    classes: impl Stream<Item = Arc<StorageClass>> + Send + 'static,
    shutdown: Shutdown,
) {
    let settings = settings_of(&ctx);
    let node_topology = settings.node.as_ref().map(|mode| {
        let node_id = ctx
            .driver
            .node
            .as_ref()
            .map(|n| n.node_id.clone())
            .unwrap_or_default();
        StaticTopology::single_node(&mode.me.name, &settings.driver, &node_id, &mode.me.segments)
    });
    let competition = ctx.config.node_deployment.as_ref().map_or_else(
        || Competition::new(Duration::from_secs(20), Duration::from_secs(60)),
        |n| Competition::new(n.base_delay, n.max_delay),
    );
    let p = &ctx.config.provisioning;
    let state = Arc::new(Provisioner {
        backoff: Mutex::new(Backoff::new(p.retry_interval_start, p.retry_interval_max)),
        infeasible: Mutex::new(InfeasibleHold::new(INFEASIBLE_RETENTION)),
        competition: Mutex::new(competition),
        compete_at: Mutex::new(HashMap::new()),
        node_gone_since: Mutex::new(HashMap::new()),
        node_topology,
        pinned: Mutex::new(RequirementCache::default()),
        settings,
        ctx: ctx.clone(),
    });

    // Per-claim state of vanished claims goes at each resync (cheap: one pass over the cache).
    let pruner = {
        let state = state.clone();
        crate::k8s::watch::spawn_every(RESYNC, move || state.forget_vanished_claims())
    };

    let claims = ctx.stores.pvcs.clone();
    let class_index = claims.clone();
    let workers = u16::try_from(p.worker_threads.max(1)).unwrap_or(u16::MAX);
    let mut controller = Controller::for_shared_stream(pvcs, claims.clone())
        // A PV created, bound or deleted changes what its claim needs (finish or clean up the intent).
        .watches_shared_stream(pvs, |pv| {
            pv.spec
                .as_ref()
                .and_then(|s| s.claim_ref.as_ref())
                .and_then(|r| {
                    Some(ObjectRef::new(r.name.as_deref()?).within(r.namespace.as_deref()?))
                })
        })
        // A class created or changed can unblock every pending claim of that class.
        .watches_shared_stream(classes, move |class| {
            let name = class.name_any();
            class_index
                .state()
                .into_iter()
                .filter(|c| {
                    plan::claim_class_name(c) == Some(name.as_str())
                        && c.spec
                            .as_ref()
                            .and_then(|s| s.volume_name.as_ref())
                            .is_none()
                })
                .map(|c| ObjectRef::from_obj(c.as_ref()))
                .collect::<Vec<_>>()
        });
    if let Some(csinodes) = ctx.stores.csinodes.clone() {
        // A node that stops running our driver (its driver unregistered), and later a node whose
        // CSINode goes (deleted), matter to the pending claims selected to it: clear the
        // selection, or wait for the node to come back when a volume may exist there; the second
        // departure starts the wait for a node gone for good. Watches do not announce deletions,
        // so poll.
        let driver = ctx.driver.name.clone();
        let all = csinodes.clone();
        let live = move || {
            crate::node::scope::live_instances(csinodes.state().iter().map(AsRef::as_ref), &driver)
                .into_iter()
                .collect()
        };
        let present = move || all.state().iter().map(|c| c.name_any()).collect();
        let departures = futures::stream::select(
            crate::k8s::watch::departures(NODE_DEPARTURE_POLL, live),
            crate::k8s::watch::departures(NODE_DEPARTURE_POLL, present),
        );
        let departed = departures.flat_map(move |nodes| {
            futures::stream::iter(pending_claims_selected_to(&claims, &nodes))
        });
        controller = controller.reconcile_on(departed);
    }
    controller
        .reconcile_all_on(crate::k8s::watch::resync_every(RESYNC))
        .with_config(ControllerConfig::default().concurrency(workers))
        .graceful_shutdown_on(shutdown.requested())
        .run(reconcile, error_policy, state)
        .for_each(|result| async move {
            if let Err(e) = result {
                debug!(error = %e, "claim reconcile ended with an error");
            }
        })
        .instrument(info_span!("provisioning"))
        .await;
    pruner.abort();
}

/// Unbound claims in `claims` whose selected node is one of `nodes`.
fn pending_claims_selected_to(
    claims: &Store<PersistentVolumeClaim>,
    nodes: &[String],
) -> Vec<ObjectRef<PersistentVolumeClaim>> {
    claims
        .state()
        .iter()
        .filter(|c| {
            c.spec
                .as_ref()
                .and_then(|s| s.volume_name.as_ref())
                .is_none()
        })
        .filter(|c| ownership::selected_node(c).is_some_and(|n| nodes.iter().any(|x| x == n)))
        .map(|c| ObjectRef::from_obj(c.as_ref()))
        .collect()
}

fn claim_key(pvc: &PersistentVolumeClaim) -> String {
    pvc.metadata
        .uid
        .clone()
        .unwrap_or_else(|| format!("{}/{}", pvc.namespace().unwrap_or_default(), pvc.name_any()))
}

fn error_policy(
    pvc: Arc<PersistentVolumeClaim>,
    error: &ProvisionError,
    state: Arc<Provisioner>,
) -> Action {
    let delay = state
        .backoff
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .failed(&claim_key(&pvc));
    debug!(claim = %claim_name(&pvc), error = %error, ?delay, "will retry");
    Action::requeue(delay)
}

fn claim_name(pvc: &PersistentVolumeClaim) -> String {
    format!("{}/{}", pvc.namespace().unwrap_or_default(), pvc.name_any())
}

/// Reads `Store` state as a topology view.
struct StoreTopology<'a> {
    nodes: Option<&'a Store<Node>>,
    csinodes: Option<&'a Store<CSINode>>,
}

impl TopologyView for StoreTopology<'_> {
    fn csinode(&self, name: &str) -> Option<Arc<CSINode>> {
        self.csinodes?.get(&ObjectRef::new(name))
    }
    fn node(&self, name: &str) -> Option<Arc<Node>> {
        self.nodes?.get(&ObjectRef::new(name))
    }
    fn csinodes(&self) -> Vec<Arc<CSINode>> {
        self.csinodes.map(Store::state).unwrap_or_default()
    }
    fn nodes(&self) -> Vec<Arc<Node>> {
        self.nodes.map(Store::state).unwrap_or_default()
    }
}

async fn reconcile(
    pvc: Arc<PersistentVolumeClaim>,
    state: Arc<Provisioner>,
) -> Result<Action, ProvisionError> {
    let ctx = &state.ctx;
    let stores = &ctx.stores;
    let settings = &state.settings;
    // Only a claim still to be provisioned (or cleaned up) needs the class's parameters.
    let unbound = pvc
        .spec
        .as_ref()
        .and_then(|s| s.volume_name.as_ref())
        .is_none()
        || plan::has_intent(&pvc);
    let vac_name = pvc
        .spec
        .as_ref()
        .and_then(|s| s.volume_attributes_class_name.clone())
        .filter(|n| unbound && settings.volume_attributes_class && !n.is_empty());
    let vac_result = match &vac_name {
        Some(name) => Some(
            Api::<VolumeAttributesClass>::all(ctx.client.clone())
                .get_opt(name)
                .await
                .map_err(|e| e.to_string()),
        ),
        None => None,
    };
    let class =
        plan::claim_class_name(&pvc).and_then(|name| stores.classes.get(&ObjectRef::new(name)));
    let pinned = state.pins().get(&claim_key(&pvc)).cloned();
    // The topology view is not Sync: decide in a block that ends before the next await.
    let decision = {
        let pv_exists = plan::claim_volume_name(&pvc, settings)
            .is_ok_and(|name| stores.pvs.get(&ObjectRef::new(&name)).is_some());
        let store_topology = StoreTopology {
            nodes: stores.nodes.as_ref(),
            csinodes: stores.csinodes.as_ref(),
        };
        let topology: &dyn TopologyView = match &state.node_topology {
            Some(fixed) => fixed,
            None => &store_topology,
        };
        let selected = ownership::selected_node(&pvc).map(str::to_owned);
        let selected_node_driver = match (&selected, &stores.csinodes) {
            // While a requirement is pinned the node is settled until the attempt ends.
            _ if pinned.is_some() => CsiNodeLookup::Unknown,
            // Node mode: one instance per claim checks, so the claim gets one event, not one per node.
            (Some(node), Some(csinodes))
                if ownership::checks_selected_node(
                    settings.node.as_ref().map(|n| n.me.name.as_str()),
                    &claim_key(&pvc),
                    &csinodes.state(),
                    &settings.driver,
                ) =>
            {
                CsiNodeLookup::of(
                    csinodes.get(&ObjectRef::new(node)).as_deref(),
                    &settings.driver,
                )
            }
            _ => CsiNodeLookup::Unknown,
        };
        let selected_node_uid = match (&selected, &stores.nodes) {
            (Some(node), Some(nodes)) => nodes
                .get(&ObjectRef::new(node))
                .and_then(|n| n.metadata.uid.clone()),
            _ => None,
        };
        let vac = match &vac_result {
            None => Lookup::NotLookedUp,
            Some(Ok(Some(v))) => Lookup::Found(v),
            Some(Ok(None)) => Lookup::Missing,
            Some(Err(e)) => Lookup::Failed(e.as_str()),
        };
        let source = SourceLookup::NotResolved;
        let claim_ctx = ClaimContext {
            settings,
            class: class.as_deref(),
            pv_exists,
            topology,
            selected_node_driver,
            selected_node_uid: selected_node_uid.as_deref(),
            pinned_topology: pinned.as_ref(),
            vac,
            source: &source,
        };
        plan::decide_claim(&pvc, &claim_ctx)
    };
    let key = claim_key(&pvc);
    if !matches!(decision, ClaimDecision::IntentOnGoneNode { .. }) {
        // The node is back (or the claim moved on): a later absence starts a new grace period.
        lock(&state.node_gone_since).remove(&key);
    }
    let result = match decision {
        ClaimDecision::Ignore(reason) => {
            if matches!(
                reason,
                IgnoreReason::ClaimDeleting
                    | IgnoreReason::AlreadyBound(_)
                    | IgnoreReason::PvExists(_)
            ) {
                state.pins().forget(&key);
            }
            ignore(&state, &pvc, &reason);
            Ok(Action::await_change())
        }
        ClaimDecision::Fail(err) => {
            if err.follows_provisioning_event() {
                provisioning_event(&state, &pvc);
            }
            Err(fail(&state, &pvc, err.to_string()))
        }
        ClaimDecision::Provision(plan) => provision(&state, &pvc, *plan).await,
        ClaimDecision::ClearSelectedNode(reason) => {
            let object = reference_to(pvc.as_ref());
            ctx.events.emit(
                object,
                EventSpec::warning(reason.event_reason(), reason.message()),
            );
            state.pins().forget(&key);
            clear_selected_node(&state, &pvc).await?;
            Ok(Action::await_change())
        }
        ClaimDecision::Compete => compete(&state, &pvc).await,
        ClaimDecision::CleanupIntent(cleanup) => cleanup_intent(&state, &pvc, *cleanup).await,
        ClaimDecision::FinishIntent { volume_name } => {
            state.pins().forget(&key);
            finish_intent_read_first(&state, &pvc, &volume_name).await?;
            Ok(Action::await_change())
        }
        ClaimDecision::IntentOnGoneNode { volume_name, node } => {
            intent_on_gone_node(&state, &pvc, &node, &volume_name).await
        }
    };
    if result.is_ok() {
        state
            .backoff
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .reset(&key);
    }
    result
}

fn ignore(state: &Provisioner, pvc: &PersistentVolumeClaim, reason: &IgnoreReason) {
    debug!(claim = %claim_name(pvc), ?reason, "nothing to do for claim");
    if let IgnoreReason::ExternalPopulator(_) = reason {
        state.ctx.events.emit(
            reference_to(pvc),
            EventSpec::normal(
                names::EVENT_PROVISIONING,
                "Assuming an external populator will provision the volume",
            ),
        );
    }
    // The competition is over for a claim that is bound, deleted or not ours.
    if !matches!(reason, IgnoreReason::NotThisNode(_)) {
        state
            .competition
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .forget(&claim_key(pvc));
    }
    // A claim that is going away keeps no per-claim state behind (the backoff is reset by the
    // caller on this successful reconcile).
    if matches!(
        reason,
        IgnoreReason::ClaimDeleting | IgnoreReason::AlreadyBound(_)
    ) {
        state
            .infeasible
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&claim_key(pvc));
    }
}

fn provisioning_event(state: &Provisioner, pvc: &PersistentVolumeClaim) {
    state.ctx.events.emit(
        reference_to(pvc),
        EventSpec::normal(
            names::EVENT_PROVISIONING,
            format!(
                "External provisioner is provisioning volume for claim \"{}\"",
                claim_name(pvc)
            ),
        ),
    );
}

fn class_label(pvc: &PersistentVolumeClaim) -> String {
    pvc.spec
        .as_ref()
        .and_then(|s| s.storage_class_name.clone())
        .unwrap_or_default()
}

fn source_label(pvc: &PersistentVolumeClaim) -> String {
    pvc.spec
        .as_ref()
        .and_then(|s| s.data_source.as_ref())
        .map(|d| d.kind.clone())
        .unwrap_or_default()
}

/// Reports a failure: `ProvisioningFailed` event, failure metric; returns the error to requeue with.
fn fail(state: &Provisioner, pvc: &PersistentVolumeClaim, message: String) -> ProvisionError {
    warn!(claim = %claim_name(pvc), "provisioning failed: {message}");
    state.ctx.events.emit(
        reference_to(pvc),
        EventSpec::warning(names::EVENT_PROVISIONING_FAILED, message.clone()),
    );
    state
        .ctx
        .metrics
        .provision
        .failed(&class_label(pvc), &source_label(pvc));
    ProvisionError::Reported(message)
}

fn kube_err(what: impl Into<String>) -> impl FnOnce(kube::Error) -> ProvisionError {
    let what = what.into();
    move |source| ProvisionError::Kube { what, source }
}

/// Reads the provisioner secret's data for the request.
async fn secret_data(
    state: &Provisioner,
    secret: &SecretRef,
) -> Result<HashMap<String, String>, String> {
    crate::k8s::secrets::credentials(&state.ctx.client, &secret.name, &secret.namespace)
        .await
        .map_err(|e| e.to_string())
}

async fn provision(
    state: &Provisioner,
    pvc: &Arc<PersistentVolumeClaim>,
    plan: ProvisionPlan,
) -> Result<Action, ProvisionError> {
    let ctx = &state.ctx;
    let key = claim_key(pvc);
    if let Err(held) = state
        .infeasible
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .check(&key, &plan.class_uid, Instant::now())
    {
        debug!(claim = %claim_name(pvc), "skipping volume provisioning for pvc {key}, because provisioning previously failed with infeasible error");
        return Ok(Action::requeue(held.remaining));
    }
    for warning in &plan.warnings {
        debug!("{warning}");
    }
    let Some(_lock) = ctx.volume_locks.try_lock(&plan.volume_name) else {
        debug!(volume = %plan.volume_name, "volume busy with another operation; retrying shortly");
        return Ok(Action::requeue(LOCK_RETRY));
    };
    // The cache may lag behind a PV created moments ago (or by an earlier run): never call
    // CreateVolume again for a volume whose PV exists.
    let pvs: Api<PersistentVolume> = Api::all(ctx.client.clone());
    if pvs
        .get_opt(&plan.volume_name)
        .await
        .map_err(kube_err(format!("reading PV {}", plan.volume_name)))?
        .is_some()
    {
        return Ok(Action::await_change());
    }
    provisioning_event(state, pvc);

    // The secret first: a claim whose secret is missing must not get an intent (and so a finalizer
    // that would need the secret to be removed) when nothing was sent to the driver.
    let mut request = plan.request.clone();
    if let Some(secret) = &plan.provisioner_secret {
        match secret_data(state, secret).await {
            Ok(data) => request.secrets = data,
            Err(message) => return Err(fail(state, pvc, message)),
        }
    }

    // The freshest copy of the claim, to seed the intent removal with.
    let mut claim = pvc.as_ref().clone();
    if plan.needs_intent_write {
        match write_intent(state, pvc, &plan).await {
            Ok(PatchOutcome::Patched(fresh) | PatchOutcome::Unchanged(fresh)) => claim = fresh,
            // Deleted meanwhile: nothing was started, so nothing can leak.
            Ok(PatchOutcome::Deleting(_) | PatchOutcome::Gone) => {
                return Ok(Action::await_change());
            }
            // Without the record a claim deleted during CreateVolume could leak its volume: the
            // user is told why nothing happens, and the claim is retried with its backoff.
            Err(e) => return Err(fail(state, pvc, intent_failure(&e))),
        }
    }

    let started = Instant::now();
    let answer = ctx.csi.create_volume(request).await;
    // From now on retries must send this requirement, whatever happens to the nodes meanwhile.
    state
        .pins()
        .pin(&key, plan.request.accessibility_requirements.as_ref());
    let response = match answer {
        Ok(response) => response,
        Err(status) => return create_failed(state, pvc, &plan, status).await,
    };
    let created = match accept_answer(&plan.pv, &response) {
        Ok(created) => created,
        // The pin stays: the volume may exist, so a retry must be the identical request.
        Err(bad) => {
            let mut message = bad.to_string();
            if let Some(volume_id) = bad.volume_to_delete()
                && let Err(e) =
                    delete_volume(state, volume_id, plan.provisioner_secret.as_ref()).await
            {
                message = bad.with_failed_cleanup(&plan.volume_name, &e);
            }
            return Err(fail(state, pvc, message));
        }
    };
    info!(claim = %claim_name(pvc), volume = %plan.volume_name, volume_id = %created.volume_id, "volume created");

    let mut pv = build_pv(&plan.pv, &created);
    if let Some(mode) = &state.settings.node {
        // Node mode: each instance watches only PVs labelled with its node (node::scope).
        crate::node::scope::label_new_pv(
            &mut pv,
            &state.settings.driver,
            &mode.me.name,
            &mode.me.segments,
        );
    }
    if let Err(message) = create_pv(state, &pv, plan.provisioner_secret.as_ref()).await {
        // The volume exists and the pin stays: the retry replays the identical CreateVolume.
        return Err(fail(state, pvc, message));
    }
    state
        .infeasible
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .remove(&key);
    state.pins().settle(&key, None);
    finish_intent(state, &claim, &plan.volume_name).await?;
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

/// CreateVolume failed: classify as upstream does and act on the state.
async fn create_failed(
    state: &Provisioner,
    pvc: &Arc<PersistentVolumeClaim>,
    plan: &ProvisionPlan,
    status: tonic::Status,
) -> Result<Action, ProvisionError> {
    let outcome = provisioning_state(status.code(), plan.may_reschedule);
    state.pins().settle(&claim_key(pvc), Some(outcome));
    let message = format!(
        "rpc error: code = {:?} desc = {}",
        status.code(),
        status.message()
    );
    if is_infeasible(status.code()) {
        state
            .infeasible
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .record(claim_key(pvc), &plan.class_uid, Instant::now());
        return Err(fail(state, pvc, infeasible_event_message(&message)));
    }
    match outcome {
        ProvisioningState::Reschedule => {
            let error = fail(state, pvc, message);
            clear_selected_node(state, pvc).await?;
            debug!(claim = %claim_name(pvc), "selected node cleared for rescheduling: {error}");
            Ok(Action::await_change())
        }
        // InBackground keeps the intent (the volume may still appear); Finished and NoChange are
        // retried with backoff too, as upstream does.
        ProvisioningState::InBackground
        | ProvisioningState::Finished
        | ProvisioningState::NoChange => Err(fail(state, pvc, message)),
    }
}

/// Creates the PV, retrying transient API errors. `AlreadyExists` for the same volume is success.
/// `secret`: the provisioner secret, for deleting the volume again if the PV can never be saved.
async fn create_pv(
    state: &Provisioner,
    pv: &PersistentVolume,
    secret: Option<&SecretRef>,
) -> Result<(), String> {
    let api: Api<PersistentVolume> = Api::all(state.ctx.client.clone());
    let name = pv.name_any();
    let handle = pv
        .spec
        .as_ref()
        .and_then(|s| s.csi.as_ref())
        .map(|c| c.volume_handle.clone());
    let mut delay = Duration::from_millis(100);
    let mut last = String::new();
    for attempt in 1..=PV_CREATE_ATTEMPTS {
        // Leader election: a replica whose lease may have passed to another must not write.
        state.ctx.leadership.acting().await;
        match api.create(&PostParams::default(), pv).await {
            Ok(_) => {
                info!(pv = %name, "PV created");
                return Ok(());
            }
            Err(e) => match classify(&e) {
                ApiErrorClass::AlreadyExists => {
                    let existing = api.get_opt(&name).await.ok().flatten();
                    let same = existing
                        .as_ref()
                        .and_then(|p| p.spec.as_ref()?.csi.as_ref())
                        .map(|c| c.volume_handle.clone());
                    if same.is_some() && same == handle {
                        return Ok(());
                    }
                    return Err(format!(
                        "PV {name} already exists for another volume; the created volume was kept for the next attempt"
                    ));
                }
                ApiErrorClass::Invalid => {
                    // The API server will never accept this PV: delete the volume rather than leak it.
                    let message = format!("error creating PV {name}: {}", describe(&e));
                    let cleanup = match &handle {
                        Some(id) => delete_volume(state, id, secret).await.err(),
                        None => None,
                    };
                    return Err(match cleanup {
                        None => format!("{message}; the volume was deleted again"),
                        Some(c) => format!(
                            "{message}. Cleanup of volume {name} failed, volume is orphaned: {c}"
                        ),
                    });
                }
                class => {
                    last = format!("error creating PV {name} ({class}): {}", describe(&e));
                    debug!(attempt, "{last}");
                    if let Some(after) = class.retry_after() {
                        delay = delay.max(after);
                    }
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(5));
                }
            },
        }
    }
    Err(format!(
        "{last}; will retry (the volume is kept and reused)"
    ))
}

/// DeleteVolume for clean-up, with the provisioner secret when one was used.
async fn delete_volume(
    state: &Provisioner,
    volume_id: &str,
    secret: Option<&SecretRef>,
) -> Result<(), String> {
    let secrets = match secret {
        Some(s) => secret_data(state, s).await?,
        None => HashMap::new(),
    };
    state
        .ctx
        .csi
        .delete_volume(v1::DeleteVolumeRequest {
            volume_id: volume_id.to_owned(),
            secrets,
        })
        .await
        .map(|_| ())
        .map_err(|s| format!("rpc error: code = {:?} desc = {}", s.code(), s.message()))
}

/// The ProvisioningFailed message for an intent that could not be written.
fn intent_failure(error: &patch::PatchError) -> String {
    let hint = match error.class {
        ApiErrorClass::Forbidden => {
            "; grant the sidecar's ServiceAccount update (or patch) on persistentvolumeclaims"
        }
        _ => "; retrying",
    };
    format!(
        "no volume is created until the provisioning intent is recorded on the claim, and that failed: {error}{hint}"
    )
}

/// Adds the intent finalizer and annotations in one write ([`intent_write_step`]).
async fn write_intent(
    state: &Provisioner,
    pvc: &PersistentVolumeClaim,
    plan: &ProvisionPlan,
) -> Result<PatchOutcome<PersistentVolumeClaim>, patch::PatchError> {
    let wanted = plan.intent_annotations();
    patch::patch_fresh(
        &claims_api(state, pvc),
        pvc,
        "record provisioning intent",
        |meta| intent_write_step(meta, &wanted),
    )
    .await
}

/// Removes the intent finalizer and annotations (the PV exists, or the volume is deleted again).
/// `pvc` seeds the first attempt: pass the freshest copy at hand (e.g. the one the intent write
/// returned) to save a read.
async fn finish_intent(
    state: &Provisioner,
    pvc: &PersistentVolumeClaim,
    volume_name: &str,
) -> Result<(), ProvisionError> {
    // No shortcut on `pvc`: it may be the copy read before this reconcile wrote the intent; the
    // patch below concludes "nothing to do" only from a fresh read.
    patch::patch_fresh(
        &claims_api(state, pvc),
        pvc,
        "remove provisioning intent",
        intent_removal_step,
    )
    .await?;
    debug!(claim = %claim_name(pvc), volume = %volume_name, "provisioning intent removed");
    Ok(())
}

/// [`finish_intent`] for a decision taken on the cached claim, which usually predates this
/// controller's own removal of the intent (the reconcile its own intent write queued): one read
/// settles that, where a write based on the cached copy would be refused and then read anyway.
async fn finish_intent_read_first(
    state: &Provisioner,
    pvc: &PersistentVolumeClaim,
    volume_name: &str,
) -> Result<(), ProvisionError> {
    match live_claim(state, pvc).await? {
        Some(fresh) if intent_removal_step(&fresh.metadata) != Step::AlreadyDone => {
            finish_intent(state, &fresh, volume_name).await
        }
        _ => Ok(()),
    }
}

/// The claim as the API server has it now; `None` once it is gone (or its name is another
/// claim's).
async fn live_claim(
    state: &Provisioner,
    pvc: &PersistentVolumeClaim,
) -> Result<Option<PersistentVolumeClaim>, ProvisionError> {
    let fresh = claims_api(state, pvc)
        .get_opt(&pvc.name_any())
        .await
        .map_err(kube_err(format!("reading claim {}", claim_name(pvc))))?;
    Ok(fresh.filter(|f| f.metadata.uid == pvc.metadata.uid))
}

fn claims_api(state: &Provisioner, pvc: &PersistentVolumeClaim) -> Api<PersistentVolumeClaim> {
    Api::namespaced(
        state.ctx.client.clone(),
        &pvc.namespace().unwrap_or_default(),
    )
}

/// Removes `volume.kubernetes.io/selected-node` so the scheduler picks again.
async fn clear_selected_node(
    state: &Provisioner,
    pvc: &PersistentVolumeClaim,
) -> Result<(), ProvisionError> {
    let Some(node) = ownership::selected_node(pvc).map(str::to_owned) else {
        return Ok(());
    };
    // Only the node the decision was about: the scheduler may have picked another meanwhile.
    patch::patch_fresh(
        &claims_api(state, pvc),
        pvc,
        "clear selected node",
        |meta| patch::remove_annotation_if_step(meta, names::ANN_SELECTED_NODE, &node),
    )
    .await?;
    Ok(())
}
