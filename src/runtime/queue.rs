//! The work queue both controllers run on, keyed by cache key (`namespace/name` or `name`), with
//! client-go's workqueue rules: a key is queued at most once, never reconciled by two workers at
//! once (a trigger during a run queues it again after the run), and a requested retry never delays
//! a trigger that comes earlier.
//!
//! Why not kube-runtime's `Controller`: it reads objects from its own `Store` type, whose entries
//! cost more memory than the objects (see [`crate::k8s::cache`]), and it queues an `ObjectRef` of
//! four owned strings per trigger: at start-up every cached object is triggered at once.
//!
//! It feeds client-go's `workqueue_*` metrics as client-go's queue does ([`QueueMetrics`]): an add
//! is a trigger of a key not already waiting, depth counts keys waiting (also those triggered
//! while running), a retry is a run that asked to run again later.
//!
//! [`drive`] runs a controller on it: the [`WorkQueue`] worked by `--worker-threads` workers,
//! the resync period, the retry delay of a busy volume name, pruning per-object memory at each
//! resync, graceful shutdown, and logging a failed reconcile (its retry is the controller's own
//! error policy).
//!
//! # The work-queue metrics
//!
//! client-go's work-queue metrics (`workqueue_*`, label `name`), with upstream's names, help
//! strings and buckets, for the queues whose meaning matches one of upstream's, registered at
//! start-up beside the `metrics` registry's own families ([`WorkQueueMetrics::register`]).
//! client-go creates a queue's series when the queue is built, before leader election, so every
//! series reads 0 from the first scrape: [`WorkQueueMetrics::queue`] creates them the same way and
//! the caller does so at start-up. The two in-progress gauges are computed at scrape time by a
//! collector, where client-go sets them from a 500 ms ticker: same meaning, never stale.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::stream::FuturesUnordered;
use futures::{Stream, StreamExt, TryFuture, TryFutureExt};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::Histogram;
use tokio::time::Instant;
use tracing::{Instrument, debug};

use super::{Context, Shutdown};
use crate::k8s::cache::{Cache, Lean};
use crate::metrics::meta::{Registrar, Stability};

/// What a reconcile asks for next: run again after a delay, or only on the next change.
/// (kube-runtime's `Action` does not expose its delay to a runner of our own.)
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Action {
    requeue_after: Option<Duration>,
}

impl Action {
    /// Run again after `delay` even if nothing changes.
    #[must_use]
    pub(crate) const fn requeue(delay: Duration) -> Self {
        Self {
            requeue_after: Some(delay),
        }
    }

    /// Run again only when a change (or the periodic resync) triggers it.
    #[must_use]
    pub(crate) const fn await_change() -> Self {
        Self {
            requeue_after: None,
        }
    }

    /// The delay of [`Action::requeue`], if any.
    pub(crate) const fn requeue_after(&self) -> Option<Duration> {
        self.requeue_after
    }
}

/// A cache key as queued; shared between the queue's sets.
pub(crate) type Key = Arc<str>;

/// The keys waiting, running and scheduled for later.
#[derive(Default)]
pub(crate) struct WorkQueue {
    /// Keys to run now, in trigger order.
    ready: VecDeque<Key>,
    /// The members of `ready`, with when they were added (wall clock, for the metrics).
    queued: HashMap<Key, std::time::Instant>,
    /// Keys a worker is reconciling.
    running: HashMap<Key, Run>,
    /// Running keys triggered again meanwhile, with when: they run again once done.
    again: HashMap<Key, std::time::Instant>,
    /// Keys to run later, by due time (the counter keeps equal times apart).
    later: BTreeMap<(Instant, u64), Key>,
    /// The due time of each member of `later`.
    due: HashMap<Key, (Instant, u64)>,
    counter: u64,
    metrics: QueueMetrics,
}

impl WorkQueue {
    /// An empty queue feeding `metrics`.
    pub(crate) fn new(metrics: QueueMetrics) -> Self {
        Self {
            metrics,
            ..Self::default()
        }
    }

    /// Queues `key` to run now (unless it is queued already; after the run if it is running).
    pub(crate) fn add(&mut self, key: Key) {
        if self.running.contains_key(&key) {
            if !self.again.contains_key(&key) {
                self.metrics.added();
                self.again.insert(key, std::time::Instant::now());
            }
            return;
        }
        if self.queued.contains_key(&key) {
            return;
        }
        if let Some(slot) = self.due.remove(&key) {
            self.later.remove(&slot);
        }
        self.metrics.added();
        self.queued.insert(key.clone(), std::time::Instant::now());
        self.ready.push_back(key);
    }

