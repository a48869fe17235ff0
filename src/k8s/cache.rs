//! Watches and the caches the controllers read from (lean caches, scoped selectors, indexes): one
//! concept, "what the cluster holds", kept from one watch per kind.
//!
//! **The watches.** Each resource is watched once: one task keeps its cache, and every controller that asked for
//! one gets its own stream of changed objects fed by the same watch, so two controllers reading PVCs
//! cost one watch and one cache. Objects are stripped of `managedFields` and the last-applied
//! annotation before they are cached: nothing here reads them (but a PV's phase time, taken first
//! where the API server is older than 1.29), and they are often the largest part of an object.
//!
//! The fan-out is ours rather than kube-runtime's `ReflectHandle`, which looks each change up in
//! the store again and, when the object left it meanwhile (common in mass deletions), returns
//! `Pending` without a wake-up, stalling the controller and then the watch. Here each subscriber
//! gets the object itself through a [`Lane`] the watch never waits on.
//!
//! The initial list is a streaming list (one watch with `sendInitialEvents`, as client-go does)
//! where the API server serves it, else pages of a list: on 10,000 claims that is one request
//! instead of twenty. PVs and claims are cached as [`Lean`] entries in a lean [`Cache`]; the few
//! small kinds (classes, nodes, CSINodes) in kube-runtime's `Store`.
//!
//! **The lean cache.** The cache of the numerous kinds (claims, PVs): [`Lean`] entries in one hash set keyed by
//! `namespace/name`, filled from a watch as kube-runtime's reflector fills its store.
//!
//! Why not kube-runtime's `Store`: it keys each object by an `ObjectRef` (four owned strings,
//! ~100 bytes inline) beside an object that must carry a full `ObjectMeta` (~330 bytes inline), so
//! at 10,000 PV/PVC pairs the keys and metadata outweighed the packed objects. Here an entry is
//! one pointer in the table; the key is a slice of the entry's own identifiers.
//!
//! An entry ([`Lean`]) is an object kept as compressed JSON plus the four identifiers every scan
//! and lookup reads, rebuilt into the typed object only when a controller looks at it.
//!
//! Why: a deserialised k8s-openapi `PersistentVolume` takes about 5.7 KB of heap (3.5 KB of it the
//! inline `Option` of every in-tree volume source, then a B-tree node per map), a claim about
//! 3.9 KB; the same objects as JSON take about 1.0 and 0.7 KB, and LZ4 against a dictionary of
//! typical PV and claim JSON ([`DICTIONARY`]) leaves 70 to 250 bytes, since most of those bytes are
//! key names and well-known strings. A cluster's PVs and claims are the sidecar's memory, while a
//! controller reads one object per reconcile, so the cache trades a few microseconds per read for
//! a several-fold smaller footprint. The identifiers (namespace, name, UID, resourceVersion) share
//! one allocation rather than an `ObjectMeta` (330 bytes inline) with a string each. Nothing is
//! dropped: `full` returns the object as it was cached (after [`strip`]).
//!
//! **The attachment index.** VolumeAttachments indexed by the PV they attach, kept from one watch:
//! the delete path asks "is this PV attached?" in O(1), and learns when the last attachment of a
//! PV goes.

use std::borrow::Borrow;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::{self, Debug};
use std::hash::{Hash, Hasher};
use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::PersistentVolume;
use k8s_openapi::api::storage::v1::VolumeAttachment;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tracing::{Instrument, debug, error, info, info_span, warn};

use crate::retry::describe_watch;

/// A cached object: its identifiers at hand (cache keys, scans that only ask "which objects
/// exist"), everything else as LZ4-compressed JSON.
pub(crate) struct Lean<K> {
    /// `namespace/name` (or `name` when cluster-scoped), then the UID, then the resourceVersion.
    ids: Box<str>,
    /// Byte lengths in `ids`: the namespace (0 when cluster-scoped), the key, the UID.
    namespace_len: u32,
    key_len: u32,
    uid_len: u32,
    rest: Box<[u8]>,
    kind: PhantomData<fn() -> K>,
}

/// The cache key of an object: `namespace/name`, or `name` when cluster-scoped (names and
/// namespaces cannot contain `/`, so keys never collide).
pub(crate) fn key(namespace: Option<&str>, name: &str) -> String {
    match namespace {
        Some(ns) if !ns.is_empty() => format!("{ns}/{name}"),
        _ => name.to_owned(),
    }
}

