//! The skeleton both controllers share: the [`WorkQueue`] worked by `--worker-threads` workers,
//! the resync period, the retry delay of a busy volume name, pruning per-object memory at each
//! resync, graceful shutdown, and logging a failed reconcile (its retry is the controller's own
//! error policy).

use std::sync::Arc;
use std::time::Duration;

use futures::stream::FuturesUnordered;
use futures::{Stream, StreamExt, TryFuture, TryFutureExt};
use tokio::time::Instant;
use tracing::{Instrument, debug};

use super::queue::{Action, Key, WorkQueue};
use super::{Context, Shutdown};
use crate::k8s::cache::Cache;
use crate::k8s::lean::Lean;

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
    let pruner = crate::k8s::watch::spawn_every(RESYNC, prune);
    let workers = ctx.config.provisioning.worker_threads.max(1);
    let mut queue = WorkQueue::new(ctx.metrics.work_queues.queue(queue_name));
    let mut running = FuturesUnordered::new();
    let triggers = triggers.fuse();
    let resync = crate::k8s::watch::resync_every(RESYNC);
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
