//! Watches and reflector stores the controllers read from (lean caches, scoped selectors, indexes).
//!
//! Each resource is watched once: a reflector keeps the store, and every controller that asked for
//! one gets its own stream of changed objects fed by the same watch, so two controllers reading PVCs
//! cost one watch and one cache. Objects are stripped of `managedFields` and the last-applied
//! annotation before they are cached: nothing here reads them, and they are often the largest part of
//! an object.
//!
//! The fan-out is ours rather than kube-runtime's `ReflectHandle`: that handle looks each change up
//! in the store again and, when the object left the store meanwhile (created then deleted, common in
//! mass deletions), returns `Pending` without arranging a wake-up, which stalls the controller and
//! then the watch. Here every subscriber receives the object itself, in order, with backpressure.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Debug;
use std::hash::Hash;
use std::sync::{Arc, RwLock};

use futures::{Stream, StreamExt};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::ReceiverStream;
use tracing::{Instrument, debug, info_span, warn};

/// Changes buffered per subscriber: how far a slow controller may lag before the watch waits.
const SHARED_BUFFER: usize = 1024;

/// Annotation `kubectl apply` writes; a full copy of the object we never read.
const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// A watched resource: its store and one change stream per controller that asked for one.
pub struct Watched<K>
where
    K: Resource + Clone + 'static,
    K::DynamicType: Eq + Hash + Clone,
{
    /// Read side of the cache.
    pub store: Store<K>,
    // Every stream must be consumed by its controller: an idle subscriber fills its buffer and then
    // stalls the watch, so exactly as many are made as are asked for.
    streams: Vec<ReceiverStream<Arc<K>>>,
    /// The task driving the watch.
    pub task: JoinHandle<()>,
}

impl<K> Watched<K>
where
    K: Resource + Clone + Send + Sync + 'static,
    K::DynamicType: Eq + Hash + Clone + Default,
{
    /// Takes one of the change streams asked for in [`watch_shared`].
    ///
    /// # Panics
    /// When more streams are taken than were asked for (a wiring bug caught at start-up).
    pub fn subscribe(&mut self) -> impl Stream<Item = Arc<K>> + Send + 'static {
        self.streams
            .pop()
            .expect("more subscriptions taken than watch_shared was asked for")
    }
}

/// Ticks every `period`, first after one period: a controller's periodic re-check of every object
/// (upstream's resync), for changes a watch cannot announce.
pub fn resync_every(period: std::time::Duration) -> impl Stream<Item = ()> + Send + 'static {
    let mut interval = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tokio_stream::wrappers::IntervalStream::new(interval).map(|_| ())
}