/// Length as stored; object names are at most 253 bytes, namespaces 63.
fn len32(s: &str) -> u32 {
    u32::try_from(s.len()).unwrap_or(u32::MAX)
}

impl<K> Lean<K>
where
    K: Resource + Serialize + DeserializeOwned + Default,
{
    /// Packs `obj`.
    pub(crate) fn new(mut obj: K) -> Self {
        let m = obj.meta_mut();
        let namespace = m.namespace.take().unwrap_or_default();
        let name = m.name.take().unwrap_or_default();
        let uid = m.uid.take().unwrap_or_default();
        let rv = m.resource_version.take().unwrap_or_default();
        let key = key(Some(&namespace), &name);
        let ids = [key.as_str(), &uid, &rv].concat().into_boxed_str();
        // Serialising a k8s-openapi object to a Vec cannot fail (no maps with non-string keys).
        let json = serde_json::to_vec(&obj).unwrap_or_default();
        let rest = lz4_flex::block::compress_prepend_size_with_dict(&json, DICTIONARY.as_bytes())
            .into_boxed_slice();
        Self {
            ids,
            namespace_len: len32(&namespace),
            key_len: len32(&key),
            uid_len: len32(&uid),
            rest,
            kind: PhantomData,
        }
    }

    /// Whether the cached JSON contains `needle` verbatim: a pre-filter that spares parsing an
    /// object a caller only wants when it carries some string (a finalizer, say). `false` is exact
    /// for needles JSON does not escape (no quotes, backslashes or control characters).
    pub(crate) fn mentions(&self, needle: &str) -> bool {
        lz4_flex::block::decompress_size_prepended_with_dict(&self.rest, DICTIONARY.as_bytes())
            .is_ok_and(|json| {
                needle.is_empty() || json.windows(needle.len()).any(|w| w == needle.as_bytes())
            })
    }

    /// The object as cached.
    pub(crate) fn full(&self) -> K {
        let json =
            lz4_flex::block::decompress_size_prepended_with_dict(&self.rest, DICTIONARY.as_bytes());
        let parsed = json
            .map_err(|e| e.to_string())
            .and_then(|json| serde_json::from_slice::<K>(&json).map_err(|e| e.to_string()));
        let mut obj = match parsed {
            Ok(obj) => obj,
            Err(e) => {
                // Unreachable in practice (the bytes were serialised from a K); an object without
                // spec makes every decision skip it rather than act on a guess.
                error!(name = %self.name(), error = %e, "cached object does not parse; treating it as empty");
                K::default()
            }
        };
        let m = obj.meta_mut();
        let some = |s: &str| (!s.is_empty()).then(|| s.to_owned());
        m.name = some(self.name());
        m.namespace = self.namespace().map(str::to_owned);
        m.uid = some(self.uid());
        m.resource_version = some(self.resource_version());
        obj
    }
}

impl<K> Lean<K> {
    /// The cache key: `namespace/name`, or `name` (see [`key`]).
    pub(crate) fn key(&self) -> &str {
        &self.ids[..self.key_len as usize]
    }

    /// The object's namespace; `None` when cluster-scoped.
    pub(crate) fn namespace(&self) -> Option<&str> {
        (self.namespace_len > 0).then(|| &self.ids[..self.namespace_len as usize])
    }

    /// The object's name.
    pub(crate) fn name(&self) -> &str {
        // After `namespace/` when there is a namespace.
        let start = self.namespace().map_or(0, |ns| ns.len() + 1);
        &self.ids[start..self.key_len as usize]
    }

    /// The object's UID (empty when it had none, as in hand-made test objects).
    pub(crate) fn uid(&self) -> &str {
        let start = self.key_len as usize;
        &self.ids[start..start + self.uid_len as usize]
    }

    /// The object's resourceVersion (empty when it had none).
    pub(crate) fn resource_version(&self) -> &str {
        &self.ids[(self.key_len + self.uid_len) as usize..]
    }
}

