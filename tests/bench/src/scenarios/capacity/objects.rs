//! The driver's CSIStorageCapacity objects as a watch sees them: which (class, node) keys exist,
//! when each was first seen, and the capacity each holds.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use futures::StreamExt;
use k8s_openapi::api::storage::v1::CSIStorageCapacity;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};

use crate::cluster::{DRIVER, NS, TOPOLOGY_KEY};

/// (StorageClass, node): what one object stands for.
pub type Key = (String, String);

pub const LABEL_DRIVER: &str = "csi.storage.k8s.io/drivername";

#[derive(Default)]
struct State {
    /// Object name -> its key and capacity in bytes (`None`: absent or unreadable).
    objects: HashMap<String, (Key, Option<i64>)>,
    first_seen: HashMap<Key, Instant>,
    synced: bool,
}

impl State {
    fn apply(&mut self, c: &CSIStorageCapacity, now: Instant) {
        let (Some(name), Some(key)) = (c.metadata.name.clone(), key_of(c)) else {
            return;
        };
        self.first_seen.entry(key.clone()).or_insert(now);
        let bytes = c
            .capacity
            .as_ref()
            .and_then(|q| mock_csi_driver::config::parse_quantity(&q.0).ok());
        self.objects.insert(name, (key, bytes));
    }
}

/// The key of one of our driver's objects; `None` for another driver's.
fn key_of(c: &CSIStorageCapacity) -> Option<Key> {
    let labels = c.metadata.labels.as_ref()?;
    if labels.get(LABEL_DRIVER).map(String::as_str) != Some(DRIVER) {
        return None;
    }
    let node = c
        .node_topology
        .as_ref()
        .and_then(|t| t.match_labels.as_ref())
        .and_then(|l| l.get(TOPOLOGY_KEY))
        .cloned()
        .unwrap_or_default();
    Some((c.storage_class_name.clone(), node))
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Kept current by a watch of the namespace's CSIStorageCapacity objects.
#[derive(Clone)]
pub struct Objects {
    state: Arc<Mutex<State>>,
    /// Ends the watch with the last clone.
    _watch: Arc<AbortOnDrop>,
}

impl Objects {
    pub fn start(client: &Client) -> Self {
        let state = Arc::new(Mutex::new(State::default()));
        let api: Api<CSIStorageCapacity> = Api::namespaced(client.clone(), NS);
        let s = state.clone();
        let task = tokio::spawn(async move {
            let mut stream = watcher(api, watcher::Config::default())
                .default_backoff()
                .boxed();
            let mut fresh: Option<State> = None;
            while let Some(ev) = stream.next().await {
                let now = Instant::now();
                let mut st = s.lock().unwrap_or_else(|e| e.into_inner());
                match ev {
                    Ok(watcher::Event::Apply(c)) => st.apply(&c, now),
                    Ok(watcher::Event::Delete(c)) => {
                        if let Some(n) = c.metadata.name {
                            st.objects.remove(&n);
                        }
                    }
                    Ok(watcher::Event::Init) => fresh = Some(State::default()),
                    Ok(watcher::Event::InitApply(c)) => {
                        let f = fresh.get_or_insert_default();
                        f.first_seen = st.first_seen.clone();
                        f.apply(&c, now);
                    }
                    Ok(watcher::Event::InitDone) => {
                        let f = fresh.take().unwrap_or_default();
                        st.objects = f.objects;
                        for (k, t) in f.first_seen {
                            st.first_seen.entry(k).or_insert(t);
                        }
                        st.synced = true;
                    }
                    Err(_) => {}
                }
            }
        });
        Self {
            state,
            _watch: Arc::new(AbortOnDrop(task)),
        }
    }

    fn with<T>(&self, f: impl FnOnce(&State) -> T) -> T {
        f(&self.state.lock().unwrap_or_else(|e| e.into_inner()))
    }

    pub fn synced(&self) -> bool {
        self.with(|s| s.synced)
    }

    /// When each of `keys` was first seen (absent: never).
    pub fn first_seen<'a>(&self, keys: impl IntoIterator<Item = &'a Key>) -> Vec<Option<Instant>> {
        self.with(|s| {
            keys.into_iter()
                .map(|k| s.first_seen.get(k).copied())
                .collect()
        })
    }

    /// Objects now, and the distinct keys they cover.
    pub fn counts(&self) -> (usize, usize) {
        self.with(|s| {
            let keys: std::collections::HashSet<&Key> =
                s.objects.values().map(|(k, _)| k).collect();
            (s.objects.len(), keys.len())
        })
    }

    /// The capacity each key's objects hold now (several when duplicated).
    pub fn capacities(&self) -> BTreeMap<Key, Vec<Option<i64>>> {
        self.with(|s| {
            let mut m: BTreeMap<Key, Vec<Option<i64>>> = BTreeMap::new();
            for (k, b) in s.objects.values() {
                m.entry(k.clone()).or_default().push(*b);
            }
            m
        })
    }
}
