//! Aggregation, as client-go's correlator does it: which events are "the same" (so a repeat
//! updates one Event's count), and the episodes recorded once. Pure: the recorder asks, then
//! writes.

use std::collections::HashMap;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::ObjectReference;

use super::{
    AGGREGATION_WINDOW, CACHE_CAPACITY, EPISODE_REFRESH, EventSource, EventSpec, EventType,
};

/// What makes two events "the same" (client-go's `getEventKey` minus the fields we never set).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(super) struct AggregationKey {
    component: String,
    host: Option<String>,
    kind: Option<String>,
    namespace: Option<String>,
    name: Option<String>,
    uid: Option<String>,
    api_version: Option<String>,
    type_: EventType,
    reason: String,
    message: String,
}

impl AggregationKey {
    pub(super) fn new(source: &EventSource, object: &ObjectReference, spec: &EventSpec) -> Self {
        Self {
            component: source.component.clone(),
            host: source.host.clone(),
            kind: object.kind.clone(),
            namespace: object.namespace.clone(),
            name: object.name.clone(),
            uid: object.uid.clone(),
            api_version: object.api_version.clone(),
            type_: spec.type_,
            reason: spec.reason.clone(),
            message: spec.message.clone(),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Seen {
    name: String,
    count: i32,
    first: Timestamp,
    last: Timestamp,
}

/// What to send for one observed event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Decision {
    /// Create a new Event with this name, count and times.
    Create {
        name: String,
        count: i32,
        first: Timestamp,
        last: Timestamp,
    },
    /// Update the existing Event `name` to this count and lastTimestamp.
    Update {
        name: String,
        count: i32,
        first: Timestamp,
        last: Timestamp,
    },
    /// Nothing: the episode already has its event.
    Suppress,
}

/// The bounded memory behind aggregation and episodes.
#[derive(Debug, Default)]
pub(crate) struct Correlator {
    pub(super) seen: HashMap<AggregationKey, Seen>,
    episodes: HashMap<String, Timestamp>,
}

impl Correlator {
    #[cfg(test)]
    pub(super) fn observe(
        &mut self,
        key: AggregationKey,
        dedupe_key: Option<&str>,
        now: Timestamp,
        fresh_name: impl FnOnce() -> String,
    ) -> Decision {
        self.observe_n(key, dedupe_key, now, now, 1, fresh_name)
    }

    /// [`Correlator::observe`] for `repeats` occurrences between `first` and `now` (repeats that
    /// waited in the send queue together).
    pub(super) fn observe_n(
        &mut self,
        key: AggregationKey,
        dedupe_key: Option<&str>,
        first: Timestamp,
        now: Timestamp,
        mut repeats: i32,
        fresh_name: impl FnOnce() -> String,
    ) -> Decision {
        if let Some(episode) = dedupe_key {
            // Repeats of an episode's event that waited in the send queue together are one
            // occurrence: the episode is what is counted, not the retries inside it.
            repeats = 1;
            match self.episodes.get(episode) {
                Some(&at) if now.duration_since(at) < EPISODE_REFRESH => return Decision::Suppress,
                _ => {
                    evict_oldest(&mut self.episodes, |t| *t);
                    self.episodes.insert(episode.to_owned(), now);
                }
            }
        }
        match self.seen.get_mut(&key) {
            Some(seen) if now.duration_since(seen.last) < AGGREGATION_WINDOW => {
                seen.count = seen.count.saturating_add(repeats);
                seen.last = now;
                Decision::Update {
                    name: seen.name.clone(),
                    count: seen.count,
                    first: seen.first,
                    last: now,
                }
            }
            _ => {
                let name = fresh_name();
                evict_oldest(&mut self.seen, |s| s.last);
                self.seen.insert(
                    key,
                    Seen {
                        name: name.clone(),
                        count: repeats,
                        first,
                        last: now,
                    },
                );
                Decision::Create {
                    name,
                    count: repeats,
                    first,
                    last: now,
                }
            }
        }
    }

    pub(super) fn end_episode(&mut self, key: &str) {
        self.episodes.remove(key);
    }
}

/// Makes room for one more entry when the map is full, forgetting the least recently used one.
fn evict_oldest<K: Clone + Eq + std::hash::Hash, V>(
    map: &mut HashMap<K, V>,
    at: impl Fn(&V) -> Timestamp,
) {
    if map.len() < CACHE_CAPACITY {
        return;
    }
    if let Some(oldest) = map
        .iter()
        .min_by_key(|(_, v)| at(v))
        .map(|(k, _)| k.clone())
    {
        map.remove(&oldest);
    }
}
