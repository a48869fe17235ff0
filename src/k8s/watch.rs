//! Watches and the caches the controllers read from (lean caches, scoped selectors, indexes).
//!
//! Each resource is watched once: one task keeps its cache, and every controller that asked for
//! one gets its own stream of changed objects fed by the same watch, so two controllers reading PVCs
//! cost one watch and one cache. Objects are stripped of `managedFields` and the last-applied
//! annotation before they are cached: nothing here reads them (but a PV's phase time, taken first
//! where the API server is older than 1.29), and they are often the largest part of an object.
//!
//! The fan-out is ours rather than kube-runtime's `ReflectHandle`: that handle looks each change up
//! in the store again and, when the object left the store meanwhile (created then deleted, common in
//! mass deletions), returns `Pending` without arranging a wake-up, which stalls the controller and
//! then the watch. Here every subscriber receives the object itself, in order, with backpressure.
//!
//! The initial list is a streaming list (one watch with `sendInitialEvents`, as client-go does)
//! where the API server serves it, else pages of a list: on 10,000 claims that is one request
//! instead of twenty. PVs and claims are cached as [`Lean`] entries in a lean [`Cache`]; the few
//! small kinds (classes, nodes, CSINodes) in kube-runtime's `Store`.

use std::collections::HashSet;
use std::fmt::Debug;
use std::hash::Hash;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::PersistentVolume;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Resource};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::ReceiverStream;
use tracing::{Instrument, info, info_span, warn};

use crate::k8s::cache::{Cache, CacheWriter, Lean};
use crate::k8s::errors::describe_watch;

/// Changes buffered per subscriber: how far a slow controller may lag before the watch waits.
const SHARED_BUFFER: usize = 1024;

/// Annotation `kubectl apply` writes; a full copy of the object we never read.
const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// A watched resource: its cache (`R`: kube-runtime's store, or a lean [`Cache`]) and one change
/// stream per controller that asked for one.
pub(crate) struct Watched<S, R = Store<S>> {
    /// Read side of the cache.
    pub(crate) store: R,
    // Every stream must be consumed by its controller: an idle subscriber fills its buffer and then
    // stalls the watch, so exactly as many are made as are asked for.
    streams: Vec<ReceiverStream<Arc<S>>>,
    /// The task driving the watch.
    #[allow(
        dead_code,
        reason = "the handle of a task that runs for the life of the process; tests abort it"
    )]
    pub(crate) task: JoinHandle<()>,
}

/// A watched kind cached as [`Lean`] entries.
pub(crate) type WatchedLean<K> = Watched<Lean<K>, Cache<K>>;

impl<S: Send + Sync + 'static, R> Watched<S, R> {
    /// Takes one of the change streams asked for in [`watch_shared`].
    ///
    /// # Panics
    /// When more streams are taken than were asked for (a wiring bug caught at start-up).
    pub(crate) fn subscribe(&mut self) -> impl Stream<Item = Arc<S>> + Send + 'static {
        self.streams
            .pop()
            .expect("more subscriptions taken than watch_shared was asked for")
    }
}

/// Where a watch puts what it sees: kube-runtime's store, or a lean [`Cache`].
trait Sink<S>: Send + 'static {
    /// Applies one event; returns the objects to announce to the controllers.
    fn apply(&mut self, event: watcher::Event<S>) -> Vec<Arc<S>>;
}

impl<S> Sink<S> for (reflector::store::Writer<S>, Store<S>)
where
    S: Resource + Clone + Send + Sync + 'static,
    S::DynamicType: Eq + Hash + Clone + Send + Sync,
{
    fn apply(&mut self, event: watcher::Event<S>) -> Vec<Arc<S>> {
        self.0.apply_watcher_event(&event);
        // Objects of a (re-)list are announced once the list is complete and in the store, as
        // kube-runtime does: announcing them one by one could fill the buffers before the first
        // list completes, while the controllers wait for exactly that to start.
        match event {
            watcher::Event::Apply(obj) => vec![Arc::new(obj)],
            watcher::Event::InitDone => self.1.state(),
            _ => Vec::new(),
        }
    }
}

impl<K: 'static> Sink<Lean<K>> for CacheWriter<K> {
    fn apply(&mut self, event: watcher::Event<Lean<K>>) -> Vec<Arc<Lean<K>>> {
        CacheWriter::apply(self, event)
    }
}

/// Ticks every `period`, first after one period: a controller's periodic re-check of every object
/// (upstream's resync), for changes a watch cannot announce.
pub(crate) fn resync_every(period: std::time::Duration) -> impl Stream<Item = ()> + Send + 'static {
    let mut interval = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tokio_stream::wrappers::IntervalStream::new(interval).map(|_| ())
}

/// Runs `task` at every [`resync_every`] tick until the returned handle is aborted: the
/// house-keeping of a controller's in-memory state (forgetting objects that are gone).
pub(crate) fn spawn_every(
    period: std::time::Duration,
    mut task: impl FnMut() + Send + 'static,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let ticks = resync_every(period);
        futures::pin_mut!(ticks);
        while ticks.next().await.is_some() {
            task();
        }
    })
}

