//! The capacity shell: its own API client and rate budget (`--kube-api-capacity-qps/-burst`), a
//! watch of our CSIStorageCapacity objects in `NAMESPACE`, and one loop that turns the pure plan
//! into at most `--capacity-threads` concurrent syncs (GetCapacity, then the one write `plan::decide`
//! asks for, if any) and deletions.
//!
//! The loop is level-triggered: every [`CHECK_PERIOD`] it recomputes the desired keys from the
//! caches (classes x segments) and the diff against the objects, in memory, without a request.
//! New or re-appeared keys and objects deleted by someone are synced, obsolete objects deleted.
//! Every key is polled once per `--capacity-poll-interval`, the polls spread evenly over it (a
//! few keys each check, round robin) so the driver sees a steady rate. A volume's creation or
//! deletion refreshes the keys of its segments right away, as the PV watch shows it
//! (`plan::volume_change`): a new PV at once, a Released or deleted one with reclaim policy Delete
//! once it has left the cache (its volume is deleted first). Failures back off per key from
//! `--retry-interval-start` to `--retry-interval-max`.
//!
//! The queue holds at most one item per key, in three lanes: a new node's or class's objects
//! first, then what the scheduler lacks (a missing object, an obsolete one to delete), then
//! refreshes of objects that exist, so a new node's objects appear within seconds however long
//! the backlog of refreshes is. A refresh queued again before it ran stays one item (it reads the
//! capacity when it runs).
//!
//! Only the leader acts (`--leader-election`): the controller starts queueing once
//! `Context::leadership` says this replica leads, every write waits for that guard right before it
//! goes out (as CreateVolume does), and becoming leader queues every key, so a new leader adopts
//! and refreshes the objects its predecessor left.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use futures::Stream;
use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;
use futures::{FutureExt, StreamExt};
use k8s_openapi::api::core::v1::{Node, PersistentVolume};
use k8s_openapi::api::storage::v1::{CSINode, CSIStorageCapacity};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::DeleteParams;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Api, Client};
use tokio::sync::watch;
use tracing::{debug, info, warn};

use super::metrics::CapacityMetrics;
use super::plan::{self, Affected, Identity, Key, Segment, VolumeChange};
use super::polls::Polls;
use super::queue::{Lane, Queue};
use crate::config::{Config, RateLimit};
use crate::csi::DriverInfo;
use crate::k8s::cache::{Lean, watch_shared};
use crate::retry::{Backoff, describe};
use crate::runtime::queue::{QueueMetrics, Run};
use crate::runtime::{Context, Shutdown};

/// How often the desired set is compared with the caches (in memory only).
pub(crate) const CHECK_PERIOD: Duration = Duration::from_secs(1);
/// How long an object we created is trusted to exist before the watch shows it; past that it is
/// presumed deleted by someone and created again.
const CREATED_GRACE: Duration = Duration::from_secs(30);

/// Everything decided at start-up.
pub(crate) struct Capacity {
    client: Client,
    identity: Identity,
    namespace: String,
    owner: Option<OwnerReference>,
    /// Node-deployment mode: this instance's segment only.
    fixed_segment: Option<Segment>,
    metrics: CapacityMetrics,
}

/// Start-up of the feature (upstream's order and messages): `NAMESPACE` (and `POD_NAME` for an
/// owner) from the environment, the client with the capacity rate budget, the owner lookup. Errors
/// are fatal, as upstream. `None` when `--enable-capacity` is off.
pub(crate) async fn prepare(
    config: &Config,
    driver: &DriverInfo,
    metrics: CapacityMetrics,
) -> anyhow::Result<Option<Capacity>> {
    let options = &config.capacity;
    if !options.enabled {
        return Ok(None);
    }
    let namespace = std::env::var("NAMESPACE")
        .ok()
        .filter(|n| !n.is_empty())
        .context("need NAMESPACE env variable for CSIStorageCapacity objects")?;
    let mut kube = config.kube.clone();
    kube.rate_limit = rate_limit(options.qps, options.burst)?;
    // A bucket of its own: capacity requests never take the workers' budget, nor they its.
    let client = crate::k8s::client::build_clients(&kube)
        .await
        .context("building the capacity controller's Kubernetes client")?
        .workers;
    let owner = match u32::try_from(options.ownerref_level) {
        Err(_) => None,
        Ok(levels) => {
            let pod = std::env::var("POD_NAME")
                .ok()
                .filter(|n| !n.is_empty())
                .context("need POD_NAME env variable to determine CSIStorageCapacity owner")?;
            // Its message only: main prints the chain (`{:#}`), where the kube::Error source would
            // add kube's Status dump after the API server's message already in the text.
            let owner = super::owner::lookup(&client, &namespace, &pod, levels)
                .await
                .map_err(|e| anyhow::Error::msg(e.to_string()))?;
            info!(
                "using {}/{} {} as owner of CSIStorageCapacity objects",
                owner.api_version, owner.kind, owner.name
            );
            Some(owner)
        }
    };
    let node = config
        .node_deployment
        .as_ref()
        .map(|n| n.node_name.as_str());
    let fixed_segment = node.map(|_| {
        let segment: Segment = driver.node_segments();
        info!(
            ?segment,
            "producing CSIStorageCapacity objects with fixed topology segment"
        );
        segment
    });
    if !driver.controller.get_capacity {
        warn!(
            "--enable-capacity is set but the driver does not advertise the GET_CAPACITY controller capability; its GetCapacity calls will fail"
        );
    }
    let identity = Identity {
        driver: driver.name.clone(),
        managed_by: plan::managed_by_id(node),
    };
    Ok(Some(Capacity {
        client,
        identity,
        namespace,
        owner,
        fixed_segment,
        metrics,
    }))
}

