//! The dead-node controller shell: answers Delete for volumes whose node no longer exists, driving
//! [`super::tracker::NodeGoneTracker`] with cache lookups and live GETs.
//!
//! It runs in node-deployment mode, and in controller mode when Nodes and CSINodes are watched
//! (topology on and supported by the driver); the tracker itself only considers volumes pinned to
//! one node, so a zonal driver never has a candidate. A pass, every [`policy::check_interval`] of
//! the grace period (30 s by default), sooner when a timer is due or the set of Nodes or CSINodes
//! changes:
//!
//! 1. Rank: controller mode is always the actor; in node mode this instance's rendezvous rank for
//!    [`super::policy::janitor_key`] among the live instances (CSINode lists our driver and the
//!    Node exists). Unranked instances hold no state and make no API calls.
//! 2. PVs: controller mode reads the shared (lean) PV store, unpacking one PV at a time. Node mode
//!    watches only its own node's PVs, so the ranked instances list, page by page, the PVs labelled
//!    with a missing node (`gone_nodes::discover`): nodes that vanished or were replaced since the
//!    last pass, and those found by a sweep of the driver's PV *metadata* when ranked and every
//!    [`crate::node_mode::scope::SWEEP_INTERVAL`]. The same sweep labels PVs written without our
//!    labels that no instance labelled (`node_mode::labeller`).
//! 3. Each PV: cached Node lookup → [`NodeGoneTracker::observe`]; at the end of the grace period a
//!    live Node GET (or label LIST) plus a live PV GET, observed again; then the plan is executed:
//!    PV DELETE with a UID precondition, our finalizer removed, an event, the counter.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, ObjectReference, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::CSINode;
use kube::api::ListParams;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, ResourceExt};
use tracing::{Instrument, debug, info, info_span, warn};

use super::candidates::{claim_bond_matches, classify};
use super::discover::{Lists, NodeView, Pages, StillMissing, fingerprint};
use super::ledgers::GoneLedgers;
use super::policy::{self, GoneConfig, Now};
use super::tracker::{CancelReason, GoneAction, GoneEvent, GonePlan, NodeCheck, NodeGoneTracker};
use crate::k8s::events::{EventSpec, reference_to};
use crate::k8s::patch::{self, DeleteOutcome};
use crate::model::locate::{HOSTNAME_LABEL, Mode, NodeLookup, NodeQuery, PerNodeKeys};
use crate::model::meta::label;
use crate::names;
use crate::retry::describe;
use crate::runtime::{Context, Shutdown};

/// How often the Node and CSINode caches are compared with the last pass (cheap: in memory).
const NODE_POLL: Duration = Duration::from_secs(1);

/// Runs the dead-node controller until shutdown.
pub(crate) async fn run(ctx: Arc<Context>, shutdown: Shutdown) {
    let (Some(nodes), Some(csinodes)) = (ctx.stores.nodes.clone(), ctx.stores.csinodes.clone())
    else {
        debug!(
            "Nodes are not watched (no topology, controller mode): volumes of deleted nodes are not tracked"
        );
        shutdown.requested().await;
        return;
    };
    let mut janitor = Janitor::new(ctx, nodes, csinodes);
    info!(
        grace_period = %crate::gofmt::format_go_duration(janitor.tracker.config().grace_period),
        pvc_cleanup = janitor.tracker.config().pvc_cleanup,
        "tracking volumes whose node no longer exists"
    );
    let mut poll = tokio::time::interval(NODE_POLL);
    poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // A pass can be long (many API calls); shutdown does not wait for it. Stopping between its
    // writes is safe: a PV left deleted with our finalizer is a candidate again after a restart.
    async move {
        loop {
            let next = tokio::select! {
                next = janitor.pass() => next,
                () = shutdown.clone().requested() => return,
            };
            let sleep = tokio::time::sleep_until(next.into());
            tokio::pin!(sleep);
            loop {
                tokio::select! {
                    () = &mut sleep => break,
                    _ = poll.tick() => if janitor.nodes_changed() { break },
                    () = shutdown.clone().requested() => return,
                }
            }
        }
    }
    .instrument(info_span!("deleted-nodes"))
    .await;
}