/// Typical PV and claim JSON (as packed: no name, namespace, UID or resourceVersion), the LZ4
/// dictionary every cached object is compressed against: most of a PV's bytes are key names and
/// well-known strings, so a bound PV packs into a quarter to a seventh of its JSON.
const DICTIONARY: &str = concat!(
    r#"{"apiVersion":"v1","kind":"PersistentVolume","metadata":{"annotations":{"pv.kubernetes.i"#,
    r#"o/provisioned-by":"csi.example.com","volume.kubernetes.io/provisioner-deletion-secret-na"#,
    r#"me":"","volume.kubernetes.io/provisioner-deletion-secret-namespace":""},"creationTimesta"#,
    r#"mp":"2026-01-01T00:00:00Z","finalizers":["external-provisioner.volume.kubernetes.io/fina"#,
    r#"lizer","kubernetes.io/pv-protection"],"labels":{"csi-provisioner.rs/driver":"csi.example"#,
    r#".com","csi-provisioner.rs/node":"node-1"}},"spec":{"accessModes":["ReadWriteOnce","ReadW"#,
    r#"riteOncePod","ReadOnlyMany","ReadWriteMany"],"capacity":{"storage":"10Gi"},"claimRef":{""#,
    r#"apiVersion":"v1","kind":"PersistentVolumeClaim","name":"data-0","namespace":"default","r"#,
    r#"esourceVersion":"1","uid":"00000000-0000-0000-0000-000000000000"},"csi":{"controllerExpa"#,
    r#"ndSecretRef":{"name":"","namespace":""},"driver":"csi.example.com","fsType":"ext4","node"#,
    r#"PublishSecretRef":{"name":"","namespace":""},"volumeAttributes":{"storage.kubernetes.io/"#,
    r#"csiProvisionerIdentity":"1700000000000-1234-csi.example.com"},"volumeHandle":"vol-0"},"m"#,
    r#"ountOptions":[],"nodeAffinity":{"required":{"nodeSelectorTerms":[{"matchExpressions":[{""#,
    r#"key":"topology.kubernetes.io/zone","operator":"In","values":["node-1"]},{"key":"kubernet"#,
    r#"es.io/hostname","operator":"In","values":["node-1"]}]}]}},"persistentVolumeReclaimPolicy"#,
    r#"":"Retain","storageClassName":"standard","volumeAttributesClassName":"","volumeMode":"Bl"#,
    r#"ock"},"status":{"lastPhaseTransitionTime":"2026-01-01T00:00:00Z","message":"","phase":"R"#,
    r#"eleased","reason":""}}{"apiVersion":"v1","kind":"PersistentVolumeClaim","metadata":{"ann"#,
    r#"otations":{"csi-provisioner.rs/provisioning-intent":"","volume.beta.kubernetes.io/storag"#,
    r#"e-class":"standard","volume.beta.kubernetes.io/storage-provisioner":"csi.example.com","v"#,
    r#"olume.kubernetes.io/selected-node":"node-1","volume.kubernetes.io/storage-provisioner":""#,
    r#"csi.example.com"},"creationTimestamp":"2026-01-01T00:00:00Z","deletionGracePeriodSeconds"#,
    r#"":0,"deletionTimestamp":"2026-01-01T00:00:00Z","finalizers":["kubernetes.io/pvc-protecti"#,
    r#"on","csi-provisioner.rs/provisioning-intent"],"labels":{"app":""}},"spec":{"accessModes""#,
    r#":["ReadWriteOnce"],"dataSource":{"apiGroup":"snapshot.storage.k8s.io","kind":"VolumeSnap"#,
    r#"shot","name":""},"dataSourceRef":{"apiGroup":"snapshot.storage.k8s.io","kind":"VolumeSna"#,
    r#"pshot","name":""},"resources":{"requests":{"storage":"1Gi"}},"selector":{"matchLabels":{"#,
    r#"}},"storageClassName":"standard","volumeMode":"Filesystem"},"status":{"phase":"Pending"}"#,
    r#"}{"apiVersion":"v1","kind":"PersistentVolumeClaim","metadata":{"annotations":{"pv.kubern"#,
    r#"etes.io/bind-completed":"yes","pv.kubernetes.io/bound-by-controller":"yes","volume.beta."#,
    r#"kubernetes.io/storage-provisioner":"csi.example.com","volume.kubernetes.io/storage-provi"#,
    r#"sioner":"csi.example.com"},"creationTimestamp":"2026-01-01T00:00:00Z","finalizers":["kub"#,
    r#"ernetes.io/pvc-protection"]},"spec":{"accessModes":["ReadWriteOnce"],"resources":{"reque"#,
    r#"sts":{"storage":"1Gi"}},"storageClassName":"standard","volumeMode":"Filesystem","volumeN"#,
    r#"ame":"pvc-00000000-0000-0000-0000-000000000000"},"status":{"accessModes":["ReadWriteOnce"#,
    r#""],"capacity":{"storage":"1Gi"},"phase":"Bound"}}{"apiVersion":"v1","kind":"PersistentVo"#,
    r#"lume","metadata":{"annotations":{"pv.kubernetes.io/provisioned-by":"csi.example.com","vo"#,
    r#"lume.kubernetes.io/provisioner-deletion-secret-name":"","volume.kubernetes.io/provisione"#,
    r#"r-deletion-secret-namespace":""},"creationTimestamp":"2026-01-01T00:00:00Z","finalizers""#,
    r#":["external-provisioner.volume.kubernetes.io/finalizer","kubernetes.io/pv-protection"]},"#,
    r#""spec":{"accessModes":["ReadWriteOnce"],"capacity":{"storage":"1Gi"},"claimRef":{"apiVer"#,
    r#"sion":"v1","kind":"PersistentVolumeClaim","name":"data-0","namespace":"default","resourc"#,
    r#"eVersion":"1","uid":"00000000-0000-0000-0000-000000000000"},"csi":{"driver":"csi.example"#,
    r#".com","volumeAttributes":{"topology.csi.example.com/node":"node-1","storage.kubernetes.i"#,
    r#"o/csiProvisionerIdentity":"1700000000000-1234-csi.example.com"},"volumeHandle":"vol-0"},"#,
    r#""persistentVolumeReclaimPolicy":"Delete","storageClassName":"standard","volumeMode":"Fil"#,
    r#"esystem"},"status":{"lastPhaseTransitionTime":"2026-01-01T00:00:00Z","phase":"Bound"}}"#,
);