    /// Takes the next key to run and marks it running.
    pub(crate) fn next(&mut self) -> Option<Key> {
        let key = self.ready.pop_front()?;
        if let Some(since) = self.queued.remove(&key) {
            self.metrics.taken(since);
        }
        self.running.insert(key.clone(), self.metrics.started());
        Some(key)
    }

    /// Records that the run of `key` ended asking for `action` at `now`.
    pub(crate) fn done(&mut self, key: Key, action: Action, now: Instant) {
        if let Some(run) = self.running.remove(&key) {
            self.metrics.finished(run);
        }
        if action.requeue_after().is_some() {
            // client-go counts every AddAfter, also one a newer trigger overtakes.
            self.metrics.retried();
        }
        if let Some(since) = self.again.remove(&key) {
            // Something changed during the run: look again now, whatever the run asked. Already
            // counted as an add when triggered.
            if let Some(slot) = self.due.remove(&key) {
                self.later.remove(&slot);
            }
            self.queued.insert(key.clone(), since);
            self.ready.push_back(key);
        } else if let Some(delay) = action.requeue_after() {
            self.add_at(key, now + delay);
        }
    }

    /// Queues `key` to run at `at`, unless it runs earlier anyway.
    fn add_at(&mut self, key: Key, at: Instant) {
        if self.queued.contains_key(&key) || self.running.contains_key(&key) {
            return;
        }
        if let Some(&(current, _)) = self.due.get(&key)
            && current <= at
        {
            return;
        }
        if let Some(slot) = self.due.remove(&key) {
            self.later.remove(&slot);
        }
        self.counter += 1;
        let slot = (at, self.counter);
        self.due.insert(key.clone(), slot);
        self.later.insert(slot, key);
    }

    /// When the earliest scheduled key is due.
    pub(crate) fn next_due(&self) -> Option<Instant> {
        self.later.keys().next().map(|(at, _)| *at)
    }

    /// Moves every key due at `now` to the ready queue.
    pub(crate) fn promote(&mut self, now: Instant) {
        while let Some(entry) = self.later.first_entry() {
            if entry.key().0 > now {
                break;
            }
            let key = entry.remove();
            self.due.remove(&key);
            self.add(key);
        }
    }

    /// Keys queued, running or scheduled (for tests and gauges).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.queued.len() + self.running.len() + self.due.len()
    }
}

/// Re-check every object this often even without changes (upstream's resync is 15 minutes).
pub(crate) const RESYNC: Duration = Duration::from_secs(10 * 60);
/// Retry delay when a volume name is busy with another operation in this process.
pub(crate) const LOCK_RETRY: Duration = Duration::from_millis(500);

/// Runs a controller until shutdown with the shared policy: the objects of `cache` named by
/// `triggers` (their own changes and those of related objects, as cache keys) are reconciled by
/// `--worker-threads` workers, every cached object again each [`RESYNC`], `prune` (forget the
/// memory of objects that left the cache) at each resync. On shutdown no new run starts and the
/// running ones finish. `span` wraps the whole run; `what` names the objects in log lines;
/// `metrics` are its client-go queue's `workqueue_*` series.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn drive<K, S, Fut>(
    ctx: &Context,
    span: tracing::Span,
    what: &'static str,
    metrics: QueueMetrics,
    cache: Cache<K>,
    triggers: impl Stream<Item = Key> + Send,
    mut reconcile: impl FnMut(Arc<Lean<K>>, Arc<S>) -> Fut,
    error_policy: impl Fn(Arc<Lean<K>>, &Fut::Error, Arc<S>) -> Action,
    state: Arc<S>,
    prune: impl Fn() + Send + 'static,
    shutdown: Shutdown,
) where
    Fut: TryFuture<Ok = Action> + Send + 'static,
    Fut::Error: std::error::Error + Send + 'static,
{
    let pruner = crate::k8s::cache::spawn_every(RESYNC, prune);
    let workers = ctx.config.provisioning.worker_threads.max(1);
    let mut queue = WorkQueue::new(metrics);
    let mut running = FuturesUnordered::new();
    let triggers = triggers.fuse();
    let resync = crate::k8s::cache::resync_every(RESYNC);
    let stop = shutdown.requested();
    futures::pin_mut!(triggers, resync, stop);
    let mut stopping = false;
    async {
        loop {
            while !stopping && running.len() < workers {
                let Some(key) = queue.next() else { break };
                // An object that left the cache meanwhile has nothing to reconcile.
                let run = cache.get(&key).map(|obj| {
                    let result = TryFutureExt::into_future(reconcile(obj.clone(), state.clone()));
                    (obj, result)
                });
                running.push(async move {
                    match run {
                        Some((obj, result)) => (key, Some((obj, result.await))),
                        None => (key, None),
                    }
                });
            }
            if stopping && running.is_empty() {
                break;
            }
            let due = queue.next_due();
            tokio::select! {
                biased;
                () = &mut stop, if !stopping => stopping = true,
                Some((key, outcome)) = running.next(), if !running.is_empty() => {
                    let action = match outcome {
                        None => Action::await_change(),
                        Some((_, Ok(action))) => action,
                        Some((obj, Err(e))) => {
                            debug!(key = %key, error = %e, "{what} reconcile ended with an error");
                            error_policy(obj, &e, state.clone())
                        }
                    };
                    queue.done(key, action, Instant::now());
                }
                Some(key) = triggers.next(), if !stopping => queue.add(key),
                Some(()) = resync.next(), if !stopping => {
                    for obj in cache.state() {
                        queue.add(Arc::from(obj.key()));
                    }
                }
                // Without `due` the branch is disabled: its sleep is built but never polled.
                () = tokio::time::sleep_until(due.unwrap_or_else(Instant::now)), if due.is_some() && !stopping => queue.promote(Instant::now()),
                else => break,
            }
        }
    }
    .instrument(span)
    .await;
    pruner.abort();
}