struct Janitor {
    ctx: Arc<Context>,
    nodes: Store<Node>,
    csinodes: Store<CSINode>,
    mode: Mode,
    /// `NODE_NAME` in node mode.
    me: String,
    tracker: NodeGoneTracker,
    interval: Duration,
    /// Node mode: what the label-selected lists of missing nodes' PVs remember between passes
    /// (controller mode reads the shared PV store, which holds every PV).
    lists: Option<Lists>,
    /// Node mode: the intent ledgers of missing nodes.
    ledgers: GoneLedgers,
    /// Fingerprint of the Node and CSINode caches at the last pass.
    fingerprint: u64,
    /// Whether the last pass was ranked (logs the hand-overs).
    ranked: Option<usize>,
}

impl Janitor {
    fn new(ctx: Arc<Context>, nodes: Store<Node>, csinodes: Store<CSINode>) -> Self {
        let options = &ctx.config.deleted_node;
        let (mode, me) = match &ctx.config.node_deployment {
            Some(n) => (Mode::Node, n.node_name.clone()),
            None => (Mode::Controller, String::new()),
        };
        let config = GoneConfig::new(
            &ctx.driver.name,
            mode,
            options.grace_period,
            options.pvc_cleanup,
        );
        let interval = config.unknown_recheck;
        let ledgers = GoneLedgers::new(crate::leader::ledger_namespace(&ctx.config));
        let mut janitor = Self {
            tracker: NodeGoneTracker::new(config),
            ctx,
            nodes,
            csinodes,
            mode,
            me,
            interval,
            lists: (mode == Mode::Node).then(Lists::default),
            ledgers,
            fingerprint: 0,
            ranked: None,
        };
        let keys = janitor.per_node_keys(&janitor.nodes.state());
        janitor.tracker.set_per_node_keys(keys);
        janitor
    }

    fn driver(&self) -> &str {
        &self.ctx.driver.name
    }

    /// The keys whose value names one node: node mode from our own segments, controller mode from
    /// every CSINode and Node.
    fn per_node_keys(&self, nodes: &[Arc<Node>]) -> PerNodeKeys {
        match self.mode {
            Mode::Node => {
                let own = self.nodes.get(&ObjectRef::new(&self.me));
                let hostname = own
                    .as_ref()
                    .and_then(|n| label(&n.metadata, HOSTNAME_LABEL));
                let segments = self.ctx.driver.node_segments();
                PerNodeKeys::from_node(&self.me, hostname, &segments)
            }
            Mode::Controller => {
                let labels: HashMap<&str, &BTreeMap<String, String>> = nodes
                    .iter()
                    .filter_map(|n| {
                        Some((n.metadata.name.as_deref()?, n.metadata.labels.as_ref()?))
                    })
                    .collect();
                let csinodes = self.csinodes.state();
                PerNodeKeys::from_cluster(
                    &self.ctx.driver.name,
                    csinodes.iter().map(AsRef::as_ref),
                    |name| labels.get(name).copied(),
                )
            }
        }
    }

    fn current_fingerprint(&self) -> u64 {
        fingerprint(&self.nodes.state(), &self.csinodes.state(), self.driver())
    }

    /// Whether a Node or CSINode came, went or was replaced since the last pass.
    fn nodes_changed(&self) -> bool {
        self.current_fingerprint() != self.fingerprint
    }