/// client-go's defaulting for the capacity client: 0 means 5 QPS / burst 10, a negative QPS no limit.
fn rate_limit(qps: f32, burst: i64) -> anyhow::Result<Option<RateLimit>> {
    let qps = f64::from(qps);
    anyhow::ensure!(
        qps.is_finite(),
        "--kube-api-capacity-qps={qps} must be a finite number"
    );
    if qps < 0.0 {
        return Ok(None);
    }
    let burst = match burst {
        0 => 10,
        b => u32::try_from(b).ok().filter(|b| *b >= 1).with_context(|| {
            format!("--kube-api-capacity-burst={burst} is out of range: it must be at least 1 (0 means the default, 10)")
        })?,
    };
    Ok(Some(RateLimit {
        qps: if qps == 0.0 { 5.0 } else { qps },
        burst,
    }))
}

/// One unit of work.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Item {
    /// GetCapacity for the key, then create or update its object if needed.
    Sync(Key),
    /// Delete an obsolete object (by name).
    Delete(String),
}

/// What a finished sync wrote.
type Done = (Item, Result<Option<CSIStorageCapacity>, String>);

impl Capacity {
    /// Runs until shutdown; acts only while `ctx.leadership` allows. `pv_changes` is the PV
    /// watch's stream of changed PVs.
    pub(crate) async fn run(
        self,
        ctx: Arc<Context>,
        pv_changes: impl Stream<Item = Arc<Lean<PersistentVolume>>> + Send,
        queue_metrics: QueueMetrics,
        shutdown: Shutdown,
    ) {
        // Leadership is only ever gained here: a leader that loses its lease exits the process.
        let (became_leader, leader) = watch::channel(false);
        {
            let leadership = ctx.leadership.clone();
            tokio::spawn(async move {
                leadership.acting().await;
                let _ = became_leader.send(true);
            });
        }
        let api: Api<CSIStorageCapacity> = Api::namespaced(self.client.clone(), &self.namespace);
        let objects = watch_shared(
            api.clone(),
            watcher::Config::default().labels(&self.identity.selector()),
            "csistoragecapacities",
            0,
        );
        // Segments come from CSINodes and Nodes; central instances of a driver without topology
        // have no such caches from the provisioning side, so they watch both themselves.
        let topology = match (&self.fixed_segment, &ctx.stores.csinodes, &ctx.stores.nodes) {
            (Some(_), _, _) => None,
            (None, Some(csinodes), Some(nodes)) => Some((csinodes.clone(), nodes.clone())),
            (None, _, _) => {
                let wc = watcher::Config::default();
                let csinodes: Store<CSINode> =
                    watch_shared(Api::all(self.client.clone()), wc.clone(), "csinodes", 0).store;
                let nodes: Store<Node> =
                    watch_shared(Api::all(self.client.clone()), wc, "nodes", 0).store;
                Some((csinodes, nodes))
            }
        };
        let ready = async {
            objects.store.wait_until_ready().await.ok();
            if let Some((csinodes, nodes)) = &topology {
                csinodes.wait_until_ready().await.ok();
                nodes.wait_until_ready().await.ok();
            }
        };
        // The PV stream is read only from here: unread, it stalls none of the controllers that
        // share its watch (a stream is fed from its first read), even when a watch above never
        // lists, its RBAC missing say. A volume created or deleted meanwhile needs no note: the
        // first check as leader syncs every key.
        tokio::select! {
            () = ready => {}
            () = shutdown.clone().requested() => return,
        }
        tokio::pin!(pv_changes);
        info!(
            namespace = %self.namespace,
            managed_by = %self.identity.managed_by,
            "capacity controller started"
        );
        if let Some(node) = &ctx.config.node_deployment {
            tokio::spawn(super::orphans::sweep(
                ctx.clone(),
                self.client.clone(),
                self.namespace.clone(),
                node.node_name.clone(),
                leader.clone(),
                shutdown.clone(),
            ));
        }

        let settings = &ctx.config.capacity;
        let poll = settings.poll_interval.max(Duration::from_millis(100));
        let mut state = Loop {
            ctx: &ctx,
            api,
            identity: self.identity,
            namespace: self.namespace,
            owner: self.owner,
            fixed_segment: self.fixed_segment,
            topology,
            objects: objects.store,
            known: BTreeSet::new(),
            fresh: BTreeSet::new(),
            existing: BTreeMap::new(),
            queue: Queue::default(),
            polls: Polls::new(poll, Instant::now()),
            in_flight: HashMap::new(),
            queue_metrics,
            written: HashMap::new(),
            backoff: Backoff::new(
                ctx.config.provisioning.retry_interval_start,
                ctx.config.provisioning.retry_interval_max,
            ),
            not_before: HashMap::new(),
            was_leader: false,
            ending: HashMap::new(),
            metrics: self.metrics,
        };
        let threads = usize::try_from(settings.threads).unwrap_or(1).max(1);
        let mut check = tokio::time::interval(CHECK_PERIOD);
        check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut workers = FuturesUnordered::new();
        let stop = shutdown.requested();
        tokio::pin!(stop);
        loop {
            let is_leader = *leader.borrow();
            tokio::select! {
                () = &mut stop => break,
                _ = check.tick() => {
                    state.check(is_leader);
                    if is_leader {
                        state.poll_due();
                    }
                    state.volumes_gone(is_leader);
                }
                Some(pv) = pv_changes.next() => {
                    state.volume_changed(&pv, is_leader);
                }
                Some((item, result)) = workers.next(), if !workers.is_empty() => {
                    state.finished(item, result);
                }
            }
            if !*leader.borrow() {
                continue;
            }
            while workers.len() < threads {
                let Some(item) = state.next_item() else { break };
                workers.push(state.start(item));
            }
        }
        // In-flight calls are dropped: a half-done sync is redone by the next leader or start.
        info!("capacity controller stopped");
    }
}