/// The cache key of each object of `changes`: the trigger of a controller's own kind.
pub(crate) fn keys_of<K>(
    changes: impl Stream<Item = Arc<Lean<K>>> + Send + 'static,
) -> impl Stream<Item = Key> + Send + 'static
where
    K: 'static,
{
    changes.map(|obj| Arc::from(obj.key()))
}

/// Upstream's queue of claims to provision (sig-storage-lib's claim queue; our provision
/// controller).
pub(crate) const CLAIMS: &str = "claims";
/// Upstream's queue of PVs to delete (sig-storage-lib's volume queue; our reclaim controller).
pub(crate) const VOLUMES: &str = "volumes";
/// Upstream's capacity controller queue (only with `--enable-capacity`).
pub(crate) const CSISTORAGECAPACITY: &str = "csistoragecapacity";

type NameLabel = [(&'static str, String); 1];
type HistogramFamily = Family<NameLabel, Histogram, fn() -> Histogram>;

fn name_label(name: &str) -> NameLabel {
    [("name", name.to_owned())]
}

/// client-go's `ExponentialBuckets(10e-9, 10, 10)`: 10 ns to 10 s, by repeated multiplication
/// as Go computes them (so two bounds are `9.999999999999999e-06` and `…e-05`, as upstream's).
fn duration_histogram() -> Histogram {
    let bounds = std::iter::successors(Some(10e-9_f64), |b| Some(b * 10.0)).take(10);
    Histogram::new(bounds)
}

const UNFINISHED: &str = "workqueue_unfinished_work_seconds";
const UNFINISHED_HELP: &str = "[BETA] How many seconds of work has done that is in progress and hasn't been observed by work_duration. Large values indicate stuck threads. One can deduce the number of stuck threads by observing the rate at which this increases.";
const LONGEST: &str = "workqueue_longest_running_processor_seconds";
const LONGEST_HELP: &str =
    "[BETA] How many seconds has the longest running processor for workqueue been running.";

/// The work-queue families, registered once; one [`QueueMetrics`] per queue name.
#[derive(Debug, Clone)]
pub(crate) struct WorkQueueMetrics {
    depth: Family<NameLabel, Gauge>,
    adds: Family<NameLabel, Counter>,
    queue_duration: HistogramFamily,
    work_duration: HistogramFamily,
    retries: Family<NameLabel, Counter>,
    /// The runs in progress of each queue name, read by the scrape-time collector.
    running: Arc<Mutex<BTreeMap<String, Arc<RunStarts>>>>,
}

impl WorkQueueMetrics {
    /// Registers the seven families (BETA, as component-base registers them).
    pub(crate) fn register(registrar: &mut Registrar<'_>) -> Self {
        let metrics = Self {
            depth: Family::default(),
            adds: Family::default(),
            queue_duration: Family::new_with_constructor(duration_histogram),
            work_duration: Family::new_with_constructor(duration_histogram),
            retries: Family::default(),
            running: Arc::default(),
        };
        let beta = Stability::Beta;
        registrar.register(
            beta,
            "workqueue_depth",
            "Current depth of workqueue",
            metrics.depth.clone(),
        );
        registrar.register(
            beta,
            "workqueue_adds",
            "Total number of adds handled by workqueue",
            metrics.adds.clone(),
        );
        registrar.register(
            beta,
            "workqueue_queue_duration_seconds",
            "How long in seconds an item stays in workqueue before being requested.",
            metrics.queue_duration.clone(),
        );
        registrar.register(
            beta,
            "workqueue_work_duration_seconds",
            "How long in seconds processing an item from workqueue takes.",
            metrics.work_duration.clone(),
        );
        registrar.register_collector(
            beta,
            2,
            Box::new(InProgress {
                running: metrics.running.clone(),
            }),
        );
        registrar.register(
            beta,
            "workqueue_retries",
            "Total number of retries handled by workqueue",
            metrics.retries.clone(),
        );
        metrics
    }

    /// The metrics of the queue `name`, its series created now (at 0). Queues of one name share
    /// their series, as in client-go.
    pub(crate) fn queue(&self, name: &str) -> QueueMetrics {
        let label = name_label(name);
        let running = crate::sync::lock(&self.running)
            .entry(name.to_owned())
            .or_default()
            .clone();
        QueueMetrics {
            depth: self.depth.get_or_create(&label).clone(),
            adds: self.adds.get_or_create(&label).clone(),
            queue_duration: self.queue_duration.get_or_create(&label).clone(),
            work_duration: self.work_duration.get_or_create(&label).clone(),
            retries: self.retries.get_or_create(&label).clone(),
            running,
        }
    }
}

/// Start times of the runs in progress, by run id.
#[derive(Debug, Default)]
struct RunStarts {
    next_id: AtomicU64,
    started: Mutex<HashMap<u64, std::time::Instant>>,
}

/// The handles one queue updates; [`QueueMetrics::default`] is attached to no registry.
#[derive(Debug, Clone)]
pub(crate) struct QueueMetrics {
    depth: Gauge,
    adds: Counter,
    queue_duration: Histogram,
    work_duration: Histogram,
    retries: Counter,
    running: Arc<RunStarts>,
}

impl Default for QueueMetrics {
    fn default() -> Self {
        Self {
            depth: Gauge::default(),
            adds: Counter::default(),
            queue_duration: duration_histogram(),
            work_duration: duration_histogram(),
            retries: Counter::default(),
            running: Arc::default(),
        }
    }
}

/// A run in progress, from [`QueueMetrics::started`].
#[derive(Debug)]
#[must_use = "pass it to QueueMetrics::finished"]
pub(crate) struct Run(u64);

impl QueueMetrics {
    /// An item entered the queue (client-go's Add of an item not already waiting).
    pub(crate) fn added(&self) {
        self.adds.inc();
        self.depth.inc();
    }

    /// An item added at `since` was handed to a worker (client-go's Get).
    pub(crate) fn taken(&self, since: std::time::Instant) {
        self.depth.dec();
        self.queue_duration.observe(since.elapsed().as_secs_f64());
    }

    /// A worker started on an item.
    pub(crate) fn started(&self) -> Run {
        let id = self.running.next_id.fetch_add(1, Ordering::Relaxed);
        crate::sync::lock(&self.running.started).insert(id, std::time::Instant::now());
        Run(id)
    }

    /// The worker of `run` is done (client-go's Done).
    pub(crate) fn finished(&self, run: Run) {
        if let Some(start) = crate::sync::lock(&self.running.started).remove(&run.0) {
            self.work_duration.observe(start.elapsed().as_secs_f64());
        }
    }

    /// An item was scheduled to run again later (client-go's AddAfter / AddRateLimited).
    pub(crate) fn retried(&self) {
        self.retries.inc();
    }

    /// Current depth (for tests).
    #[cfg(test)]
    pub(crate) fn depth(&self) -> i64 {
        self.depth.get()
    }
}

/// Computes the two in-progress gauges of every queue name when scraped (help with the `.` the
/// registry would append, see `exposition`).
#[derive(Debug)]
struct InProgress {
    running: Arc<Mutex<BTreeMap<String, Arc<RunStarts>>>>,
}

impl Collector for InProgress {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let now = std::time::Instant::now();
        let values: Vec<(NameLabel, f64, f64)> = crate::sync::lock(&self.running)
            .iter()
            .map(|(name, running)| {
                let started = crate::sync::lock(&running.started);
                let ages = started
                    .values()
                    .map(|start| now.saturating_duration_since(*start).as_secs_f64());
                let (sum, longest) = ages.fold((0.0, 0.0_f64), |(s, l), a| (s + a, l.max(a)));
                (name_label(name), sum, longest)
            })
            .collect();
        for (name, help, longest) in [
            (UNFINISHED, UNFINISHED_HELP, false),
            (LONGEST, LONGEST_HELP, true),
        ] {
            let help = format!("{help}.");
            let mut family = encoder.encode_descriptor(name, &help, None, MetricType::Gauge)?;
            for (label, sum, max) in &values {
                let value = if longest { *max } else { *sum };
                ConstGauge::new(value).encode(family.encode_family(label)?)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
#[path = "queue_metrics_tests.rs"]
mod metrics_tests;

#[cfg(test)]
#[path = "queue_tests.rs"]
mod tests;