impl<K> Clone for Lean<K> {
    fn clone(&self) -> Self {
        Self {
            ids: self.ids.clone(),
            namespace_len: self.namespace_len,
            key_len: self.key_len,
            uid_len: self.uid_len,
            rest: self.rest.clone(),
            kind: PhantomData,
        }
    }
}

impl<K> fmt::Debug for Lean<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lean")
            .field("key", &self.key())
            .field("bytes", &self.rest.len())
            .finish()
    }
}

impl<K> From<K> for Lean<K>
where
    K: Resource + Serialize + DeserializeOwned + Default,
{
    fn from(obj: K) -> Self {
        Self::new(obj)
    }
}

/// Read side of a lean cache; cheap to clone.
pub(crate) struct Cache<K> {
    entries: Arc<RwLock<HashSet<Keyed<K>>>>,
    ready: watch::Receiver<bool>,
}

impl<K> Clone for Cache<K> {
    fn clone(&self) -> Self {
        Self {
            entries: self.entries.clone(),
            ready: self.ready.clone(),
        }
    }
}

/// The watch that fills a cache stopped before its first list completed.
#[derive(Debug, thiserror::Error)]
#[error("the watch filling the cache stopped before its first list completed")]
pub(crate) struct CacheClosed;

impl<K> Cache<K> {
    /// The object under `key` (see [`key`]).
    pub(crate) fn get(&self, key: &str) -> Option<Arc<Lean<K>>> {
        let entries = crate::sync::read(&self.entries);
        entries.get(key).map(|e| e.0.clone())
    }

    /// Every cached object, in no particular order.
    pub(crate) fn state(&self) -> Vec<Arc<Lean<K>>> {
        let entries = crate::sync::read(&self.entries);
        entries.iter().map(|e| e.0.clone()).collect()
    }

    /// How many objects are cached.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        crate::sync::read(&self.entries).len()
    }

    /// Completes once the first list is in the cache.
    pub(crate) async fn wait_until_ready(&self) -> Result<(), CacheClosed> {
        let mut ready = self.ready.clone();
        ready
            .wait_for(|ready| *ready)
            .await
            .map(|_| ())
            .map_err(|_| CacheClosed)
    }

    /// A cache holding `objects`, ready: for tests of code that reads one.
    #[cfg(test)]
    pub(crate) fn of(objects: impl IntoIterator<Item = Lean<K>>) -> Self {
        let (cache, mut writer) = cache();
        writer.apply(watcher::Event::Init);
        for obj in objects {
            writer.apply(watcher::Event::InitApply(obj));
        }
        writer.apply(watcher::Event::InitDone);
        cache
    }
}