    /// One pass over the candidates; returns when the next one is due.
    async fn pass(&mut self) -> Instant {
        let started = Instant::now();
        let mut next = started + self.interval;
        self.fingerprint = self.current_fingerprint();
        let nodes = self.nodes.state();
        if self.mode == Mode::Controller {
            let keys = self.per_node_keys(&nodes);
            if keys != self.tracker.config().per_node_keys {
                self.tracker.set_per_node_keys(keys);
            }
        }
        let rank = self.rank(&nodes);
        self.note_rank(rank);
        let keys = self.tracker.config().per_node_keys.clone();
        if let Some(lists) = &mut self.lists {
            lists.remember_nodes(&nodes, &keys);
        }
        if self.mode == Mode::Node && rank == Some(0) {
            let names = nodes
                .iter()
                .filter_map(|n| n.metadata.name.clone())
                .collect();
            // One fallback delay more than the grace period: the claims of its entries get their
            // answer (selected node cleared, with its event) from the provisioning controller.
            let config = self.tracker.config();
            let wait = config.grace_period + config.fallback_delay;
            let due = self.ledgers.pass(&self.ctx.client, names, wait);
            next = due.await.map_or(next, |due| next.min(due));
        } else {
            self.ledgers.stand_down();
        }
        let Some(rank) = rank else {
            self.tracker.retain(std::iter::empty());
            if let Some(lists) = &mut self.lists {
                lists.stand_down();
            }
            self.ctx.node_metrics.set_waiting(0);
            return next;
        };
        let view = NodeView::new(&nodes);
        let mut seen = BTreeSet::new();
        let complete = match self.mode {
            Mode::Controller => {
                let pvs = self.ctx.stores.pvs.state().into_iter().map(|pv| pv.full());
                let pass = self.observe_all(pvs, rank, &view, &mut next, &mut seen);
                pass.await;
                true
            }
            Mode::Node => {
                self.observe_lists(rank, &view, &keys, started, &mut next, &mut seen)
                    .await
            }
        };
        // After a failed list, keep every timer as it is and try again at the next pass.
        if complete {
            self.tracker.retain(seen.iter().map(String::as_str));
        }
        self.ctx.node_metrics.set_waiting(self.tracker.waiting());
        next
    }

    /// Observes every candidate (or tracked) PV of `pvs`.
    async fn observe_all(
        &mut self,
        pvs: impl Iterator<Item = PersistentVolume> + Send,
        rank: usize,
        view: &NodeView<'_>,
        next: &mut Instant,
        seen: &mut BTreeSet<String>,
    ) {
        for pv in pvs {
            let name = pv.name_any();
            if classify(&pv, self.tracker.config()).is_err()
                && self.tracker.first_absent(&name).is_none()
            {
                continue;
            }
            seen.insert(name);
            self.handle(&pv, rank, view, next).await;
        }
    }

    /// Node mode: the PVs of missing nodes, a page at a time (memory stays at one page), then the
    /// suspect PVs of no single node one by one. `false` when a read failed.
    async fn observe_lists(
        &mut self,
        rank: usize,
        view: &NodeView<'_>,
        keys: &PerNodeKeys,
        now: Instant,
        next: &mut Instant,
        seen: &mut BTreeSet<String>,
    ) -> bool {
        let Some(mut lists) = self.lists.take() else {
            return true;
        };
        lists.sweep_if_due(&self.ctx, view, keys, now).await;
        let api: Api<PersistentVolume> = Api::all(self.ctx.client.clone());
        let mut still = StillMissing::default();
        let mut complete = true;
        if let Some(selector) = lists.selector(&self.ctx.driver.name) {
            let mut pages = Pages::new(&selector);
            while let Some(params) = pages.params() {
                match api.list(params).await {
                    Ok(page) => {
                        pages.advance(&page.metadata);
                        for pv in &page.items {
                            still.note(pv, keys, view);
                        }
                        self.observe_all(page.items.into_iter(), rank, view, next, seen)
                            .await;
                    }
                    Err(e) => {
                        warn!(error = %describe(&e), %selector, "listing the PVs of deleted nodes failed; retrying at the next pass");
                        complete = false;
                        break;
                    }
                }
            }
        }
        for name in lists.suspect_pvs() {
            match api.get_opt(&name).await {
                Ok(Some(pv)) => {
                    still.note(&pv, keys, view);
                    self.observe_all(std::iter::once(pv), rank, view, next, seen)
                        .await;
                }
                Ok(None) => {}
                Err(e) => {
                    warn!(pv = %name, error = %describe(&e), "reading a PV of a deleted node failed; retrying at the next pass");
                    complete = false;
                }
            }
        }
        if complete {
            lists.keep(still);
        }
        self.lists = Some(lists);
        complete
    }

