//! The provisioning controller shell, in three steps per claim: gather the facts once
//! ([`gather`]), decide ([`plan::decide_claim`], pure), execute the decision
//! ([`execute_decision`]: events, the selected node, the competition, or the provisioning run of
//! [`execute`]: intent, secret, CreateVolume, PV). Nothing is decided twice: a decision taken on a
//! cache that may lag behind (a class or CSINode it lacks) is confirmed by one live read before it
//! is acted on, and the next watch event brings the fresh claim for the next round. Clean-up after
//! claims that no longer want their volume is not here: the intent log's resolver
//! ([`intents::resolve`]) is its only path.
//! What the user and the operator see of a claim (events, logs, the metrics' labels) is reported
//! here too, before the claim memory.
//!
//! What a claim's decision needs ([`Facts`]) is gathered once per reconcile ([`gather`]): the
//! caches, plus the few live reads only some claims need (a VolumeAttributesClass, in node mode
//! what the selected node recorded for the claim), then the data source the decision asks for.
//! Node-mode ownership is computed here, once.
//!
//! # The claim memory
//!
//! What the provisioning controller remembers about each claim between reconciles, as one value
//! ([`ClaimMemory`], as the reclaim controller's `PvMemory`) with pure transitions (the shell
//! holds it behind one lock and never awaits while holding it):
//!
//! - the retry backoff of failed reconciles;
//! - the infeasible hold-back (CreateVolume answered `InvalidArgument`; [`InfeasibleHold`]);
//! - the pinned accessibility requirement while a CreateVolume may be in progress (upstream's
//!   per-PVC topology cache): retries send it again even if nodes change or vanish meanwhile;
//! - node mode: the competition for unselected claims and when each may be claimed;
//! - node mode: since when an intent has been waiting for a node that is missing;
//! - the claims whose PV this process created and that were not seen Bound yet (for the
//!   claim-to-Bound latency).
//!
//! Keys are the claims' `namespace/name`, the work queue's keys. A claim deleted and created
//! again under its name is another claim: [`ClaimMemory::observe`], at the start of each
//! reconcile, forgets what was remembered for the one before (told by its UID; kept for pending
//! claims only, so a restart over many bound claims keeps nothing per claim).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::{CSINode, StorageClass, VolumeAttributesClass};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, ResourceExt};
use tracing::{debug, info_span, warn};

use self::intents::IntentLog;
use super::classify::ProvisioningState;
use super::plan::{
    self, ClaimDecision, ClearReason, Facts, IgnoreReason, NodeFacts, NodeMode, PlanError,
    ProvisionSettings,
};
use super::source::{SourceLookup, holds_clone_protection};
use super::topology::{StaticTopology, TopologyView};
use crate::csi::v1::TopologyRequirement;
use crate::k8s::cache::{self, Cache, Lean};
use crate::k8s::events::{EventSource, EventSpec, reference_to};
use crate::k8s::patch;
use crate::model::topology::CsiNodeLookup;
use crate::names;
use crate::node_mode::ownership::{
    self, ClaimOwnership, Competition, NodeIdentity, OwnershipInputs,
};
use crate::retry::{Backoff, InfeasibleHold, describe};
use crate::runtime::queue::{self, Action, Key, QueueMetrics};
use crate::runtime::{Context, Shutdown};
use crate::sync::lock;

mod claim_writes;
mod compete;
mod data_source;
mod execute;
pub(crate) mod intents;
mod node_gone;

use claim_writes::clear_selected_node;
use compete::compete;
use execute::provision;

/// How often the set of nodes running our driver is compared with the last one, to look at the
/// pending claims selected to a node that left it.
const NODE_DEPARTURE_POLL: Duration = Duration::from_secs(2);
/// Attempts to create the PV object before the claim is requeued (and CreateVolume replayed).
const PV_CREATE_ATTEMPTS: u32 = 5;