/// A new empty cache and the writer that fills it.
pub(crate) fn cache<K>() -> (Cache<K>, CacheWriter<K>) {
    let (ready_tx, ready) = watch::channel(false);
    let entries = Arc::new(RwLock::new(HashSet::new()));
    let cache = Cache {
        entries: entries.clone(),
        ready,
    };
    let writer = CacheWriter {
        entries,
        relist: None,
        ready: ready_tx,
    };
    (cache, writer)
}

/// Write side of a lean cache, owned by the task driving its watch.
pub(crate) struct CacheWriter<K> {
    entries: Arc<RwLock<HashSet<Keyed<K>>>>,
    /// The objects of a (re-)list in progress; they replace the cache's content once complete, so
    /// objects deleted while the watch was down leave it.
    relist: Option<HashSet<Keyed<K>>>,
    ready: watch::Sender<bool>,
}

impl<K> CacheWriter<K> {
    /// Applies one watcher event. Returns what changed for the controllers: the object of an
    /// update, or every object when a (re-)list completed.
    pub(crate) fn apply(&mut self, event: watcher::Event<Lean<K>>) -> Vec<Arc<Lean<K>>> {
        match event {
            watcher::Event::Apply(obj) => {
                let obj = Arc::new(obj);
                crate::sync::write(&self.entries).replace(Keyed(obj.clone()));
                vec![obj]
            }
            watcher::Event::Delete(obj) => {
                crate::sync::write(&self.entries).remove(obj.key());
                Vec::new()
            }
            watcher::Event::Init => {
                self.relist = Some(HashSet::new());
                Vec::new()
            }
            watcher::Event::InitApply(obj) => {
                self.relist
                    .get_or_insert_with(HashSet::new)
                    .replace(Keyed(Arc::new(obj)));
                Vec::new()
            }
            watcher::Event::InitDone => {
                let listed = self.relist.take().unwrap_or_default();
                let all = listed.iter().map(|e| e.0.clone()).collect();
                *crate::sync::write(&self.entries) = listed;
                self.ready.send_replace(true);
                all
            }
        }
    }
}

/// One cached object, hashed and compared by its key so the set can be searched by key.
struct Keyed<K>(Arc<Lean<K>>);

impl<K> Hash for Keyed<K> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.0.key().hash(state);
    }
}

impl<K> PartialEq for Keyed<K> {
    fn eq(&self, other: &Self) -> bool {
        self.0.key() == other.0.key()
    }
}

impl<K> Eq for Keyed<K> {}

impl<K> Borrow<str> for Keyed<K> {
    fn borrow(&self) -> &str {
        self.0.key()
    }
}

/// Changes queued per subscriber in order; past this, a reader that lags gets each object's latest
/// version in place of an older one still queued ([`Lane`]).
const SHARED_BUFFER: usize = 1024;

/// Annotation `kubectl apply` writes; a full copy of the object we never read.
const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// A watched resource: its cache (`R`: kube-runtime's store, or a lean [`Cache`]) and one change
/// stream per controller that asked for one.
pub(crate) struct Watched<S, R = Store<S>> {
    /// Read side of the cache.
    pub(crate) store: R,
    /// One per controller that asked; fed from its first read (`subscribe`).
    streams: Vec<Arc<Lane<S>>>,
    /// The task driving the watch.
    #[allow(
        dead_code,
        reason = "the handle of a task that runs for the life of the process; tests abort it"
    )]
    pub(crate) task: JoinHandle<()>,
}

/// A watched kind cached as [`Lean`] entries.
pub(crate) type WatchedLean<K> = Watched<Lean<K>, Cache<K>>;