/// Every `period`, the names that left the set `snapshot` returns since the last look (one batch
/// per change; the first look is taken now). For what a watch subscriber is not told about:
/// deletions, or an object leaving a set derived from the cache (e.g. the nodes running an
/// instance of our driver).
pub(crate) fn departures(
    period: std::time::Duration,
    snapshot: impl Fn() -> HashSet<String> + Send + 'static,
) -> impl Stream<Item = Vec<String>> + Send + 'static {
    let first = snapshot();
    let ticks = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
    futures::stream::unfold(
        (ticks, snapshot, first),
        |(mut ticks, snapshot, mut previous)| async move {
            loop {
                ticks.tick().await;
                let now = snapshot();
                let gone: Vec<String> = previous.difference(&now).cloned().collect();
                previous = now;
                if !gone.is_empty() {
                    return Some((gone, (ticks, snapshot, previous)));
                }
            }
        },
    )
}

/// Strips what no controller reads before an object is cached.
pub(crate) fn strip<K: Resource + 'static>(obj: &mut K) {
    if let Some(pv) = (obj as &mut dyn std::any::Any).downcast_mut::<PersistentVolume>() {
        keep_phase_time(pv);
    }
    let meta = obj.meta_mut();
    meta.managed_fields = None;
    if let Some(ann) = meta.annotations.as_mut() {
        ann.remove(LAST_APPLIED);
    }
}

/// Before Kubernetes 1.29 a PV has no `status.lastPhaseTransitionTime`, so "Released for how
/// long" (the audit, the stuck-volume gauge) could not be told there: the time of the
/// managedFields entry that owns `status.phase` stands in for it, taken before the managedFields
/// are dropped. That time moves with any field its manager changes, so it is never earlier than
/// the transition: a stuck PV is reported late, never early.
fn keep_phase_time(pv: &mut PersistentVolume) {
    let owns_phase = |e: &&ManagedFieldsEntry| {
        (e.fields_v1.as_ref()).is_some_and(|f| f.0.pointer("/f:status/f:phase").is_some())
    };
    let written = pv
        .metadata
        .managed_fields
        .iter()
        .flatten()
        .filter(owns_phase);
    let written = written.filter_map(|e| e.time.clone()).max_by_key(|t| t.0);
    if let Some(status) = pv.status.as_mut() {
        status.last_phase_transition_time = status.last_phase_transition_time.take().or(written);
    }
}

/// Starts a shared, stripped, auto-retrying watch of `api` with `subscribers` change streams.
pub(crate) fn watch_shared<K>(
    api: Api<K>,
    config: watcher::Config,
    what: &'static str,
    subscribers: usize,
) -> Watched<K>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Eq + Hash + Clone + Default + Send + Sync,
{
    watch_shared_scoped(api, config, what, subscribers, |_: &mut K| true)
}

/// [`watch_shared`] for the numerous kinds (claims, PVs): the cache holds [`Lean`] entries.
pub(crate) fn watch_lean<K>(
    api: Api<K>,
    config: watcher::Config,
    what: &'static str,
    subscribers: usize,
) -> WatchedLean<K>
where
    K: Resource + Clone + DeserializeOwned + Serialize + Default + Debug + Send + Sync + 'static,
    K::DynamicType: Default,
{
    watch_lean_scoped(api, config, what, subscribers, |_: &mut K| true)
}

/// [`watch_shared_scoped`] into a lean [`Cache`].
pub(crate) fn watch_lean_scoped<K, F>(
    api: Api<K>,
    config: watcher::Config,
    what: &'static str,
    subscribers: usize,
    shape: F,
) -> WatchedLean<K>
where
    K: Resource + Clone + DeserializeOwned + Serialize + Default + Debug + Send + Sync + 'static,
    K::DynamicType: Default,
    F: Fn(&mut K) -> bool + Send + Sync + 'static,
{
    let (store, writer) = crate::k8s::cache::cache();
    spawn_watch(api, config, what, subscribers, shape, writer, store)
}

/// Like [`watch_shared`], but `shape` runs on every object after [`strip`]: it may strip more, and
/// returns whether the object is kept. Objects not kept never enter the store (an update that makes
/// a cached object uninteresting removes it), so memory follows what the controllers act on, not
/// what the API server sends (node-deployment scoping, `node_mode::scope`). Subscribers are not told
/// about removals made this way, as for deletions.
pub(crate) fn watch_shared_scoped<K, F>(
    api: Api<K>,
    config: watcher::Config,
    what: &'static str,
    subscribers: usize,
    shape: F,
) -> Watched<K>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Eq + Hash + Clone + Default + Send + Sync,
    F: Fn(&mut K) -> bool + Send + Sync + 'static,
{
    let (store, writer) = reflector::store();
    let sink = (writer, store.clone());
    spawn_watch(api, config, what, subscribers, shape, sink, store)
}

