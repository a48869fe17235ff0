//! What happens to an event between the [`Recorder`] and the API server: aggregated as client-go
//! does it, and, for a queued recorder, waiting to be sent.
//!
//! The send queue of a queued [`Recorder`]: events wait here, in order,
//! for spare rate budget; repeats waiting together merge; a full queue drops its oldest event.
//!
//! Aggregation, as client-go's correlator does it: which events are "the same" (so a repeat
//! updates one Event's count), and the episodes recorded once. Pure: the recorder asks, then
//! writes.

use std::collections::HashMap;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use jiff::Timestamp;
use k8s_openapi::api::core::v1::ObjectReference;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::sync::Notify;

use super::{
    AGGREGATION_WINDOW, CACHE_CAPACITY, EPISODE_REFRESH, EventSource, EventSpec, EventType,
    Recorder,
};
use crate::k8s::client::TokenBucket;

/// Events waiting for spare rate budget, at most this many (client-go's broadcaster queue holds
/// 1000 and drops the newest; we drop the oldest, whose claim has likely moved on). A burst of
/// 3000 claims at QPS 1000 queues about 4500 at its peak (two events per claim, sent one at a
/// time); one waiting event takes about half a kilobyte.
pub(crate) const QUEUE_CAPACITY: usize = 16384;

/// `csi_provisioner_events_queued` and `csi_provisioner_events_dropped_total`.
#[derive(Debug, Clone, Default)]
pub(crate) struct EventQueueMetrics {
    /// Events waiting to be written.
    pub queued: Gauge,
    /// Events dropped because the queue was full.
    pub dropped: Counter,
}

impl EventQueueMetrics {
    /// Registers both families in `registry`.
    pub(crate) fn register(registry: &mut Registry) -> Self {
        let metrics = Self::default();
        registry.register(
            "csi_provisioner_events_queued",
            "Events waiting for spare API rate budget (events never delay provisioning or deletion).",
            metrics.queued.clone(),
        );
        registry.register(
            "csi_provisioner_events_dropped",
            "Events dropped because the event queue was full under sustained API pressure.",
            metrics.dropped.clone(),
        );
        metrics
    }
}

/// One entry of the send queue.
// Nearly every entry is an event: boxing it would cost an allocation each for nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub(super) enum Queued {
    Event {
        /// Hash of source, object and spec: finding a waiting repeat compares this first.
        fingerprint: u64,
        source: Arc<EventSource>,
        object: ObjectReference,
        spec: EventSpec,
        first: Timestamp,
        last: Timestamp,
        repeats: i32,
    },
    EndEpisode(String),
}

#[derive(Debug, Default)]
pub(super) struct EventQueue {
    pub(super) items: Mutex<VecDeque<Queued>>,
    /// The episode of the event the sender has taken and the correlator not yet seen (locked
    /// after `items`).
    sending: Mutex<Option<String>>,
    pub(super) wake: Notify,
    pub(super) metrics: EventQueueMetrics,
    /// Warning events waiting: while there is one, the sender may take a forced turn
    /// ([`spare_token`]).
    warnings: AtomicUsize,
}

impl EventQueue {
    /// An empty queue.
    pub(super) fn new(metrics: EventQueueMetrics) -> Self {
        Self {
            metrics,
            ..Self::default()
        }
    }

    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<Queued>> {
        crate::sync::lock(&self.items)
    }

    /// Queues an occurrence, merged into a waiting one of the same event when there is one.
    pub(super) fn push_event(
        &self,
        source: Arc<EventSource>,
        object: ObjectReference,
        spec: EventSpec,
        at: Timestamp,
    ) {
        let fingerprint = fingerprint(&source, &object, &spec);
        {
            let mut items = self.lock();
            // Newest first, and never past the end of this event's episode: an occurrence after
            // the end opens a new episode and must be sent on its own.
            let waiting = items.iter_mut().rev().find_map(|item| match item {
                Queued::Event {
                    fingerprint: f,
                    source: s,
                    object: o,
                    spec: e,
                    last,
                    repeats,
                    ..
                } if *f == fingerprint && *e == spec && *o == object && *s == source => {
                    Some(Some((last, repeats)))
                }
                Queued::EndEpisode(k) if spec.dedupe_key.as_deref() == Some(k.as_str()) => {
                    Some(None)
                }
                _ => None,
            });
            if let Some(Some((last, repeats))) = waiting {
                *last = at;
                *repeats = repeats.saturating_add(1);
                return;
            }
        }
        self.push(Queued::Event {
            fingerprint,
            source,
            object,
            spec,
            first: at,
            last: at,
            repeats: 1,
        });
    }

    /// Ends the episode `key`: at once (`end_now`) when no event of it waits or is being sent,
    /// else by one marker after the last such event. A bound PV ends its wait-for-detach episode
    /// at every reconcile: one marker per call would fill the queue and push real events out.
    pub(super) fn end_episode(&self, key: &str, end_now: impl FnOnce()) {
        let mut items = self.lock();
        let last = items.iter().rev().find_map(|item| match item {
            Queued::Event { spec, .. } if spec.dedupe_key.as_deref() == Some(key) => Some(true),
            Queued::EndEpisode(k) if k == key => Some(false),
            _ => None,
        });
        let in_flight = crate::sync::lock(&self.sending).as_deref() == Some(key);
        match last {
            // A marker already follows the last waiting event of the episode.
            Some(false) => {}
            Some(true) => self.push_locked(&mut items, Queued::EndEpisode(key.to_owned())),
            None if in_flight => self.push_locked(&mut items, Queued::EndEpisode(key.to_owned())),
            // Under the lock, so no event of the episode can be taken meanwhile.
            None => end_now(),
        }
    }