impl<S, R> Watched<S, R>
where
    S: Send + Sync + 'static,
    R: Contents<S> + Clone + Send + 'static,
{
    /// Takes one of the change streams asked for in [`watch_shared`] (a [`Lane`]).
    ///
    /// # Panics
    /// When more streams are taken than were asked for (a wiring bug caught at start-up).
    pub(crate) fn subscribe(&mut self) -> impl Stream<Item = Arc<S>> + Send + 'static {
        let lane = self
            .streams
            .pop()
            .expect("more subscriptions taken than watch_shared was asked for");
        let store = self.store.clone();
        let taken = lane.clone();
        let contents = futures::stream::once(async move {
            // Fed first, read second: a change the watch applies meanwhile is in the contents,
            // or announced, or both (the cache's lock orders the two), never in neither.
            taken.taken.store(true, Ordering::SeqCst);
            futures::stream::iter(store.contents())
        });
        let changes = futures::stream::unfold(lane, |lane| async move {
            loop {
                // Read before the pop: a change queued just before the close is still yielded.
                let closed = lane.closed.load(Ordering::SeqCst);
                let next = crate::sync::lock(&lane.state).pop();
                match next {
                    Some(obj) => return Some((obj, lane)),
                    None if closed => return None,
                    // A permit stored by an announcement made since the pop wakes this at once.
                    None => lane.ready.notified().await,
                }
            }
        });
        // Each object spends the task's budget, so a reader of 10,000 yields to the other
        // controllers now and then.
        contents.flatten().chain(changes).then(|obj| async move {
            tokio::task::coop::consume_budget().await;
            obj
        })
    }
}

/// One controller's change stream, fed from its first read and starting with what the cache holds
/// then (around that moment an object may be announced twice, the last time as it is now), so a
/// controller that waits before it reads (a standby, or one waiting for leadership, another cache
/// or a LIST) stalls nothing. The watch never waits on it:
/// a controller that falls behind (awaiting requests while its stream goes unread) once stalled
/// the shared watch and every other controller. Up to [`SHARED_BUFFER`] changes queue in order;
/// past that, a change to an object still queued replaces that version in place (controllers act
/// on an object's latest state), so the queue holds at most the buffer plus one per object.
pub(crate) struct Lane<S> {
    state: std::sync::Mutex<Queued<S>>,
    ready: tokio::sync::Notify,
    /// Set on the stream's first read: until then the cache stands in for the announcements.
    taken: AtomicBool,
    /// The watch ended (shutdown, or a test aborting it): the stream ends once drained.
    closed: AtomicBool,
}

/// A lane's queue, with where each object's last queued version is.
struct Queued<S> {
    queue: std::collections::VecDeque<(Arc<str>, Arc<S>)>,
    /// Each queued key's last position, counted from the first object ever queued.
    last: HashMap<Arc<str>, u64>,
    /// How many objects left the queue: the front's position.
    popped: u64,
}

impl<S> Lane<S> {
    fn new() -> Self {
        Self {
            state: std::sync::Mutex::new(Queued {
                queue: std::collections::VecDeque::new(),
                last: HashMap::new(),
                popped: 0,
            }),
            ready: tokio::sync::Notify::new(),
            taken: AtomicBool::new(false),
            closed: AtomicBool::new(false),
        }
    }

    /// Queues `obj`, announced under `key`; `true` when that fills the ordered part of the queue.
    fn announce(&self, key: &Arc<str>, obj: &Arc<S>) -> bool {
        let full = crate::sync::lock(&self.state).push(key, obj.clone());
        self.ready.notify_one();
        full
    }
}

impl<S> Queued<S> {
    fn push(&mut self, key: &Arc<str>, obj: Arc<S>) -> bool {
        if self.queue.len() >= SHARED_BUFFER
            && let Some(at) = self.last.get(key)
        {
            let i = usize::try_from(at - self.popped).expect("a queued position");
            self.queue[i].1 = obj;
            return false;
        }
        let at = self.popped + self.queue.len() as u64;
        self.last.insert(key.clone(), at);
        self.queue.push_back((key.clone(), obj));
        self.queue.len() == SHARED_BUFFER
    }

    fn pop(&mut self) -> Option<Arc<S>> {
        let (key, obj) = self.queue.pop_front()?;
        if self.last.get(&key) == Some(&self.popped) {
            self.last.remove(&key);
        }
        self.popped += 1;
        Some(obj)
    }
}

/// What a cache holds, as its change streams announce it.
pub(crate) trait Contents<S> {
    /// Every cached object, in no particular order.
    fn contents(&self) -> Vec<Arc<S>>;
}

impl<S> Contents<S> for Store<S>
where
    S: Resource + Clone + 'static,
    S::DynamicType: Eq + Hash + Clone,
{
    fn contents(&self) -> Vec<Arc<S>> {
        self.state()
    }
}

impl<K> Contents<Lean<K>> for Cache<K> {
    fn contents(&self) -> Vec<Arc<Lean<K>>> {
        self.state()
    }
}