/// Notes `pv`'s change in `ending` (our PVs whose volume is being deleted, by name); returns what
/// a volume just created changed. (A stream that lagged far behind may yield a new PV only as
/// Bound: its segments are refreshed by the next poll then.)
fn note_volume(
    driver: &str,
    ending: &mut HashMap<String, Affected>,
    pv: &Lean<PersistentVolume>,
) -> Option<Affected> {
    match plan::volume_change(driver, &pv.full()) {
        VolumeChange::Created(affected) => return Some(affected),
        VolumeChange::Ending(affected) => {
            ending.insert(pv.key().to_owned(), affected);
        }
        VolumeChange::Unchanged => {
            ending.remove(pv.key());
        }
    }
    None
}

/// The loop's state (one task owns it; workers only run the calls).
struct Loop<'a> {
    ctx: &'a Context,
    api: Api<CSIStorageCapacity>,
    identity: Identity,
    namespace: String,
    owner: Option<OwnerReference>,
    fixed_segment: Option<Segment>,
    topology: Option<(Store<CSINode>, Store<Node>)>,
    objects: Store<CSIStorageCapacity>,
    /// The desired keys at the last check.
    known: BTreeSet<Key>,
    /// Keys that appeared while leading (a new node or class), until their object exists.
    fresh: BTreeSet<Key>,
    /// The object (by name) kept for each key at the last check.
    existing: BTreeMap<Key, String>,
    queue: Queue<Item>,
    polls: Polls,
    in_flight: HashMap<Item, Run>,
    /// Upstream's `csistoragecapacity` work-queue metrics.
    queue_metrics: QueueMetrics,
    /// The object we last wrote per key, until the watch shows it (so a second sync neither
    /// creates a duplicate nor updates a stale copy).
    written: HashMap<Key, (CSIStorageCapacity, Instant)>,
    backoff: Backoff<Item>,
    not_before: HashMap<Item, Instant>,
    was_leader: bool,
    /// Our PVs seen Released or being deleted, reclaim Delete (by name), with what their volume's
    /// deletion frees.
    ending: HashMap<String, Affected>,
    metrics: CapacityMetrics,
}