/// Why a reconcile failed; the claim is retried with its backoff.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ProvisionError {
    /// Reported to the user in a `ProvisioningFailed` event already.
    #[error("{0}")]
    Reported(String),
    /// A Kubernetes write failed.
    #[error(transparent)]
    Patch(#[from] patch::PatchError),
    /// The intent log could not drop an entry (a claim record's write failed).
    #[error(transparent)]
    Intent(#[from] intents::IntentError),
    /// A Kubernetes call failed.
    #[error("{what}: {}", crate::retry::describe(source))]
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
    /// Per-claim memory (backoff, hold-back, pins, competition, missing-node timers).
    memory: Mutex<ClaimMemory>,
    /// Nodes and CSINodes as the decisions read them ([`topology_of`]).
    topology: Arc<dyn TopologyView + Send + Sync>,
    /// Where intents are recorded.
    intents: IntentLog,
}

impl Provisioner {
    fn memory(&self) -> std::sync::MutexGuard<'_, ClaimMemory> {
        lock(&self.memory)
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
            .map(|c| c.key().to_owned())
            .collect();
        let keep = |key: &str| live.contains(key);
        self.memory().retain(keep);
    }
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
                segments: driver.node_segments().into_iter().collect(),
            },
            immediate_binding: n.immediate_binding,
        }),
    }
}

/// Runs the provisioning controller until shutdown.
pub(crate) async fn run(
    ctx: Arc<Context>,
    pvcs: impl Stream<Item = Arc<Lean<PersistentVolumeClaim>>> + Send + 'static,
    pvs: impl Stream<Item = Arc<Lean<PersistentVolume>>> + Send + 'static,
    classes: impl Stream<Item = Arc<StorageClass>> + Send + 'static,
    queue_metrics: QueueMetrics,
    shutdown: Shutdown,
) {
    let settings = settings_of(&ctx);
    let topology = topology_of(&ctx, &settings);
    let competition =
        (ctx.config.node_deployment.as_ref()).map(|n| Competition::new(n.base_delay, n.max_delay));
    // The committer outlives the workers (one may still wait for a commit) and then flushes what
    // is pending.
    let (stopped, stop) = tokio::sync::oneshot::channel::<()>();
    let (intents, pvcs, committer) = intents::open(&ctx, pvcs, async {
        let _ = stop.await;
    })
    .await;
    let p = &ctx.config.provisioning;
    let state = Arc::new(Provisioner {
        intents,
        memory: Mutex::new(ClaimMemory::new(
            Backoff::new(p.retry_interval_start, p.retry_interval_max),
            InfeasibleHold::new(crate::retry::INFEASIBLE_HOLD_BACK),
            competition,
        )),
        topology,
        settings,
        ctx: ctx.clone(),
    });

    let claims = ctx.stores.pvcs.clone();
    let class_index = claims.clone();
    let mut triggers = vec![
        queue::keys_of(pvcs).boxed(),
        // A PV created, bound or deleted changes what its claim needs.
        pvs.filter_map(|pv| async move {
            let claim_ref = pv.full().spec?.claim_ref?;
            Some(Key::from(cache::key(
                claim_ref.namespace.as_deref(),
                claim_ref.name.as_deref()?,
            )))
        })
        .boxed(),
        // A class created or changed can unblock every pending claim of that class.
        classes
            .flat_map(move |class| {
                let name = class.name_any();
                let keys: Vec<Key> = class_index
                    .state()
                    .into_iter()
                    .filter(|c| {
                        let c = c.full();
                        crate::model::claim::claim_class_name(&c) == Some(name.as_str())
                            && c.spec
                                .as_ref()
                                .and_then(|s| s.volume_name.as_ref())
                                .is_none()
                    })
                    .map(|c| Key::from(c.key()))
                    .collect();
                futures::stream::iter(keys)
            })
            .boxed(),
    ];
    if let Some(csinodes) = ctx.stores.csinodes.clone() {
        // A node that stops running our driver (its driver unregistered), and later a node whose
        // CSINode goes (deleted), matter to the pending claims selected to it: clear the
        // selection, or wait for the node to come back when a volume may exist there; the second
        // departure starts the wait for a node gone for good. Watches do not announce deletions,
        // so poll.
        let driver = ctx.driver.name.clone();
        let all = csinodes.clone();
        let live = move || {
            crate::model::topology::live_instances(
                csinodes.state().iter().map(AsRef::as_ref),
                &driver,
            )
            .into_iter()
            .collect()
        };
        let present = move || all.state().iter().map(|c| c.name_any()).collect();
        let departures = futures::stream::select(
            crate::k8s::cache::departures(NODE_DEPARTURE_POLL, live),
            crate::k8s::cache::departures(NODE_DEPARTURE_POLL, present),
        );
        let pending = claims.clone();
        let departed = departures.flat_map(move |nodes| {
            futures::stream::iter(pending_claims_selected_to(&pending, &nodes))
        });
        triggers.push(departed.boxed());
    }
    // Per-claim state of vanished claims goes at each resync (cheap: one pass over the cache).
    let pruned = state.clone();
    let prune = move || pruned.forget_vanished_claims();
    let span = info_span!("provisioning");
    let resolver = intents::resolve::run_resolver(state.clone(), shutdown.clone());
    let workers = async {
        queue::drive(
            &ctx,
            span,
            "claim",
            queue_metrics,
            claims,
            futures::stream::select_all(triggers),
            reconcile,
            error_policy,
            state,
            prune,
            shutdown,
        )
        .await;
        let _ = stopped.send(());
    };
    tokio::join!(workers, committer, resolver);
}