/// Where a watch puts what it sees: kube-runtime's store, or a lean [`Cache`].
trait Sink<S>: Send + 'static {
    /// Applies one event; returns the objects to announce to the controllers.
    fn apply(&mut self, event: watcher::Event<S>) -> Vec<Arc<S>>;
    /// The cache key an announced object is queued under.
    fn key_of(obj: &S) -> std::borrow::Cow<'_, str>;
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

    fn key_of(obj: &S) -> std::borrow::Cow<'_, str> {
        key(
            obj.meta().namespace.as_deref(),
            obj.meta().name.as_deref().unwrap_or(""),
        )
        .into()
    }
}

impl<K: 'static> Sink<Lean<K>> for CacheWriter<K> {
    fn apply(&mut self, event: watcher::Event<Lean<K>>) -> Vec<Arc<Lean<K>>> {
        CacheWriter::apply(self, event)
    }

    fn key_of(obj: &Lean<K>) -> std::borrow::Cow<'_, str> {
        obj.key().into()
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
    let streams: Vec<Arc<Lane<S>>> = (0..subscribers).map(|_| Arc::new(Lane::new())).collect();
    let lanes = Closing(streams.clone());
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
                    // A stream not read yet learns of this from the cache when it is; one no
                    // longer held (its controller stopped) needs nothing.
                    let mut told = lanes.0.iter().filter(|l| {
                        Arc::strong_count(l) > 1 && l.taken.load(Ordering::SeqCst)
                    });
                    let Some(first) = told.next() else { continue };
                    let key: Arc<str> = Arc::from(W::key_of(&obj));
                    for lane in std::iter::once(first).chain(told) {
                        if lane.announce(&key, &obj) {
                            warn!(resource = what, "a controller is {SHARED_BUFFER} changes behind; it now gets each object's latest version");
                        }
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

/// The watch's lanes, closed when its task ends (or is aborted), so their streams end too.
struct Closing<S>(Vec<Arc<Lane<S>>>);

impl<S> Drop for Closing<S> {
    fn drop(&mut self) {
        for lane in &self.0 {
            lane.closed.store(true, Ordering::SeqCst);
            lane.ready.notify_one();
        }
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

/// VolumeAttachments by the PV they attach, so the delete path asks "is this PV attached?" in O(1)
/// instead of scanning every attachment (upstream lists all of them on every delete).
#[derive(Clone, Default)]
pub(crate) struct AttachmentIndex {
    inner: Arc<RwLock<IndexState>>,
}

#[derive(Default)]
struct IndexState {
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
    pub(crate) fn attached_node(&self, pv: &str) -> Option<String> {
        let state = crate::sync::read(&self.inner);
        state
            .by_pv
            .get(pv)
            .and_then(|vas| vas.values().next().cloned())
    }

    /// Whether the initial list has been seen (before that, "not attached" is not known).
    pub(crate) fn is_ready(&self) -> bool {
        crate::sync::read(&self.inner).ready
    }

    /// Completes once the initial list has been seen.
    pub(crate) async fn wait_until_ready(&self) {
        // Start-up only, and the list usually arrives within a round trip: a short poll is
        // simpler than a notification channel that every index would carry for its lifetime.
        while !self.is_ready() {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    }

    /// Applies one watcher event.
    pub(crate) fn apply(&self, event: &watcher::Event<VolumeAttachment>) {
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
    pub(crate) fn detachments(&self) -> impl Stream<Item = String> + Send + 'static {
        let (tx, rx) = mpsc::unbounded_channel();
        crate::sync::write(&self.inner).detached = Some(tx);
        tokio_stream::wrappers::UnboundedReceiverStream::new(rx)
    }

    /// Starts the watch that keeps this index current.
    pub(crate) fn spawn(&self, api: Api<VolumeAttachment>) -> JoinHandle<()> {
        let index = self.clone();
        tokio::spawn(
            async move {
                let stream = watcher(api, watcher::Config::default()).default_backoff();
                futures::pin_mut!(stream);
                while let Some(event) = stream.next().await {
                    match event {
                        Ok(event) => index.apply(&event),
                        Err(e) => warn!(error = %describe_watch(&e), "watch of volumeattachments failed; retrying"),
                    }
                }
            }
            .instrument(info_span!("watch", resource = "volumeattachments")),
        )
    }
}

impl IndexState {
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
#[path = "cache_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "cache_attachments_tests.rs"]
mod attachments_tests;