impl Loop<'_> {
    fn desired(&self) -> BTreeSet<Key> {
        let config = &self.ctx.config.capacity;
        let classes = self.ctx.stores.classes.state();
        let classes = plan::classes(
            &self.identity.driver,
            config.for_immediate_binding,
            classes.iter().map(Arc::as_ref),
        );
        let segments = match (&self.fixed_segment, &self.topology) {
            (Some(segment), _) => BTreeSet::from([segment.clone()]),
            (None, Some((csinodes, nodes))) => {
                let csinodes = csinodes.state();
                plan::segments(
                    &self.identity.driver,
                    csinodes.iter().map(Arc::as_ref),
                    |name| nodes.get(&ObjectRef::new(name)),
                )
            }
            (None, None) => BTreeSet::new(),
        };
        plan::desired(&classes, &segments)
    }

    /// Compares the desired set with the objects and queues what differs.
    fn check(&mut self, is_leader: bool) {
        let desired = self.desired();
        let diff = plan::diff(&self.identity, &desired, &self.objects.state());
        self.metrics
            .observe(desired.len(), diff.existing.len(), diff.obsolete.len());
        // Forget what we wrote once the watch shows it (or it went stale).
        let now = Instant::now();
        self.written.retain(|key, (object, at)| {
            let seen = diff.existing.get(key).and_then(|name| {
                self.objects
                    .get(&ObjectRef::new(name).within(&self.namespace))
            });
            let caught_up = seen.is_some_and(|s| {
                s.metadata.name == object.metadata.name
                    && s.metadata.resource_version == object.metadata.resource_version
            });
            !caught_up && desired.contains(key) && now.duration_since(*at) < CREATED_GRACE
        });
        let wanted = |item: &Item| match item {
            Item::Sync(key) => desired.contains(key),
            Item::Delete(name) => diff.obsolete.contains(name),
        };
        self.backoff.retain(wanted);
        self.not_before.retain(|item, _| wanted(item));
        // A segment or class that appeared while leading (a new node): its objects go first.
        let (leading, fresh) = (is_leader && self.was_leader, &mut self.fresh);
        fresh.extend(desired.difference(&self.known).filter(|_| leading).cloned());
        fresh.retain(|k| desired.contains(k) && !diff.existing.contains_key(k));
        self.known = desired.clone();
        self.existing = diff.existing;
        self.metrics.observe_lag(self.queue.oldest(now));
        if is_leader {
            if !self.was_leader {
                // Newly leader (or just started): refresh every object, adopting what exists.
                desired
                    .iter()
                    .cloned()
                    .for_each(|k| self.enqueue(Item::Sync(k)));
            }
            for key in &diff.missing {
                if !self.written.contains_key(key) {
                    self.enqueue(Item::Sync(key.clone()));
                }
            }
            for name in &diff.obsolete {
                self.enqueue(Item::Delete(name.clone()));
            }
        }
        self.was_leader = is_leader;
    }

    /// Queues the keys whose poll is due (see [`Polls`]).
    fn poll_due(&mut self) {
        let due = self.polls.due(&self.known, Instant::now());
        if !due.is_empty() {
            debug!(keys = due.len(), "capacity poll");
        }
        due.into_iter().for_each(|k| self.enqueue(Item::Sync(k)));
    }

    /// The lane an item belongs in now: a key without an object, or an obsolete object, is
    /// what the scheduler is missing or misled by.
    fn lane(&self, item: &Item) -> Lane {
        let exists = |key| self.existing.contains_key(key) || self.written.contains_key(key);
        match item {
            Item::Sync(key) if exists(key) => Lane::Refresh,
            Item::Sync(key) if self.fresh.contains(key) => Lane::New,
            Item::Sync(_) | Item::Delete(_) => Lane::Urgent,
        }
    }

    /// A PV changed: a new volume of ours refreshes its keys now; an ending one once it is gone.
    fn volume_changed(&mut self, pv: &Lean<PersistentVolume>, is_leader: bool) {
        if let Some(created) = note_volume(&self.identity.driver, &mut self.ending, pv) {
            self.refresh(&created, is_leader);
        }
    }

    /// Refreshes the keys of the ending PVs that left the cache (their volumes were deleted).
    fn volumes_gone(&mut self, is_leader: bool) {
        let pvs = &self.ctx.stores.pvs;
        let gone: Vec<Affected> = self
            .ending
            .extract_if(|name, _| pvs.get(name).is_none())
            .map(|(_, affected)| affected)
            .collect();
        gone.iter().for_each(|a| self.refresh(a, is_leader));
    }

    /// Queues a sync of every key `affected` covers (while leading: a new leader syncs them all).
    fn refresh(&mut self, affected: &Affected, is_leader: bool) {
        if !is_leader {
            return;
        }
        let keys: Vec<Key> = self
            .known
            .iter()
            .filter(|k| affected.covers(k))
            .cloned()
            .collect();
        debug!(
            ?affected,
            keys = keys.len(),
            "volume created or deleted: refreshing capacity"
        );
        keys.into_iter().for_each(|k| self.enqueue(Item::Sync(k)));
    }

    /// Queues `item` once (see [`Queue::push`]) in its lane.
    fn enqueue(&mut self, item: Item) {
        let lane = self.lane(&item);
        if self.queue.push(item, lane, Instant::now()) {
            self.queue_metrics.added();
        }
    }

    /// The first queued item that is not running and not backing off, urgent ones first.
    fn next_item(&mut self) -> Option<Item> {
        let now = Instant::now();
        let (in_flight, not_before) = (&self.in_flight, &self.not_before);
        let (item, since) = self.queue.pop(|item| {
            !in_flight.contains_key(item) && not_before.get(item).is_none_or(|t| *t <= now)
        })?;
        self.queue_metrics.taken(since);
        Some(item)
    }

    /// Starts `item` and returns its future (it owns what it needs, so the loop stays free).
    fn start(&mut self, item: Item) -> BoxFuture<'static, Done> {
        self.in_flight
            .insert(item.clone(), self.queue_metrics.started());
        let api = self.api.clone();
        let leadership = self.ctx.leadership.clone();
        let key = match &item {
            Item::Delete(name) => {
                let name = name.clone();
                return async move {
                    leadership.acting().await;
                    let result = match api.delete(&name, &DeleteParams::default()).await {
                        Ok(_) => {
                            info!(object = %name, "deleted obsolete CSIStorageCapacity");
                            Ok(None)
                        }
                        Err(kube::Error::Api(s)) if s.code == 404 => Ok(None),
                        Err(e) => Err(format!(
                            "delete CSIStorageCapacity {name}: {}",
                            describe(&e)
                        )),
                    };
                    (item, result)
                }
                .boxed();
            }
            Item::Sync(key) => key.clone(),
        };
        let Some(class) = self.ctx.stores.classes.get(&ObjectRef::new(&key.class)) else {
            // Gone meanwhile: the next check drops the key.
            return futures::future::ready((item, Ok(None))).boxed();
        };
        let existing = self.written.get(&key).map(|(o, _)| o.clone()).or_else(|| {
            // As of the last check (at most CHECK_PERIOD old): a stale name reads as missing
            // here or fails the write, and either is redone.
            let name = self.existing.get(&key)?;
            self.objects
                .get(&ObjectRef::new(name).within(&self.namespace))
                .map(|o| o.as_ref().clone())
        });
        let parameters = class.parameters.clone().unwrap_or_default();
        let (csi, identity) = (self.ctx.csi.clone(), self.identity.clone());
        let (namespace, owner) = (self.namespace.clone(), self.owner.clone());
        async move {
            let result = super::sync::sync(
                &leadership,
                &api,
                csi.as_ref(),
                &key,
                parameters,
                existing.as_ref(),
                &identity,
                &namespace,
                owner.as_ref(),
            )
            .await;
            (item, result)
        }
        .boxed()
    }

    fn finished(&mut self, item: Item, result: Result<Option<CSIStorageCapacity>, String>) {
        if let Some(run) = self.in_flight.remove(&item) {
            self.queue_metrics.finished(run);
        }
        match result {
            Ok(written) => {
                self.backoff.reset(&item);
                self.not_before.remove(&item);
                if let (Item::Sync(key), Some(object)) = (&item, written) {
                    self.written.insert(key.clone(), (object, Instant::now()));
                }
            }
            Err(message) => {
                if let Item::Sync(key) = &item {
                    // A conflict or a missing object means our copy is stale: start from the
                    // watch's.
                    self.written.remove(key);
                }
                let delay = self.backoff.failed(&item);
                warn!(retry_in = ?delay, "{message}");
                self.not_before.insert(item.clone(), Instant::now() + delay);
                self.queue_metrics.retried();
                self.enqueue(item);
            }
        }
    }
}