/// Unbound claims in `claims` whose selected node is one of `nodes`.
fn pending_claims_selected_to(claims: &Cache<PersistentVolumeClaim>, nodes: &[String]) -> Vec<Key> {
    claims
        .state()
        .iter()
        .map(|c| (c, c.full()))
        .filter(|(_, c)| {
            c.spec
                .as_ref()
                .and_then(|s| s.volume_name.as_ref())
                .is_none()
        })
        .filter(|(_, c)| {
            crate::model::claim::selected_node(c).is_some_and(|n| nodes.iter().any(|x| x == n))
        })
        .map(|(lean, _)| Key::from(lean.key()))
        .collect()
}

/// A claim's one key: `namespace/name`, as the work queue, the cache, the memory and the logs name
/// it.
fn claim_key(pvc: &PersistentVolumeClaim) -> String {
    cache::key(pvc.metadata.namespace.as_deref(), &pvc.name_any())
}

/// Records the claim-to-Bound latency of a claim this process provisioned, once, when it is
/// first seen Bound.
fn observe_bound(state: &Provisioner, pvc: &PersistentVolumeClaim) {
    let bound = pvc.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound");
    if !bound || !state.memory().bound(&claim_key(pvc)) {
        return;
    }
    if let Some(created) = &pvc.metadata.creation_timestamp {
        let seconds = jiff::Timestamp::now()
            .duration_since(created.0)
            .as_secs_f64();
        state
            .ctx
            .metrics
            .operator
            .claim_to_bound
            .observe(seconds.max(0.0));
    }
}

fn error_policy(
    pvc: Arc<Lean<PersistentVolumeClaim>>,
    error: &ProvisionError,
    state: Arc<Provisioner>,
) -> Action {
    state.ctx.metrics.operator.retried("provisioning");
    let delay = state.memory().failed(pvc.key());
    debug!(claim = %pvc.key(), error = %error, ?delay, "will retry");
    Action::requeue(delay)
}

async fn reconcile(
    cached: Arc<Lean<PersistentVolumeClaim>>,
    state: Arc<Provisioner>,
) -> Result<Action, ProvisionError> {
    reconcile_claim(Arc::new(cached.full()), state).await
}

async fn reconcile_claim(
    pvc: Arc<PersistentVolumeClaim>,
    state: Arc<Provisioner>,
) -> Result<Action, ProvisionError> {
    let key = claim_key(&pvc);
    let bound = pvc
        .spec
        .as_ref()
        .and_then(|s| s.volume_name.as_deref())
        .is_some_and(|v| !v.is_empty());
    state
        .memory()
        .observe(&key, pvc.metadata.uid.as_deref().unwrap_or_default(), bound);
    observe_bound(&state, &pvc);
    let facts = gather(&state, &pvc).await?;
    let decision = facts.decide(&state, &pvc);
    drop(facts);
    let result = execute_decision(&state, &pvc, decision).await;
    if result.is_ok() {
        state.memory().succeeded(&key);
    }
    result
}

