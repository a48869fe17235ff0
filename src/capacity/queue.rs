//! The capacity work queue: at most one item per key, in three lanes. What the scheduler lacks
//! goes ahead of refreshes of objects that exist, and the objects of a segment or class that
//! appeared while the sidecar runs go ahead of everything else, so within a write budget nobody
//! may exceed, a new node's objects never wait behind a backlog: neither the refreshes nor the
//! initial creations of a large cluster (at the default budget 4,000 objects take over an hour).

use std::collections::{HashMap, VecDeque};
use std::hash::Hash;
use std::time::{Duration, Instant};

/// Which lane an item waits in, in the order they are served (`as usize`: its index in `lanes`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Lane {
    /// Objects of a segment or class that appeared after start-up (a new node): served first.
    New,
    /// Missing or obsolete objects.
    Urgent,
    /// Refreshes of objects that exist.
    Refresh,
}

/// Guarantees:
/// 1. An item is queued at most once (its depth never exceeds the number of keys).
/// 2. An item queued again keeps its place and its time; one that belongs in an earlier lane
///    now moves there.
/// 3. `pop` serves the lanes in order (every ready new item, then every ready urgent one, then
///    refreshes), each lane first in, first out.
#[derive(Debug)]
pub(crate) struct Queue<T> {
    lanes: [VecDeque<T>; 3],
    /// The members of every lane: when each was queued and in which lane.
    queued: HashMap<T, (Instant, Lane)>,
}

impl<T> Default for Queue<T> {
    fn default() -> Self {
        Self {
            lanes: [VecDeque::new(), VecDeque::new(), VecDeque::new()],
            queued: HashMap::new(),
        }
    }
}

impl<T: Clone + Eq + Hash> Queue<T> {
    /// Queues `item` in `lane` (guarantees 1 and 2); whether it is new to the queue.
    pub(crate) fn push(&mut self, item: T, lane: Lane, now: Instant) -> bool {
        match self.queued.get_mut(&item) {
            None => {
                self.queued.insert(item.clone(), (now, lane));
                self.lanes[lane as usize].push_back(item);
                true
            }
            Some((_, queued)) => {
                if lane < *queued {
                    self.lanes[*queued as usize].retain(|i| *i != item);
                    *queued = lane;
                    self.lanes[lane as usize].push_back(item);
                }
                false
            }
        }
    }

    /// The first item `ready` accepts, lane by lane (guarantee 3), with when it was queued.
    pub(crate) fn pop(&mut self, ready: impl Fn(&T) -> bool) -> Option<(T, Instant)> {
        let item = self.lanes.iter_mut().find_map(|lane| {
            let i = lane.iter().position(&ready)?;
            lane.remove(i)
        })?;
        let (since, _) = self.queued.remove(&item)?;
        Some((item, since))
    }

    /// How long the item queued longest has waited.
    pub(crate) fn oldest(&self, now: Instant) -> Duration {
        self.queued
            .values()
            .map(|(since, _)| now.saturating_duration_since(*since))
            .max()
            .unwrap_or_default()
    }

    /// How many items wait.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.queued.len()
    }
}

#[cfg(test)]
#[path = "queue_tests.rs"]
mod tests;