/// Runs `task` at every [`resync_every`] tick until the returned handle is aborted: the
/// house-keeping of a controller's in-memory state (forgetting objects that are gone).
pub fn spawn_every(
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
pub fn departures(
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
pub fn strip<K: Resource>(obj: &mut K) {
    let meta = obj.meta_mut();
    meta.managed_fields = None;
    if let Some(ann) = meta.annotations.as_mut() {
        ann.remove(LAST_APPLIED);
    }
}

/// Starts a shared, stripped, auto-retrying watch of `api` with `subscribers` change streams.
pub fn watch_shared<K>(
    api: Api<K>,
    config: watcher::Config,
    what: &'static str,
    subscribers: usize,
) -> Watched<K>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Eq + Hash + Clone + Default,
{
    watch_shared_scoped(api, config, what, subscribers, |_| true)
}

/// Like [`watch_shared`], but `shape` runs on every object after [`strip`]: it may strip more, and
/// returns whether the object is kept. Objects not kept never enter the store (an update that makes
/// a cached object uninteresting removes it), so memory follows what the controllers act on, not
/// what the API server sends (node-deployment scoping, `node::scope`). Subscribers are not told
/// about removals made this way, as for deletions.
pub fn watch_shared_scoped<K, F>(
    api: Api<K>,
    config: watcher::Config,
    what: &'static str,
    subscribers: usize,
    shape: F,
) -> Watched<K>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Eq + Hash + Clone + Default,
    F: Fn(&mut K) -> bool + Send + Sync + 'static,
{
    let (store, mut writer) = reflector::store();
    let (senders, streams): (Vec<_>, Vec<_>) = (0..subscribers)
        .map(|_| {
            let (tx, rx) = mpsc::channel(SHARED_BUFFER);
            (tx, ReceiverStream::new(rx))
        })
        .unzip();
    let stream = watcher(api, config).default_backoff().modify(strip::<K>);
    let reader = store.clone();
    let task = tokio::spawn(
        async move {
            futures::pin_mut!(stream);
            while let Some(event) = stream.next().await {
                let event = match event {
                    Ok(event) => event,
                    Err(e) => {
                        // The watcher re-lists by itself (410 Gone included); worth a line only.
                        warn!(error = %e, "watch of {what} failed; retrying with backoff");
                        continue;
                    }
                };
                let Some(event) = scope_event(event, &shape) else {
                    continue;
                };
                // The store first, so a controller woken by the change finds it there.
                writer.apply_watcher_event(&event);
                // Objects of a (re-)list are announced once the list is complete and in the store,
                // as kube-runtime does: announcing them one by one could fill the buffers before
                // the first list completes, while the controllers wait for exactly that to start.
                let changed: Vec<Arc<K>> = match &event {
                    watcher::Event::Apply(obj) => vec![Arc::new(obj.clone())],
                    watcher::Event::InitDone => reader.state(),
                    _ => continue,
                };
                for obj in changed {
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

/// VolumeAttachments by the PV they attach, so the delete path asks "is this PV attached?" in O(1)
/// instead of scanning every attachment (upstream lists all of them on every delete).
#[derive(Clone, Default)]
pub struct AttachmentIndex {
    inner: Arc<RwLock<AttachmentState>>,
}

#[derive(Default)]
struct AttachmentState {
    /// PV name -> (VolumeAttachment name -> node name).
    by_pv: HashMap<String, BTreeMap<String, String>>,
    /// VolumeAttachment name -> PV name, to undo an entry when the attachment changes or goes.
    pv_of: HashMap<String, String>,
    /// Entries collected during a re-list, swapped in atomically when it completes.
    relist: Option<Vec<(String, String, String)>>,
    ready: bool,
    /// Told the name of every PV whose last attachment went away ([`AttachmentIndex::detachments`]).
    detached: Option<mpsc::UnboundedSender<String>>,
}

impl AttachmentIndex {
    /// The node of one attachment naming `pv`, if any exists.
    pub fn attached_node(&self, pv: &str) -> Option<String> {
        let state = crate::sync::read(&self.inner);
        state
            .by_pv
            .get(pv)
            .and_then(|vas| vas.values().next().cloned())
    }

    /// Whether the initial list has been seen (before that, "not attached" is not known).
    pub fn is_ready(&self) -> bool {
        crate::sync::read(&self.inner).ready
    }

    /// Completes once the initial list has been seen.
    pub async fn wait_until_ready(&self) {
        // Start-up only, and the list usually arrives within a round trip: a short poll is
        // simpler than a notification channel that every index would carry for its lifetime.
        while !self.is_ready() {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    }

    /// Applies one watcher event.
    pub fn apply(&self, event: &watcher::Event<VolumeAttachment>) {
        let mut state = crate::sync::write(&self.inner);
        match event {
            watcher::Event::Init => state.relist = Some(Vec::new()),
            watcher::Event::InitApply(va) => {
                if let (Some(list), Some(entry)) = (state.relist.as_mut(), entry_of(va)) {
                    list.push(entry);
                }
            }
            watcher::Event::InitDone => {
                let entries = state.relist.take().unwrap_or_default();
                let before: Vec<String> = state.by_pv.keys().cloned().collect();
                state.by_pv.clear();
                state.pv_of.clear();
                for (va, pv, node) in entries {
                    state.insert(va, pv, node);
                }
                state.ready = true;
                // Attachments deleted while the watch was down.
                for pv in before {
                    if !state.by_pv.contains_key(&pv) {
                        state.announce(pv);
                    }
                }
            }
            watcher::Event::Apply(va) => {
                let name = va.name_any();
                let known = state.pv_of.contains_key(&name);
                let freed = state.remove(&name);
                if let Some((va, pv, node)) = entry_of(va) {
                    if !known {
                        // Tests (and operators reading -v=5) wait on this before a deletion that
                        // must find the volume attached.
                        debug!(va = %va, pv = %pv, node = %node, "volume attachment observed");
                    }
                    state.insert(va, pv, node);
                }
                if let Some(pv) = freed.filter(|pv| !state.by_pv.contains_key(pv)) {
                    state.announce(pv);
                }
            }
            watcher::Event::Delete(va) => {
                if let Some(pv) = state.remove(&va.name_any()) {
                    state.announce(pv);
                }
            }
        }
    }

    /// Names of PVs as their last VolumeAttachment goes away, so a deletion waiting for the detach
    /// goes on at once instead of at its next retry. One consumer: a new call replaces the last.
    pub fn detachments(&self) -> impl Stream<Item = String> + Send + 'static {
        let (tx, rx) = mpsc::unbounded_channel();
        crate::sync::write(&self.inner).detached = Some(tx);
        tokio_stream::wrappers::UnboundedReceiverStream::new(rx)
    }

    /// Starts the watch that keeps this index current.
    pub fn spawn(&self, api: Api<VolumeAttachment>) -> JoinHandle<()> {
        let index = self.clone();
        tokio::spawn(
            async move {
                let stream = watcher(api, watcher::Config::default()).default_backoff();
                futures::pin_mut!(stream);
                while let Some(event) = stream.next().await {
                    match event {
                        Ok(event) => index.apply(&event),
                        Err(e) => warn!(error = %e, "watch of volumeattachments failed; retrying"),
                    }
                }
            }
            .instrument(info_span!("watch", resource = "volumeattachments")),
        )
    }
}

impl AttachmentState {
    fn insert(&mut self, va: String, pv: String, node: String) {
        self.by_pv
            .entry(pv.clone())
            .or_default()
            .insert(va.clone(), node);
        self.pv_of.insert(va, pv);
    }

    /// Removes attachment `va`; returns its PV when that was the PV's last attachment.
    fn remove(&mut self, va: &str) -> Option<String> {
        let pv = self.pv_of.remove(va)?;
        let vas = self.by_pv.get_mut(&pv)?;
        vas.remove(va);
        if !vas.is_empty() {
            return None;
        }
        self.by_pv.remove(&pv);
        Some(pv)
    }

    fn announce(&self, pv: String) {
        if let Some(tx) = &self.detached {
            // A closed receiver means the reclaim controller stopped: nothing to tell.
            let _ = tx.send(pv);
        }
    }
}

fn entry_of(va: &VolumeAttachment) -> Option<(String, String, String)> {
    let pv = va.spec.source.persistent_volume_name.clone()?;
    Some((va.name_any(), pv, va.spec.node_name.clone()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::storage::v1::{VolumeAttachmentSource, VolumeAttachmentSpec};
    use kube::api::ObjectMeta;

    #[tokio::test]
    async fn departures_name_each_member_that_left_the_set_once() {
        let names = |list: &[&str]| list.iter().map(|s| (*s).to_owned()).collect::<HashSet<_>>();
        let set = Arc::new(std::sync::Mutex::new(names(&["a", "b"])));
        let shared = set.clone();
        let stream = departures(std::time::Duration::from_millis(5), move || {
            shared.lock().unwrap().clone()
        });
        futures::pin_mut!(stream);
        let deadline = std::time::Duration::from_secs(10);

        // b goes and c comes: only b is reported.
        *set.lock().unwrap() = names(&["a", "c"]);
        let left = tokio::time::timeout(deadline, stream.next()).await.unwrap();
        assert_eq!(left, Some(vec!["b".to_owned()]));
        // b coming back is no departure; a going is, and only once.
        *set.lock().unwrap() = names(&["b", "c"]);
        let left = tokio::time::timeout(deadline, stream.next()).await.unwrap();
        assert_eq!(left, Some(vec!["a".to_owned()]));
    }

    fn va(name: &str, pv: &str, node: &str) -> VolumeAttachment {
        VolumeAttachment {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            spec: VolumeAttachmentSpec {
                attacher: "drv".into(),
                node_name: node.into(),
                source: VolumeAttachmentSource {
                    persistent_volume_name: Some(pv.into()),
                    ..Default::default()
                },
            },
            status: None,
        }
    }

    #[test]
    fn attachment_index_follows_applies_deletes_and_relists() {
        let index = AttachmentIndex::default();
        assert!(!index.is_ready());
        index.apply(&watcher::Event::Init);
        index.apply(&watcher::Event::InitApply(va("a1", "pv1", "n1")));
        index.apply(&watcher::Event::InitDone);
        assert!(index.is_ready());
        assert_eq!(index.attached_node("pv1").as_deref(), Some("n1"));
        assert_eq!(index.attached_node("pv2"), None);

        // An attachment re-pointed at another PV leaves no stale entry behind.
        index.apply(&watcher::Event::Apply(va("a1", "pv2", "n2")));
        assert_eq!(index.attached_node("pv1"), None);
        assert_eq!(index.attached_node("pv2").as_deref(), Some("n2"));

        index.apply(&watcher::Event::Delete(va("a1", "pv2", "n2")));
        assert_eq!(index.attached_node("pv2"), None);

        // A re-list replaces the whole index, dropping attachments deleted while disconnected.
        index.apply(&watcher::Event::Apply(va("a3", "pv3", "n3")));
        index.apply(&watcher::Event::Init);
        index.apply(&watcher::Event::InitApply(va("a4", "pv4", "n4")));
        assert_eq!(index.attached_node("pv3").as_deref(), Some("n3"));
        index.apply(&watcher::Event::InitDone);
        assert_eq!(index.attached_node("pv3"), None);
        assert_eq!(index.attached_node("pv4").as_deref(), Some("n4"));
    }

    #[test]
    fn scoping_drops_uninteresting_objects_and_turns_updates_that_leave_the_scope_into_removals() {
        let keep_pv1 = |va: &mut VolumeAttachment| {
            va.spec.source.persistent_volume_name.as_deref() == Some("pv1")
        };
        let kept = scope_event(watcher::Event::InitApply(va("a", "pv1", "n")), &keep_pv1);
        assert!(matches!(kept, Some(watcher::Event::InitApply(_))));
        assert!(scope_event(watcher::Event::InitApply(va("b", "pv2", "n")), &keep_pv1).is_none());
        let left = scope_event(watcher::Event::Apply(va("a", "pv2", "n")), &keep_pv1);
        assert!(matches!(left, Some(watcher::Event::Delete(_))));
        assert!(matches!(
            scope_event(watcher::Event::Apply(va("a", "pv1", "n")), &keep_pv1),
            Some(watcher::Event::Apply(_))
        ));
    }

    #[tokio::test]
    async fn detachments_name_each_pv_whose_last_attachment_goes() {
        let index = AttachmentIndex::default();
        let mut detached = index.detachments();
        index.apply(&watcher::Event::Init);
        index.apply(&watcher::Event::InitApply(va("a1", "pv1", "n1")));
        index.apply(&watcher::Event::InitApply(va("a2", "pv1", "n2")));
        index.apply(&watcher::Event::InitApply(va("a3", "pv3", "n1")));
        index.apply(&watcher::Event::InitDone);
        // pv1 keeps one attachment: not announced yet.
        index.apply(&watcher::Event::Delete(va("a1", "pv1", "n1")));
        index.apply(&watcher::Event::Delete(va("a2", "pv1", "n2")));
        assert_eq!(detached.next().await.as_deref(), Some("pv1"));
        // pv3's attachment disappears during a re-list.
        index.apply(&watcher::Event::Init);
        index.apply(&watcher::Event::InitDone);
        assert_eq!(detached.next().await.as_deref(), Some("pv3"));
        assert!(futures::FutureExt::now_or_never(detached.next()).is_none());
    }

    #[test]
    fn strip_drops_managed_fields_and_last_applied_but_keeps_other_annotations() {
        let mut v = va("a", "pv", "n");
        v.metadata.managed_fields = Some(vec![Default::default()]);
        v.metadata.annotations = Some(
            [
                (LAST_APPLIED.to_string(), "{}".to_string()),
                ("keep".to_string(), "me".to_string()),
            ]
            .into(),
        );
        strip(&mut v);
        assert!(v.metadata.managed_fields.is_none());
        let ann = v.metadata.annotations.unwrap();
        assert_eq!(ann.len(), 1);
        assert_eq!(ann["keep"], "me");
    }

    #[tokio::test]
    async fn a_first_list_larger_than_the_buffers_completes_before_anyone_reads_the_changes() {
        use k8s_openapi::api::core::v1::Secret;
        let sim = kube_sim::Sim::start(kube_sim::SimConfig::bare())
            .await
            .unwrap();
        let secrets: Api<Secret> = Api::namespaced(sim.client(), "default");
        let count = SHARED_BUFFER + 50;
        for i in 0..count {
            let secret = Secret {
                metadata: ObjectMeta {
                    name: Some(format!("s-{i}")),
                    ..Default::default()
                },
                ..Default::default()
            };
            sim.create(
                "",
                "secrets",
                "default",
                serde_json::to_value(&secret).unwrap(),
            )
            .unwrap();
        }
        let mut watched = watch_shared(secrets, watcher::Config::default(), "secrets", 1);
        // The controllers start only once the caches are filled, so nothing reads the stream yet.
        tokio::time::timeout(
            std::time::Duration::from_secs(30),
            watched.store.wait_until_ready(),
        )
        .await
        .expect("the first list completes although nobody reads the changes yet")
        .unwrap();
        let changes = watched.subscribe();
        let seen = changes.take(count).count();
        let seen = tokio::time::timeout(std::time::Duration::from_secs(30), seen)
            .await
            .expect("every listed object is announced");
        assert_eq!(seen, count);
        watched.task.abort();
    }
}