/// Executes one decision.
async fn execute_decision(
    state: &Provisioner,
    pvc: &Arc<PersistentVolumeClaim>,
    decision: ClaimDecision,
) -> Result<Action, ProvisionError> {
    let key = claim_key(pvc);
    if !matches!(
        decision,
        ClaimDecision::ClearSelectedNode(ClearReason::NodeGone { .. })
            | ClaimDecision::Ignore(IgnoreReason::ClaimDeleting)
            | ClaimDecision::ReleaseCloneSource { .. }
    ) {
        // The node is back (or the claim moved on): a later absence starts a new grace period.
        // A deleted claim's timer is the resolver's (a record on a gone node).
        state.memory().node_not_missing(&key);
    }
    match decision {
        ClaimDecision::Ignore(reason) => Ok(ignored(state, pvc, &key, &reason)),
        ClaimDecision::ReleaseCloneSource { clones_pending } => {
            if clones_pending {
                return Ok(Action::requeue(data_source::CLONE_WAIT));
            }
            data_source::release_clone_source(state, pvc).await?;
            Ok(ignored(state, pvc, &key, &IgnoreReason::ClaimDeleting))
        }
        ClaimDecision::Fail(err) => {
            if let PlanError::ClassNotFound(class) = &err
                && !class_confirmed_missing(state, class).await?
            {
                // The claim's watch event came before its class's (kubectl apply of one file
                // holding both): the cache is behind, nothing is wrong. Look again once it has
                // caught up.
                debug!(claim = %claim_key(pvc), %class, "StorageClass not in the cache yet but served; retrying shortly");
                return Ok(Action::requeue(CACHE_LAG_RETRY));
            }
            if err.follows_provisioning_event() {
                provisioning_event(state, pvc);
            }
            Err(fail(state, pvc, err.to_string()))
        }
        ClaimDecision::Provision(plan) => provision(state, pvc, plan).await,
        ClaimDecision::Compete(capacity) => compete(state, pvc, capacity).await,
        ClaimDecision::ClearSelectedNode(ClearReason::NodeGone { node, volume_name }) => {
            node_gone::clear_after_grace(state, pvc, &node, &volume_name).await
        }
        ClaimDecision::ClearSelectedNode(reason) => {
            if matches!(reason, ClearReason::NoDriverInstance(_))
                && !selected_node_confirmed_without_driver(state, pvc).await?
            {
                // A node that just joined: its CSINode has not reached the cache yet.
                debug!(claim = %claim_key(pvc), "the selected node's CSINode lists the driver but is not in the cache yet; retrying shortly");
                return Ok(Action::requeue(CACHE_LAG_RETRY));
            }
            selected_node_cleared(state, pvc, &reason);
            state.memory().unpin(&key);
            clear_selected_node(state, pvc).await?;
            Ok(Action::await_change())
        }
    }
}

/// A claim (its key: `key`) left alone for `reason`.
fn ignored(
    state: &Provisioner,
    pvc: &PersistentVolumeClaim,
    key: &str,
    reason: &IgnoreReason,
) -> Action {
    state.memory().ignored(key, reason);
    ignore(state, pvc, reason);
    Action::await_change()
}

/// How soon a claim is looked at again when the API server serves an object the cache lacks yet.
const CACHE_LAG_RETRY: Duration = Duration::from_millis(500);

/// Whether the claim's selected node really has no instance of the driver: a live read of its
/// CSINode before the selected node is cleared with a Warning (a node that just joined may not be
/// in the cache yet).
async fn selected_node_confirmed_without_driver(
    state: &Provisioner,
    pvc: &PersistentVolumeClaim,
) -> Result<bool, ProvisionError> {
    let Some(node) = crate::model::claim::selected_node(pvc) else {
        return Ok(true);
    };
    let csinode = Api::<CSINode>::all(state.ctx.client.clone())
        .get_opt(node)
        .await
        .map_err(kube_err(format!("reading CSINode {node}")))?;
    Ok(CsiNodeLookup::of(csinode.as_ref(), &state.settings.driver) != CsiNodeLookup::HasDriver)
}

/// Whether StorageClass `name` is really missing: a live read, so that a class the cache has not
/// seen yet is never reported as missing (a Warning must mean something is wrong). One GET, only
/// for claims whose class the cache lacks.
async fn class_confirmed_missing(state: &Provisioner, name: &str) -> Result<bool, ProvisionError> {
    Api::<StorageClass>::all(state.ctx.client.clone())
        .get_opt(name)
        .await
        .map(|class| class.is_none())
        .map_err(kube_err(format!("reading StorageClass {name}")))
}

