//! The object store: objects keyed by (storage, namespace, name), one cluster-wide
//! resourceVersion, per-resource event history for watch resume, and the open watches.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;

use serde_json::Value;
use tokio::sync::mpsc;

/// What happened to an object, as a watch stream names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    Added,
    Modified,
    Deleted,
}

/// One committed change. `prev` lets selector-filtered watches turn a change that leaves
/// the selection into DELETED and one that enters it into ADDED, as the real server does.
#[derive(Debug)]
pub struct Record {
    pub rv: u64,
    pub storage: &'static str,
    pub kind: EventType,
    pub obj: Arc<Value>,
    pub prev: Option<Arc<Value>>,
}

/// What a watch stream receives, in commit order.
#[derive(Debug, Clone)]
pub enum WatchItem {
    Event(Arc<Record>),
    /// Synthetic ADDED for the initial state of a watch started without a resourceVersion.
    Initial(Arc<Value>),
    /// A bookmark at this resourceVersion; `initial_end` marks the end of sendInitialEvents.
    Bookmark {
        rv: u64,
        initial_end: bool,
    },
}

struct Watcher {
    storage: &'static str,
    bookmarks: bool,
    tx: mpsc::UnboundedSender<WatchItem>,
}

#[derive(Default)]
struct History {
    events: VecDeque<Arc<Record>>,
    /// Resuming from a resourceVersion below this is answered with 410 Gone.
    floor: u64,
}

/// Why a watch could not start from the requested resourceVersion.
#[derive(Debug)]
pub struct TooOld {
    pub requested: u64,
    pub oldest: u64,
}

pub type Key = (String, String);

pub struct Store {
    rv: u64,
    objects: HashMap<&'static str, BTreeMap<Key, Arc<Value>>>,
    history: HashMap<&'static str, History>,
    history_window: usize,
    watchers: Vec<Watcher>,
    /// Controllers' feed of committed changes.
    changes: Option<mpsc::UnboundedSender<Arc<Record>>>,
    /// For the fault suite's "no volume deleted while its claim exists" check: the claim UID each
    /// CSI volume handle's PV named, and when each claim UID was removed (Unix ms).
    pub volume_claims: BTreeMap<String, String>,
    pub claim_removals: BTreeMap<String, u64>,
    /// The last reclaim policy each CSI volume handle's PV had (the crash-point suite's "a
    /// Retain volume is never deleted").
    pub volume_policies: BTreeMap<String, String>,
}

impl Store {
    pub fn new(history_window: usize) -> Self {
        Self {
            rv: 1,
            objects: HashMap::new(),
            history: HashMap::new(),
            history_window: history_window.max(1),
            watchers: Vec::new(),
            changes: None,
            volume_claims: BTreeMap::new(),
            claim_removals: BTreeMap::new(),
            volume_policies: BTreeMap::new(),
        }
    }

    pub fn set_change_feed(&mut self, tx: mpsc::UnboundedSender<Arc<Record>>) {
        self.changes = Some(tx);
    }

    pub fn resource_version(&self) -> u64 {
        self.rv
    }

    pub fn get(&self, storage: &str, ns: &str, name: &str) -> Option<Arc<Value>> {
        self.objects
            .get(storage)
            .and_then(|m| m.get(&(ns.to_string(), name.to_string())))
            .cloned()
    }

    /// Objects of one storage key, in (namespace, name) order; `ns` narrows to a namespace.
    pub fn list(&self, storage: &str, ns: Option<&str>) -> Vec<Arc<Value>> {
        let Some(m) = self.objects.get(storage) else {
            return Vec::new();
        };
        match ns {
            Some(ns) => m
                .range((ns.to_string(), String::new())..)
                .take_while(|((n, _), _)| n == ns)
                .map(|(_, v)| v.clone())
                .collect(),
            None => m.values().cloned().collect(),
        }
    }