/// The task behind [`watch_shared_scoped`] and [`watch_lean_scoped`]: watches `api` (streamed
/// list first, paged list where refused), strips and shapes each object, applies it to `sink`
/// and announces what changed to `subscribers` streams; `store` reads what `sink` writes.
fn spawn_watch<K, S, F, W, R>(
    api: Api<K>,
    config: watcher::Config,
    what: &'static str,
    subscribers: usize,
    shape: F,
    mut sink: W,
    store: R,
) -> Watched<S, R>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Default,
    S: From<K> + Send + Sync + 'static,
    F: Fn(&mut K) -> bool + Send + Sync + 'static,
    W: Sink<S>,
{
    let (senders, streams): (Vec<_>, Vec<_>) = (0..subscribers)
        .map(|_| {
            let (tx, rx) = mpsc::channel(SHARED_BUFFER);
            (tx, ReceiverStream::new(rx))
        })
        .unzip();
    let task = tokio::spawn(
        async move {
            let events = watch_events(api, config, what);
            futures::pin_mut!(events);
            while let Some(event) = events.next().await {
                let Some(event) = scope_event(event.modify(strip::<K>), &shape) else {
                    continue;
                };
                // The cache first, so a controller woken by the change finds it there.
                for obj in sink.apply(convert::<K, S>(event)) {
                    for tx in &senders {
                        // A closed stream means its controller stopped (shutdown): nothing to tell.
                        let _ = tx.send(obj.clone()).await;
                    }
                }
            }
        }
        .instrument(info_span!("watch", resource = what)),
    );
    Watched {
        store,
        streams,
        task,
    }
}

/// A watch of `api` that keeps no store: the watcher's events, the initial list streamed with the
/// same fallback to paged LISTs as [`watch_shared_scoped`]. Errors are logged and retried with
/// backoff, so the stream ends only when the watcher does.
pub(crate) fn watch_events<K>(
    api: Api<K>,
    config: watcher::Config,
    what: &'static str,
) -> impl Stream<Item = watcher::Event<K>> + Send + 'static
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Default,
{
    let open = move |streaming: bool| {
        let config = if streaming {
            config.clone().streaming_lists()
        } else {
            config.clone()
        };
        watcher(api.clone(), config).default_backoff().boxed()
    };
    let streaming = !WATCH_LIST_REFUSED.load(Ordering::Relaxed);
    let start = (open(streaming), streaming, false, open);
    futures::stream::unfold(
        start,
        move |(mut stream, mut streaming, mut listed, open)| async move {
            loop {
                match stream.next().await? {
                    Ok(event) => {
                        listed |= matches!(event, watcher::Event::InitDone);
                        return Some((event, (stream, streaming, listed, open)));
                    }
                    Err(e) if streaming && !listed && refuses_watch_list(&e) => {
                        info!(error = %describe_watch(&e), "the API server does not stream lists (WatchList); listing {what} in pages");
                        WATCH_LIST_REFUSED.store(true, Ordering::Relaxed);
                        streaming = false;
                        stream = open(false);
                    }
                    Err(e) => {
                        // The watcher re-lists by itself (410 Gone included); worth a line only.
                        warn!(error = %describe_watch(&e), "watch of {what} failed; retrying with backoff")
                    }
                }
            }
        },
    )
}

/// Set once an API server refused a streaming list: the other watches list in pages at once.
static WATCH_LIST_REFUSED: AtomicBool = AtomicBool::new(false);

/// Whether `error` is an API server refusing `sendInitialEvents` (WatchList off, as by default in
/// Kubernetes 1.33, or a server older than 1.27): 422 Invalid, or 400 from some proxies.
fn refuses_watch_list(error: &watcher::Error) -> bool {
    let code = match error {
        watcher::Error::WatchStartFailed(kube::Error::Api(status)) => status.code,
        watcher::Error::WatchError(status) => status.code,
        _ => return false,
    };
    matches!(code, 400 | 422)
}

/// Applies `shape` to one watcher event: a kept object passes (possibly slimmed), an update that
/// is no longer kept becomes a removal, an initial object that is not kept is dropped.
fn scope_event<K, F>(event: watcher::Event<K>, shape: &F) -> Option<watcher::Event<K>>
where
    F: Fn(&mut K) -> bool,
{
    match event {
        watcher::Event::Apply(mut obj) => Some(if shape(&mut obj) {
            watcher::Event::Apply(obj)
        } else {
            watcher::Event::Delete(obj)
        }),
        watcher::Event::InitApply(mut obj) => {
            shape(&mut obj).then_some(watcher::Event::InitApply(obj))
        }
        other => Some(other),
    }
}

/// One watcher event with its object turned into the cached type.
fn convert<K, S: From<K>>(event: watcher::Event<K>) -> watcher::Event<S> {
    match event {
        watcher::Event::Apply(obj) => watcher::Event::Apply(obj.into()),
        watcher::Event::Delete(obj) => watcher::Event::Delete(obj.into()),
        watcher::Event::InitApply(obj) => watcher::Event::InitApply(obj.into()),
        watcher::Event::Init => watcher::Event::Init,
        watcher::Event::InitDone => watcher::Event::InitDone,
    }
}

#[cfg(test)]
#[path = "watch_tests.rs"]
mod tests;