/// Reads the facts of `pvc`: the caches and live reads every decision of its kind needs, then the
/// data source if the decision over those asks for it ([`plan::source_to_read`]).
async fn gather(state: &Provisioner, pvc: &PersistentVolumeClaim) -> Result<Facts, ProvisionError> {
    let ctx = &state.ctx;
    let stores = &ctx.stores;
    let settings = &state.settings;
    let vac = match plan::vac_to_look_up(pvc, settings) {
        Some(name) => Some(
            Api::<VolumeAttributesClass>::all(ctx.client.clone())
                .get_opt(name)
                .await
                .map_err(|e| describe(&e)),
        ),
        None => None,
    };
    let class = crate::model::claim::claim_class_name(pvc)
        .and_then(|name| stores.classes.get(&ObjectRef::new(name)));
    let pinned = state.memory().pinned(&claim_key(pvc));
    let pv_exists =
        plan::claim_volume_name(pvc, settings).is_ok_and(|name| stores.pvs.get(&name).is_some());
    let selected_node_driver = match &stores.csinodes {
        // Controller mode always checks; in node mode one instance of the live ones does.
        Some(csinodes) => plan::selected_node_to_check(pvc, pinned.is_some(), || {
            settings.node.as_ref().is_none_or(|mode| {
                ownership::checks_selected_node(
                    &mode.me.name,
                    pvc.metadata.uid.as_deref().unwrap_or_default(),
                    &csinodes.state(),
                    &settings.driver,
                )
            })
        })
        .map_or(CsiNodeLookup::Unknown, |node| {
            CsiNodeLookup::of(
                csinodes.get(&ObjectRef::new(node)).as_deref(),
                &settings.driver,
            )
        }),
        None => CsiNodeLookup::Unknown,
    };
    let selected_node_uid = match (crate::model::claim::selected_node(pvc), &stores.nodes) {
        (Some(node), Some(nodes)) => nodes
            .get(&ObjectRef::new(node))
            .and_then(|n| n.metadata.uid.clone()),
        _ => None,
    };
    let node = match &settings.node {
        Some(mode) if plan::not_to_provision(pvc, settings).is_none() => {
            let ownership = ownership::check_node(
                pvc,
                &OwnershipInputs {
                    me: &mode.me,
                    driver: &settings.driver,
                    topology_supported: settings.topology,
                    immediate_binding: mode.immediate_binding,
                    storage_class: class.as_deref(),
                    selected_node_driver,
                },
            );
            // Before a node without our driver is cleared: did it get a CreateVolume for this
            // claim? (Rare: one LIST of that node's ledger.)
            let recorded_on_selected = match &ownership {
                ClaimOwnership::ClearSelectedNode(clear) => {
                    crate::provision::controller::intents::recorded_on_node(ctx, pvc, &clear.node)
                        .await
                        .map_err(kube_err(format!(
                            "reading the intent ledger of node {}",
                            clear.node
                        )))?
                }
                _ => None,
            };
            Some(NodeFacts {
                ownership,
                recorded_on_selected,
            })
        }
        _ => None,
    };
    let mut facts = Facts {
        class,
        pv_exists,
        topology: state.topology.clone(),
        selected_node_driver,
        selected_node_uid,
        pinned_topology: pinned,
        vac,
        source: SourceLookup::NotResolved,
        node,
        // Only a claim that protects a clone source asks (the others never enter `data_source`).
        clones_pending: holds_clone_protection(pvc) && data_source::clones_pending(state, pvc),
    };
    if let Some(need) = plan::source_to_read(pvc, settings, &facts) {
        facts.source = data_source::read(state, pvc, &need).await;
    }
    Ok(facts)
}

/// The topology view the decisions read: node mode's fixed view of its own node, else the Node
/// and CSINode caches.
fn topology_of(ctx: &Context, settings: &ProvisionSettings) -> Arc<dyn TopologyView + Send + Sync> {
    match &settings.node {
        // As upstream: a CSINode and a Node built from NodeGetInfo.
        Some(mode) => {
            let node_id = ctx
                .driver
                .node
                .as_ref()
                .map(|n| n.node_id.clone())
                .unwrap_or_default();
            Arc::new(StaticTopology::single_node(
                &mode.me.name,
                &settings.driver,
                &node_id,
                &mode.me.segments,
            ))
        }
        None => Arc::new(StoreTopology {
            nodes: ctx.stores.nodes.clone(),
            csinodes: ctx.stores.csinodes.clone(),
        }),
    }
}