    pub(super) fn push(&self, item: Queued) {
        let mut items = self.lock();
        self.push_locked(&mut items, item);
    }

    fn push_locked(&self, items: &mut VecDeque<Queued>, item: Queued) {
        if items.len() >= QUEUE_CAPACITY {
            let oldest_event = items.iter().position(|i| matches!(i, Queued::Event { .. }));
            if let Some(index) = oldest_event {
                if let Some(dropped) = items.remove(index) {
                    self.count_out(&dropped);
                }
                self.metrics.dropped.inc();
            }
        }
        if is_warning(&item) {
            self.warnings.fetch_add(1, Ordering::Relaxed);
        }
        items.push_back(item);
        self.metrics
            .queued
            .set(i64::try_from(items.len()).unwrap_or(i64::MAX));
        self.wake.notify_one();
    }

    /// Takes the oldest item; an event's episode counts as in flight until [`Self::sent`].
    pub(super) fn pop(&self) -> Option<Queued> {
        let mut items = self.lock();
        let item = items.pop_front();
        if let Some(item) = &item {
            self.count_out(item);
        }
        if items.is_empty() && items.capacity() > 1024 {
            // A burst's backlog is gone: give its room back.
            items.shrink_to_fit();
        }
        if let Some(Queued::Event { spec, .. }) = &item {
            crate::sync::lock(&self.sending).clone_from(&spec.dedupe_key);
        }
        self.metrics
            .queued
            .set(i64::try_from(items.len()).unwrap_or(i64::MAX));
        item
    }

    /// Whether a warning waits to be sent.
    pub(super) fn warning_waits(&self) -> bool {
        self.warnings.load(Ordering::Relaxed) > 0
    }

    /// `item` left the queue (taken or dropped; called under the items lock).
    fn count_out(&self, item: &Queued) {
        if is_warning(item) {
            let before = self.warnings.fetch_sub(1, Ordering::Relaxed);
            debug_assert!(
                before > 0,
                "a warning left the queue without having entered it"
            );
        }
    }

    /// The event taken last was seen by the correlator (its write may still be under way).
    pub(super) fn sent(&self) {
        *crate::sync::lock(&self.sending) = None;
    }
}

fn is_warning(item: &Queued) -> bool {
    matches!(item, Queued::Event { spec, .. } if spec.type_ == EventType::Warning)
}

fn fingerprint(source: &EventSource, object: &ObjectReference, spec: &EventSpec) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    source.hash(&mut h);
    spec.hash(&mut h);
    for field in [
        &object.kind,
        &object.namespace,
        &object.name,
        &object.uid,
        &object.api_version,
        &object.field_path,
        &object.resource_version,
    ] {
        field.hash(&mut h);
    }
    h.finish()
}

/// Waits for a spare token of `gate`'s bucket (none needed without a rate limit).
///
/// Under demand that never pauses (claims failing and being retried without end) no token is
/// ever spare; once a warning waits (`urgent`), an event takes its turn like a worker after
/// [`MAX_SPARE_WAIT`], at one event per that wait at most: a bounded share of the budget. The
/// queue stays in order, so a warning behind others is written after them, one turn each. Normal events alone never take that turn: a healthy burst spends
/// no token on them, and they are all written when it ends.
pub(super) async fn spare_token(gate: Option<(&TokenBucket, &(dyn Fn() -> bool + Sync))>) {
    let Some((bucket, urgent)) = gate else { return };
    let deadline = tokio::time::Instant::now() + MAX_SPARE_WAIT;
    loop {
        let Err(wait) = bucket.try_acquire_spare() else {
            return;
        };
        if tokio::time::Instant::now() >= deadline && urgent() {
            break;
        }
        tokio::time::sleep(wait).await;
    }
    while let Err(wait) = bucket.try_acquire() {
        tokio::time::sleep(wait).await;
    }
}

/// How long an event waits for a spare token before it takes one like a worker while a warning
/// waits: long enough that the forced turns cost a saturated run about 1% of its budget at the
/// default QPS 5 (2 s cost 10% in the benchmark), short enough that a failure at the head of the
/// queue still shows within a minute when claims are retried without pause.
pub(super) const MAX_SPARE_WAIT: std::time::Duration = std::time::Duration::from_secs(20);

/// The one background sender of a queued recorder: in order, one request at a time.
pub(super) async fn send_queued(
    sender: Recorder,
    queue: Arc<EventQueue>,
    bucket: Option<Arc<TokenBucket>>,
) {
    loop {
        let Some(item) = queue.pop() else {
            queue.wake.notified().await;
            continue;
        };
        match item {
            Queued::EndEpisode(key) => crate::sync::lock(&sender.correlator).end_episode(&key),
            Queued::Event {
                source,
                object,
                spec,
                first,
                last,
                repeats,
                ..
            } => {
                let warning = spec.type_ == EventType::Warning;
                let urgent = || warning || queue.warning_waits();
                sender
                    .send(
                        &source,
                        &object,
                        spec,
                        first,
                        last,
                        repeats,
                        bucket
                            .as_deref()
                            .map(|bucket| (bucket, &urgent as &(dyn Fn() -> bool + Sync))),
                        || queue.sent(),
                    )
                    .await;
            }
        }
    }
}

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
