//! The provisioning controller shell, in three steps per claim: gather the facts once
//! ([`gather`]), decide ([`plan::decide_claim`], pure), execute the decision
//! ([`execute_decision`]: events, the selected node, the competition, or the provisioning run of
//! [`execute`]: intent, secret, CreateVolume, PV). Nothing is decided twice: a decision taken on a
//! cache that may lag behind (a class or CSINode it lacks) is confirmed by one live read before it
//! is acted on, and the next watch event brings the fresh claim for the next round. Clean-up after
//! claims that no longer want their volume is not here: the intent log's resolver
//! ([`intents::resolve`]) is its only path.
//! What the user and the operator see of a claim (events, logs, the metrics' labels) is reported
//! here too, at the end of this file.
//!
//! What a claim's decision needs ([`Facts`]) is gathered once per reconcile ([`gather`]): the caches, plus the
//! few live reads only some claims need (a VolumeAttributesClass, in node mode what the selected
//! node recorded for the claim), then the data source the decision asks for. Node-mode ownership
//! is computed here, once.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::{CSINode, StorageClass, VolumeAttributesClass};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, ResourceExt};
use tracing::{debug, info_span, warn};

use super::memory::ClaimMemory;
use super::plan::{
    self, ClaimDecision, ClearReason, Facts, IgnoreReason, NodeFacts, NodeMode, PlanError,
    ProvisionSettings,
};
use super::source::{SourceLookup, holds_clone_protection};
use super::topology::{StaticTopology, TopologyView};
use crate::csi::v1::CreateVolumeRequest;
use crate::k8s::cache::{self, Cache, Lean};
use crate::k8s::errors::describe;
use crate::k8s::events::{EventSource, EventSpec, reference_to};
use crate::k8s::patch;
use crate::model::topology::CsiNodeLookup;
use crate::names;
use crate::node_mode::ownership::{
    self, ClaimOwnership, Competition, NodeIdentity, OwnershipInputs,
};
use crate::retry::{Backoff, InfeasibleHold};
use crate::runtime::queue::{self, Key};
use crate::runtime::{Action, Context, Shutdown};
use crate::sync::lock;
use intents::IntentLog;

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
    #[error("{what}: {}", crate::k8s::errors::describe(source))]
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
            crate::metrics::workqueue::CLAIMS,
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

    /// The CreateVolume provisioning `pvc` would send now ([`plan::request_now`]).
    fn request_now(
        &self,
        state: &Provisioner,
        pvc: &PersistentVolumeClaim,
        volume_name: &str,
    ) -> Option<CreateVolumeRequest> {
        plan::request_now(pvc, &state.settings, self, volume_name)
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

#[cfg(test)]
#[path = "controller_tests.rs"]
mod tests;