/// Reads `Store` state as a topology view.
struct StoreTopology {
    nodes: Option<Store<Node>>,
    csinodes: Option<Store<CSINode>>,
}

impl TopologyView for StoreTopology {
    fn csinode(&self, name: &str) -> Option<Arc<CSINode>> {
        self.csinodes.as_ref()?.get(&ObjectRef::new(name))
    }
    fn node(&self, name: &str) -> Option<Arc<Node>> {
        self.nodes.as_ref()?.get(&ObjectRef::new(name))
    }
    fn csinodes(&self) -> Vec<Arc<CSINode>> {
        self.csinodes.as_ref().map(Store::state).unwrap_or_default()
    }
    fn nodes(&self) -> Vec<Arc<Node>> {
        self.nodes.as_ref().map(Store::state).unwrap_or_default()
    }
}

// The shell's entry points to the decision over gathered facts.
impl Facts {
    /// The decision over these facts ([`plan::decide_claim`]).
    fn decide(&self, state: &Provisioner, pvc: &PersistentVolumeClaim) -> ClaimDecision {
        plan::decide_claim(pvc, &state.settings, self)
    }
}

fn ignore(state: &Provisioner, pvc: &PersistentVolumeClaim, reason: &IgnoreReason) {
    debug!(claim = %claim_key(pvc), ?reason, "nothing to do for claim");
    if let IgnoreReason::ExternalPopulator(_) = reason {
        // Upstream's library announces every attempt, then its CSI code, reporting as
        // `external-provisioner`, says the populator will do it: two events from two sources.
        provisioning_event(state, pvc);
        state
            .ctx
            .events
            .as_source(EventSource::csi_provisioner())
            .emit(
                reference_to(pvc),
                EventSpec::normal(
                    names::EVENT_PROVISIONING,
                    "Assuming an external populator will provision the volume",
                ),
            );
    }
}

fn provisioning_event(state: &Provisioner, pvc: &PersistentVolumeClaim) {
    state.ctx.events.emit(
        reference_to(pvc),
        EventSpec::normal(
            names::EVENT_PROVISIONING,
            format!(
                "External provisioner is provisioning volume for claim \"{}\"",
                claim_key(pvc)
            ),
        ),
    );
}