    /// This instance's rank: always 0 in controller mode; in node mode among the live instances.
    fn rank(&self, nodes: &[Arc<Node>]) -> Option<usize> {
        // Not even the sets are built when there is nobody to rank against.
        if self.mode == Mode::Controller {
            return Some(0);
        }
        let existing: BTreeSet<&str> = nodes
            .iter()
            .filter_map(|n| n.metadata.name.as_deref())
            .collect();
        let csinodes = self.csinodes.state();
        let live: Vec<String> = crate::model::topology::live_instances(
            csinodes.iter().map(AsRef::as_ref),
            self.driver(),
        )
        .into_iter()
        .filter(|n| existing.contains(n.as_str()))
        .collect();
        let key = policy::janitor_key(self.driver());
        policy::actor_rank(self.mode, &key, &self.me, live.iter().map(String::as_str))
    }

    fn note_rank(&mut self, rank: Option<usize>) {
        if self.mode == Mode::Node && rank != self.ranked {
            match rank {
                Some(0) => {
                    info!("this instance now answers volumes of deleted nodes for the driver")
                }
                Some(r) => info!(
                    rank = r,
                    "this instance is now fallback {r} for volumes of deleted nodes"
                ),
                None => info!("another instance answers volumes of deleted nodes now"),
            }
        }
        self.ranked = rank;
    }

    async fn handle(
        &mut self,
        pv: &PersistentVolume,
        rank: usize,
        view: &NodeView<'_>,
        next: &mut Instant,
    ) {
        let lookup = match classify(pv, self.tracker.config()) {
            Ok(candidate) => view.lookup(&candidate.query),
            // Not a candidate: observe cancels whatever was tracked without reading the lookup.
            Err(_) => NodeLookup::Failed {
                reason: "not a candidate".to_owned(),
            },
        };
        self.decide(pv, NodeCheck::Cached(lookup), rank, next).await;
    }

    /// Feeds `check` to the tracker and does what it answers.
    async fn decide(
        &mut self,
        pv: &PersistentVolume,
        check: NodeCheck,
        rank: usize,
        next: &mut Instant,
    ) {
        let name = pv.name_any();
        let was_tracked = self.tracker.first_absent(&name).is_some();
        match self.tracker.observe(pv, &check, Some(rank), Now::system()) {
            GoneAction::Nothing => {}
            GoneAction::StartTimer { deadline } => {
                if !was_tracked && let Ok(candidate) = classify(pv, self.tracker.config()) {
                    info!(pv = %name, node = %candidate.query, rank,
                        grace_period = %crate::gofmt::format_go_duration(self.tracker.config().grace_period),
                        "the volume's node is missing; answering it as deleted after the grace period unless the node comes back");
                }
                *next = (*next).min(deadline);
            }
            GoneAction::ConfirmLive { query } => {
                // Boxed: confirm feeds the live answer back here.
                Box::pin(self.confirm(pv, &query, rank, next)).await;
            }
            GoneAction::ActOnPv(plan) => self.act(plan, pv).await,
            GoneAction::Cancel(reason) => log_cancel(&name, &reason),
        }
    }

    /// The grace period is over: ask the API server, not the cache, and decide on its answer.
    async fn confirm(
        &mut self,
        pv: &PersistentVolume,
        query: &NodeQuery,
        rank: usize,
        next: &mut Instant,
    ) {
        let name = pv.name_any();
        let nodes: Api<Node> = Api::all(self.ctx.client.clone());
        let lookup = match query {
            NodeQuery::ByName { name, .. } => {
                NodeLookup::from_get(&nodes.get_metadata_opt(name).await)
            }
            NodeQuery::ByLabel { .. } => {
                let selector = query.label_selector().unwrap_or_default();
                let params = ListParams::default().labels(&selector).limit(1);
                NodeLookup::from_list(&nodes.list_metadata(&params).await.map(|l| l.items))
            }
        };
        if let NodeLookup::Failed { reason } = &lookup {
            warn!(pv = %name, node = %query, %reason,
                "could not confirm that the volume's node is gone (this never counts as absence); asking again later");
        }
        let pvs: Api<PersistentVolume> = Api::all(self.ctx.client.clone());
        let fresh = match pvs.get_opt(&name).await {
            Ok(Some(fresh)) => fresh,
            Ok(None) => {
                self.tracker.forget(&name);
                return;
            }
            Err(e) => {
                warn!(pv = %name, error = %describe(&e), "could not re-read the PV; asking again later");
                *next = (*next).min(Instant::now() + self.interval);
                return;
            }
        };
        // Tracked, so no new-timer log; a live check never asks for another.
        self.decide(&fresh, NodeCheck::Live(lookup), rank, next)
            .await;
    }

