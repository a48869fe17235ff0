//! The cache of the numerous kinds (claims, PVs): [`Lean`] entries in one hash set keyed by
//! `namespace/name`, filled from a watch as kube-runtime's reflector fills its store.
//!
//! Why not kube-runtime's `Store`: it keys each object by an `ObjectRef` (four owned strings,
//! ~100 bytes inline) beside an object that must carry a full `ObjectMeta` (~330 bytes inline), so
//! at 10,000 PV/PVC pairs the keys and metadata outweighed the packed objects. Here an entry is
//! one pointer in the table; the key is a slice of the entry's own identifiers.

use std::borrow::Borrow;
use std::collections::HashSet;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, RwLock};

use kube::runtime::watcher;
use tokio::sync::watch;

use crate::k8s::lean::Lean;

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
    /// The object under `key` (see [`crate::k8s::lean::key`]).
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
