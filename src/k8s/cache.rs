//! The cache of the numerous kinds (claims, PVs): [`Lean`] entries in one hash set keyed by
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
//! dropped: `full` returns the object as it was cached (after [`crate::k8s::watch::strip`]).

use std::borrow::Borrow;
use std::collections::HashSet;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::marker::PhantomData;
use std::sync::{Arc, RwLock};

use kube::Resource;
use kube::runtime::watcher;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::sync::watch;
use tracing::error;

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

#[cfg(test)]
#[path = "cache_tests.rs"]
mod tests;