/// The events of a claim whose selected node is cleared: upstream's failed attempt (announced
/// by its Normal `Provisioning` first), or our `SelectedNodeCleared`.
fn selected_node_cleared(state: &Provisioner, pvc: &PersistentVolumeClaim, reason: &ClearReason) {
    if reason.is_failed_attempt() {
        provisioning_event(state, pvc);
        // Upstream's library counts such a reschedule as a failed provisioning attempt too.
        state
            .ctx
            .metrics
            .provision
            .failed(&class_label(pvc), &source_label(pvc));
    }
    state.ctx.events.emit(
        reference_to(pvc),
        EventSpec::warning(reason.event_reason(), reason.message()),
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
    warn!(claim = %claim_key(pvc), "provisioning failed: {message}");
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

/// Per-claim memory of the provisioning controller.
pub(crate) struct ClaimMemory {
    /// The UID each pending claim was last reconciled with.
    uids: HashMap<String, String>,
    backoff: Backoff<String>,
    infeasible: InfeasibleHold<String>,
    pins: HashMap<String, TopologyRequirement>,
    /// Node mode only: controller mode never competes, nor enters `node_mode`.
    competition: Option<Competition>,
    compete_at: HashMap<String, Instant>,
    /// Since when the node an intent waits for (named too: a claim created again under the same
    /// name may wait for another node) has been missing.
    node_gone_since: HashMap<String, (String, Instant)>,
    awaiting_bound: std::collections::HashSet<String>,
    /// When this process created each claim's PV: a reconcile from a cache that has not seen the
    /// PV yet must not replay CreateVolume for it.
    pv_created: HashMap<String, Instant>,
    /// CreateVolume attempts that failed for sure since the last success or stop (the class's
    /// retry policy, `provision::classify`).
    final_failures: HashMap<String, u32>,
}

/// How long after creating a PV a claim is taken as provisioned without the cache showing it:
/// far longer than a watch lags, short enough that a PV deleted at once is noticed.
pub(crate) const PV_CACHE_GRACE: Duration = Duration::from_secs(30);

impl ClaimMemory {
    /// Empty memory with these retry policies.
    pub(crate) fn new(
        backoff: Backoff<String>,
        infeasible: InfeasibleHold<String>,
        competition: Option<Competition>,
    ) -> Self {
        Self {
            uids: HashMap::new(),
            backoff,
            infeasible,
            pins: HashMap::new(),
            competition,
            compete_at: HashMap::new(),
            node_gone_since: HashMap::new(),
            awaiting_bound: std::collections::HashSet::new(),
            pv_created: HashMap::new(),
            final_failures: HashMap::new(),
        }
    }

    /// A reconcile of the claim `key` with UID `uid` starts (`bound`: its volume is named, for
    /// good). What was remembered under `key` for a claim of another UID (deleted, then created
    /// again under its name) is forgotten. A claim first seen pending forgets what an earlier one
    /// left too: a bound claim's UID is not kept.
    pub(crate) fn observe(&mut self, key: &str, uid: &str, bound: bool) {
        if bound {
            // A claim created again already bound (to a static PV) leaves nothing of the one before.
            if self.uids.remove(key).is_some_and(|known| known != uid) {
                self.forget(key);
            }
            return;
        }
        if self.uids.get(key).is_some_and(|known| known == uid) {
            return;
        }
        self.forget(key);
        self.uids.insert(key.to_owned(), uid.to_owned());
    }

    /// Everything remembered about `key`.
    fn forget(&mut self, key: &str) {
        self.retain_keys(|k| k != key, false);
    }

    // === Reconcile outcomes ===

    /// A reconcile failed: the delay before the next one.
    pub(crate) fn failed(&mut self, key: &str) -> Duration {
        self.backoff.failed(&key.to_owned())
    }

    /// A reconcile succeeded: the next failure starts the backoff over.
    pub(crate) fn succeeded(&mut self, key: &str) {
        self.backoff.reset(&key.to_owned());
    }

    /// The claim is ignored for `reason`: what no longer applies is forgotten.
    pub(crate) fn ignored(&mut self, key: &str, reason: &IgnoreReason) {
        if matches!(
            reason,
            IgnoreReason::ClaimDeleting | IgnoreReason::AlreadyBound(_) | IgnoreReason::PvExists(_)
        ) {
            self.pins.remove(key);
        }
        // The competition is over for a claim that is bound, deleted or not ours.
        if !matches!(reason, IgnoreReason::NotThisNode(_)) {
            self.stop_competing(key);
        }
        // A claim that is going away keeps no hold-back behind.
        if matches!(
            reason,
            IgnoreReason::ClaimDeleting | IgnoreReason::AlreadyBound(_)
        ) {
            self.infeasible.remove(&key.to_owned());
        }
    }

    /// Keeps only the claims `keep` accepts (the others left the cache for good).
    pub(crate) fn retain(&mut self, keep: impl Fn(&str) -> bool) {
        self.uids.retain(|k, _| keep(k));
        self.retain_keys(keep, true);
    }

    /// Keeps the entries of the keys `keep` accepts; `expire`: and drops PV creations older than
    /// [`PV_CACHE_GRACE`].
    fn retain_keys(&mut self, keep: impl Fn(&str) -> bool, expire: bool) {
        self.backoff.retain(|k| keep(k));
        self.infeasible.retain(|k| keep(k));
        if let Some(competition) = &mut self.competition {
            competition.retain(&keep);
        }
        self.compete_at.retain(|k, _| keep(k));
        self.node_gone_since.retain(|k, _| keep(k));
        self.awaiting_bound.retain(|k| keep(k));
        self.final_failures.retain(|k, _| keep(k));
        let now = Instant::now();
        self.pv_created
            .retain(|k, at| keep(k) && (!expire || now.duration_since(*at) < PV_CACHE_GRACE));
        self.pins.retain(|k, _| keep(k));
    }

    // === CreateVolume attempts ===

    /// `Err(remaining)` while the claim is held back after an infeasible answer for this class.
    pub(crate) fn check_feasible(
        &mut self,
        key: &str,
        class_uid: &str,
        now: Instant,
    ) -> Result<(), Duration> {
        self.infeasible.check(&key.to_owned(), class_uid, now)
    }

    /// The requirement a retry must send again, if one is pinned.
    pub(crate) fn pinned(&self, key: &str) -> Option<TopologyRequirement> {
        self.pins.get(key).cloned()
    }

    /// CreateVolume was sent with `requirement`: retries send it again (nothing to pin when it had
    /// none: a request without requirements is recomputed identically without looking at nodes).
    pub(crate) fn sent(&mut self, key: &str, requirement: Option<&TopologyRequirement>) {
        if let Some(requirement) = requirement {
            self.pins.insert(key.to_owned(), requirement.clone());
        }
    }

    /// CreateVolume failed in state `outcome`; `infeasible`: hold the claim back for `class_uid`.
    pub(crate) fn create_failed(
        &mut self,
        key: &str,
        outcome: ProvisioningState,
        infeasible: Option<(&str, Instant)>,
    ) {
        // Upstream forgets the pin on a final error and on reschedule, and keeps it while the
        // volume may still be in progress or nothing reached the driver.
        if matches!(
            outcome,
            ProvisioningState::Finished | ProvisioningState::Reschedule
        ) {
            self.pins.remove(key);
        }
        if let Some((class_uid, now)) = infeasible {
            self.infeasible.record(key.to_owned(), class_uid, now);
        }
    }

    /// A CreateVolume failed for sure: how many have since the last success or stop.
    pub(crate) fn final_failure(&mut self, key: &str) -> u32 {
        let n = self.final_failures.entry(key.to_owned()).or_default();
        *n += 1;
        *n
    }

    /// The retry policy stopped the claim: removing the stop gives it a fresh count.
    pub(crate) fn stopped(&mut self, key: &str) {
        self.final_failures.remove(key);
    }

    /// The PV exists: the attempt is over.
    pub(crate) fn provisioned(&mut self, key: &str) {
        self.final_failures.remove(key);
        self.infeasible.remove(&key.to_owned());
        self.pins.remove(key);
        self.awaiting_bound.insert(key.to_owned());
        self.pv_created.insert(key.to_owned(), Instant::now());
    }

    /// Whether this process created the claim's PV within [`PV_CACHE_GRACE`] of `now`.
    pub(crate) fn recently_provisioned(&self, key: &str, now: Instant) -> bool {
        self.pv_created
            .get(key)
            .is_some_and(|at| now.duration_since(*at) < PV_CACHE_GRACE)
    }

    /// The claim `key` is Bound: `true` the first time for a claim whose PV this process created
    /// (its latency is to be recorded once), `false` otherwise.
    pub(crate) fn bound(&mut self, key: &str) -> bool {
        self.awaiting_bound.remove(key)
    }

    /// The requirement is no longer needed (node cleared, intent finished or cleaned up).
    pub(crate) fn unpin(&mut self, key: &str) {
        self.pins.remove(key);
    }

    // === Node mode ===

    /// When this instance may claim the unselected claim `key` (a new jittered delay the first
    /// time; `jitter` in `[0, 1)`).
    pub(crate) fn compete_due(&mut self, key: &str, now: Instant, jitter: f64) -> Instant {
        if let Some(due) = self.compete_at.get(key) {
            return *due;
        }
        let delay = self.competition.as_mut().map(|c| c.next_delay(key, jitter));
        let due = now + delay.unwrap_or_default();
        self.compete_at.insert(key.to_owned(), due);
        due
    }

    /// The wait is over (claimed or lost): a later competition draws a new delay.
    pub(crate) fn compete_now(&mut self, key: &str) {
        self.compete_at.remove(key);
    }

    /// The competition for `key` is over.
    pub(crate) fn stop_competing(&mut self, key: &str) {
        if let Some(competition) = &mut self.competition {
            competition.forget(key);
        }
    }

    /// Since when the intent of `key` has been waiting for its missing `node` (starts now, and
    /// anew when the node is another).
    pub(crate) fn node_missing_since(&mut self, key: &str, node: &str, now: Instant) -> Instant {
        match self.node_gone_since.get(key) {
            Some((known, since)) if known == node => *since,
            _ => {
                self.node_gone_since
                    .insert(key.to_owned(), (node.to_owned(), now));
                now
            }
        }
    }

    /// The node is back, or the claim moved on: a later absence starts a new grace period.
    pub(crate) fn node_not_missing(&mut self, key: &str) {
        self.node_gone_since.remove(key);
    }
}

#[cfg(test)]
#[path = "controller_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "controller_memory_tests.rs"]
mod memory_tests;