    pub fn storages(&self) -> Vec<&'static str> {
        let mut v: Vec<_> = self.objects.keys().copied().collect();
        v.sort_unstable();
        v
    }

    /// Writes `new` (or removes the object when `None`), stamping a fresh resourceVersion
    /// and fanning the change out to history, watches and controllers.
    pub fn commit(
        &mut self,
        storage: &'static str,
        ns: &str,
        name: &str,
        new: Option<Value>,
    ) -> Arc<Value> {
        self.rv += 1;
        let rv = self.rv;
        let key = (ns.to_string(), name.to_string());
        let map = self.objects.entry(storage).or_default();
        let prev = map.get(&key).cloned();
        let (kind, obj) = match new {
            Some(mut v) => {
                set_rv(&mut v, rv);
                let obj = Arc::new(v);
                map.insert(key, obj.clone());
                let kind = if prev.is_some() {
                    EventType::Modified
                } else {
                    EventType::Added
                };
                (kind, obj)
            }
            None => {
                map.remove(&key);
                let mut last = prev.as_deref().cloned().unwrap_or(Value::Null);
                set_rv(&mut last, rv);
                (EventType::Deleted, Arc::new(last))
            }
        };
        self.record_claims(storage, kind, &obj);
        let rec = Arc::new(Record {
            rv,
            storage,
            kind,
            obj: obj.clone(),
            prev,
        });
        let window = self.history_window;
        let h = self.history.entry(storage).or_default();
        h.events.push_back(rec.clone());
        while h.events.len() > window {
            if let Some(old) = h.events.pop_front() {
                h.floor = old.rv;
            }
        }
        self.watchers
            .retain(|w| w.storage != storage || w.tx.send(WatchItem::Event(rec.clone())).is_ok());
        if let Some(tx) = &self.changes {
            let _ = tx.send(rec);
        }
        obj
    }

    fn record_claims(&mut self, storage: &str, kind: EventType, obj: &Value) {
        match (storage, kind) {
            ("persistentvolumes", EventType::Added | EventType::Modified) => {
                let handle = obj
                    .pointer("/spec/csi/volumeHandle")
                    .and_then(Value::as_str);
                let uid = obj.pointer("/spec/claimRef/uid").and_then(Value::as_str);
                if let (Some(handle), Some(uid)) = (handle, uid) {
                    self.volume_claims.insert(handle.to_owned(), uid.to_owned());
                }
                let policy = obj
                    .pointer("/spec/persistentVolumeReclaimPolicy")
                    .and_then(Value::as_str);
                if let (Some(handle), Some(policy)) = (handle, policy) {
                    self.volume_policies
                        .insert(handle.to_owned(), policy.to_owned());
                }
            }
            ("persistentvolumeclaims", EventType::Deleted) => {
                if let Some(uid) = obj.pointer("/metadata/uid").and_then(Value::as_str) {
                    let ms = std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map_or(0, |d| d.as_millis() as u64);
                    self.claim_removals.insert(uid.to_owned(), ms);
                }
            }
            _ => {}
        }
    }

    /// Registers a watch. With `from = None` the current objects are sent first as
    /// synthetic ADDED events; otherwise history after `from` is replayed.
    pub fn watch(
        &mut self,
        storage: &'static str,
        from: Option<u64>,
        bookmarks: bool,
        initial_end_bookmark: bool,
    ) -> Result<mpsc::UnboundedReceiver<WatchItem>, TooOld> {
        let (tx, rx) = mpsc::unbounded_channel();
        match from {
            None => {
                for obj in self.list(storage, None) {
                    let _ = tx.send(WatchItem::Initial(obj));
                }
                if initial_end_bookmark {
                    let _ = tx.send(WatchItem::Bookmark {
                        rv: self.rv,
                        initial_end: true,
                    });
                }
            }
            Some(from) => {
                let h = self.history.entry(storage).or_default();
                if from < h.floor {
                    return Err(TooOld {
                        requested: from,
                        oldest: h.floor,
                    });
                }
                for rec in h.events.iter().filter(|r| r.rv > from) {
                    let _ = tx.send(WatchItem::Event(rec.clone()));
                }
            }
        }
        self.watchers.push(Watcher {
            storage,
            bookmarks,
            tx,
        });
        Ok(rx)
    }

    /// The objects of `storage` as they were at resourceVersion `at`, rebuilt by undoing the
    /// history after it; `None` when `at` is older than the history kept (or in the future).
    pub fn snapshot(&self, storage: &str, at: u64) -> Option<BTreeMap<Key, Arc<Value>>> {
        if at > self.rv || at < self.history_floor(storage) {
            return None;
        }
        let mut objects = self.objects.get(storage).cloned().unwrap_or_default();
        if let Some(h) = self.history.get(storage) {
            for rec in h.events.iter().rev().take_while(|r| r.rv > at) {
                let src = rec.prev.as_deref().unwrap_or(&rec.obj);
                let key = (
                    src.pointer("/metadata/namespace")
                        .and_then(Value::as_str)
                        .unwrap_or("")
                        .to_string(),
                    src.pointer("/metadata/name")
                        .and_then(Value::as_str)
                        .unwrap_or("")
                        .to_string(),
                );
                match &rec.prev {
                    Some(prev) => {
                        objects.insert(key, prev.clone());
                    }
                    None => {
                        objects.remove(&key);
                    }
                }
            }
        }
        Some(objects)
    }

    /// Whether a list/continue at `rv` can still be served consistently for `storage`.
    pub fn history_floor(&self, storage: &str) -> u64 {
        self.history.get(storage).map_or(0, |h| h.floor)
    }

    /// Sends a bookmark at the current resourceVersion to every watch that asked for them.
    pub fn send_bookmarks(&mut self) {
        let rv = self.rv;
        self.watchers.retain(|w| {
            !w.bookmarks
                || w.tx
                    .send(WatchItem::Bookmark {
                        rv,
                        initial_end: false,
                    })
                    .is_ok()
        });
    }

    /// Ends every open watch stream (clients see a clean end of stream and re-watch).
    pub fn drop_watches(&mut self) -> usize {
        let n = self.watchers.len();
        self.watchers.clear();
        n
    }

    pub fn open_watches(&self) -> usize {
        self.watchers.iter().filter(|w| !w.tx.is_closed()).count()
    }

    /// Forgets all history so that resuming any watch from an older resourceVersion gets 410.
    pub fn compact(&mut self) {
        let rv = self.rv;
        for h in self.history.values_mut() {
            h.events.clear();
            h.floor = rv;
        }
        // Storages never written yet must refuse old versions too.
        for r in crate::resources::RESOURCES {
            self.history.entry(r.storage).or_default().floor = rv;
        }
    }
}

pub fn set_rv(v: &mut Value, rv: u64) {
    if let Some(obj) = v.as_object_mut() {
        let meta = obj
            .entry("metadata")
            .or_insert_with(|| Value::Object(Default::default()));
        if let Some(m) = meta.as_object_mut() {
            m.insert("resourceVersion".into(), Value::String(rv.to_string()));
        }
    }
}
