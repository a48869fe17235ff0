//! The skeleton both controllers share: the resync period, the retry delay of a busy volume name,
//! the worker count, pruning per-object memory at each resync, graceful shutdown, and logging a
//! failed reconcile (its retry is the controller's own error policy).

use std::fmt::Debug;
use std::hash::Hash;
use std::sync::Arc;
use std::time::Duration;

use futures::{StreamExt, TryFuture};
use kube::Resource;
use kube::runtime::controller::{Action, Config as ControllerConfig, Controller};
use serde::de::DeserializeOwned;
use tracing::{Instrument, debug};

use super::{Context, Shutdown};

/// Re-check every object this often even without changes (upstream's resync is 15 minutes).
pub(crate) const RESYNC: Duration = Duration::from_secs(10 * 60);
/// Retry delay when a volume name is busy with another operation in this process.
pub(crate) const LOCK_RETRY: Duration = Duration::from_millis(500);

/// Runs `controller` until shutdown with the shared policy: `--worker-threads` workers, every
/// object again each [`RESYNC`], `prune` (forget the memory of objects that left the cache) at
/// each resync. `span` wraps the whole run; `what` names the objects in log lines.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn drive<K, S, Fut>(
    ctx: &Context,
    span: tracing::Span,
    what: &'static str,
    controller: Controller<K>,
    reconcile: impl FnMut(Arc<K>, Arc<S>) -> Fut,
    error_policy: impl Fn(Arc<K>, &Fut::Error, Arc<S>) -> Action,
    state: Arc<S>,
    prune: impl Fn() + Send + 'static,
    shutdown: Shutdown,
) where
    K: Clone + Resource + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Eq + Hash + Clone + Debug + Unpin,
    Fut: TryFuture<Ok = Action> + Send + 'static,
    Fut::Error: std::error::Error + Send + 'static,
{
    let pruner = crate::k8s::watch::spawn_every(RESYNC, prune);
    let workers = u16::try_from(ctx.config.provisioning.worker_threads.max(1)).unwrap_or(u16::MAX);
    controller
        .reconcile_all_on(crate::k8s::watch::resync_every(RESYNC))
        .with_config(ControllerConfig::default().concurrency(workers))
        .graceful_shutdown_on(shutdown.requested())
        .run(reconcile, error_policy, state)
        .for_each(|result| async move {
            if let Err(e) = result {
                debug!(error = %e, "{what} reconcile ended with an error");
            }
        })
        .instrument(span)
        .await;
    pruner.abort();
}
