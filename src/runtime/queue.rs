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

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use futures::stream::FuturesUnordered;
use futures::{Stream, StreamExt, TryFuture, TryFutureExt};
use tokio::time::Instant;
use tracing::{Instrument, debug};

use super::{Context, Shutdown};
use crate::k8s::cache::{Cache, Lean};
use crate::metrics::workqueue::{QueueMetrics, Run};

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
/// `queue_name` is the client-go queue name its `workqueue_*` metrics carry.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn drive<K, S, Fut>(
    ctx: &Context,
    span: tracing::Span,
    what: &'static str,
    queue_name: &'static str,
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
    let mut queue = WorkQueue::new(ctx.metrics.work_queues.queue(queue_name));
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

#[cfg(test)]
mod tests {
    use super::*;

    fn key(s: &str) -> Key {
        Arc::from(s)
    }

    #[test]
    fn a_key_is_queued_once_and_never_runs_twice_at_once() {
        let mut q = WorkQueue::default();
        q.add(key("a"));
        q.add(key("a"));
        q.add(key("b"));
        assert_eq!(q.next().as_deref(), Some("a"));
        // Triggered while running: not handed to a second worker...
        q.add(key("a"));
        assert_eq!(q.next().as_deref(), Some("b"));
        assert_eq!(q.next(), None);
        // ...but run again once the first run ends, even if it asked to wait.
        q.done(
            key("a"),
            Action::requeue(Duration::from_secs(60)),
            Instant::now(),
        );
        assert_eq!(q.next().as_deref(), Some("a"));
        q.done(key("a"), Action::await_change(), Instant::now());
        q.done(key("b"), Action::await_change(), Instant::now());
        assert_eq!(q.len(), 0, "nothing is kept of keys that wait for a change");
    }

    #[test]
    fn a_retry_runs_when_due_and_a_trigger_before_it_wins() {
        let mut q = WorkQueue::default();
        let now = Instant::now();
        q.add(key("a"));
        q.add(key("b"));
        let a = q.next().unwrap();
        let b = q.next().unwrap();
        q.done(a, Action::requeue(Duration::from_secs(5)), now);
        q.done(b, Action::requeue(Duration::from_secs(10)), now);
        assert_eq!(q.next_due(), Some(now + Duration::from_secs(5)));
        q.promote(now + Duration::from_secs(4));
        assert_eq!(q.next(), None, "not due yet");
        // A change to b runs it now and cancels its scheduled retry.
        q.add(key("b"));
        assert_eq!(q.next().as_deref(), Some("b"));
        q.done(key("b"), Action::await_change(), now);
        q.promote(now + Duration::from_secs(5));
        assert_eq!(q.next().as_deref(), Some("a"));
        q.promote(now + Duration::from_secs(60));
        assert_eq!(q.next(), None, "b's old retry was dropped");
        assert_eq!(q.next_due(), None);
    }

    #[test]
    fn of_two_requested_retries_the_earlier_is_kept() {
        let mut q = WorkQueue::default();
        let now = Instant::now();
        q.add_at(key("a"), now + Duration::from_secs(10));
        q.add_at(key("a"), now + Duration::from_secs(3));
        q.add_at(key("a"), now + Duration::from_secs(7));
        assert_eq!(q.next_due(), Some(now + Duration::from_secs(3)));
        q.promote(now + Duration::from_secs(3));
        assert_eq!(q.next().as_deref(), Some("a"));
        assert_eq!(q.next_due(), None);
    }

    #[test]
    fn metrics_follow_client_go_counting() {
        let metrics = QueueMetrics::default();
        let mut q = WorkQueue::new(metrics.clone());
        let now = Instant::now();
        q.add(key("a"));
        q.add(key("a"));
        q.add(key("b"));
        assert_eq!(metrics.depth(), 2, "a duplicate trigger is no add");
        let a = q.next().unwrap();
        assert_eq!(metrics.depth(), 1);
        q.add(key("a"));
        assert_eq!(metrics.depth(), 2, "triggered while running: waiting again");
        q.done(a, Action::requeue(Duration::from_secs(5)), now);
        assert_eq!(metrics.depth(), 2, "the run again is the same add");
        assert_eq!(q.next().as_deref(), Some("b"));
        assert_eq!(q.next().as_deref(), Some("a"));
        assert_eq!(metrics.depth(), 0);
    }
}