    async fn act(&mut self, plan: GonePlan, fresh: &PersistentVolume) {
        match plan {
            GonePlan::RemovePv {
                pv,
                pv_uid,
                delete_object,
                remove_finalizer,
                event,
            } => {
                // Never in the middle of this process's own DeleteVolume (or CreateVolume) for it.
                let Some(_lock) = self.ctx.volume_locks.try_lock(&pv) else {
                    debug!(pv = %pv, "volume busy with another operation; next pass");
                    return;
                };
                let api: Api<PersistentVolume> = Api::all(self.ctx.client.clone());
                if delete_object {
                    match patch::delete_with_uid(&api, &pv, &pv_uid).await {
                        Ok(DeleteOutcome::Deleted) => {}
                        Ok(DeleteOutcome::Gone) => {
                            self.tracker.forget(&pv);
                            return;
                        }
                        Err(e) => {
                            warn!(pv = %pv, error = %e, "deleting the PV of a deleted node failed; next pass");
                            return;
                        }
                    }
                }
                if remove_finalizer
                    && let Err(e) = patch::remove_finalizer(
                        &api,
                        fresh,
                        names::FINALIZER_PV_DELETION_PROTECTION,
                    )
                    .await
                {
                    warn!(pv = %pv, error = %e, "removing our finalizer from the PV of a deleted node failed; next pass");
                    return;
                }
                self.record(&pv, &event, [reference_to(fresh)]);
                self.ctx.node_metrics.volume_answered();
                self.tracker.forget(&pv);
            }
            GonePlan::DeleteClaim { pv, claim, event } => {
                let api: Api<PersistentVolumeClaim> =
                    Api::namespaced(self.ctx.client.clone(), &claim.namespace);
                let current = match api.get_opt(&claim.name).await {
                    Ok(Some(current)) => current,
                    // Gone already: the PV is released next and answered at once.
                    Ok(None) => return,
                    Err(e) => {
                        warn!(pv = %pv, claim = %format!("{}/{}", claim.namespace, claim.name), error = %describe(&e),
                            "could not read the claim of a volume whose node is gone; next pass");
                        return;
                    }
                };
                if current.metadata.deletion_timestamp.is_some() {
                    return;
                }
                if !claim_bond_matches(fresh, &current) {
                    info!(pv = %pv, claim = %format!("{}/{}", claim.namespace, claim.name),
                        "the claim is not the one bound to the volume (re-created?); not deleting it");
                    return;
                }
                match patch::delete_with_uid(&api, &claim.name, &claim.uid).await {
                    Ok(DeleteOutcome::Deleted) => {
                        self.record(&pv, &event, [reference_to(fresh), reference_to(&current)]);
                        self.ctx.node_metrics.claim_deleted();
                    }
                    Ok(DeleteOutcome::Gone) => {}
                    Err(e) => {
                        warn!(pv = %pv, error = %e, "deleting the claim of a volume whose node is gone failed; next pass");
                    }
                }
            }
        }
    }

    /// Logs `event` and records it on each object of `on`.
    fn record(&self, pv: &str, event: &GoneEvent, on: impl IntoIterator<Item = ObjectReference>) {
        info!(pv = %pv, "{}", event.message);
        for object in on {
            let spec = EventSpec::normal(event.reason, event.message.clone());
            self.ctx.events.emit(object, spec);
        }
    }
}

fn log_cancel(pv: &str, reason: &CancelReason) {
    match reason {
        CancelReason::NodePresent => {
            info!(pv = %pv, "the volume's node is back; nothing is removed");
        }
        CancelReason::NotCandidate(skip) => {
            debug!(pv = %pv, ?skip, "the volume no longer waits for its missing node");
        }
        CancelReason::NotActor => debug!(pv = %pv, "another instance answers this volume now"),
    }
}

#[cfg(test)]
#[path = "controller_tests.rs"]
mod tests;
