//! The capacity work queue: at most one item per key, in two lanes. What the scheduler lacks (a
//! missing object, an obsolete one) goes ahead of refreshes of objects that exist, so within a
//! write budget nobody may exceed, a new node's objects never wait behind a backlog of refreshes.

use std::collections::{HashMap, VecDeque};
use std::hash::Hash;
use std::time::{Duration, Instant};

/// Which lane an item waits in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Lane {
    /// Missing or obsolete objects: served first.
    Urgent,
    /// Refreshes of objects that exist.
    Refresh,
}

/// Guarantees:
/// 1. An item is queued at most once (its depth never exceeds the number of keys).
/// 2. An item queued again keeps its place and its time; one that became urgent moves to the
///    urgent lane.
/// 3. `pop` serves every ready urgent item before any refresh, each lane first in, first out.
#[derive(Debug)]
pub(crate) struct Queue<T> {
    urgent: VecDeque<T>,
    refresh: VecDeque<T>,
    /// The members of both lanes: when each was queued and in which lane.
    queued: HashMap<T, (Instant, Lane)>,
}

impl<T> Default for Queue<T> {
    fn default() -> Self {
        Self {
            urgent: VecDeque::new(),
            refresh: VecDeque::new(),
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
                match lane {
                    Lane::Urgent => self.urgent.push_back(item),
                    Lane::Refresh => self.refresh.push_back(item),
                }
                true
            }
            Some((_, queued)) => {
                if *queued == Lane::Refresh && lane == Lane::Urgent {
                    *queued = Lane::Urgent;
                    self.refresh.retain(|i| *i != item);
                    self.urgent.push_back(item);
                }
                false
            }
        }
    }

    /// The first item `ready` accepts, urgent ones first (guarantee 3), with when it was queued.
    pub(crate) fn pop(&mut self, ready: impl Fn(&T) -> bool) -> Option<(T, Instant)> {
        let item = match self.urgent.iter().position(&ready) {
            Some(i) => self.urgent.remove(i)?,
            None => {
                let i = self.refresh.iter().position(&ready)?;
                self.refresh.remove(i)?
            }
        };
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
