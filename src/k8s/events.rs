//! Event recorder: core/v1 Events with upstream reasons, messages and source component, aggregated on repeat.
//!
//! Upstream writes core/v1 Events through client-go's recorder, so `kubectl describe` shows its
//! reasons with a `count`; we write the same objects the same way:
//! - name `<object-name>.<hex nanoseconds>`, in the object's namespace (`default` for cluster-scoped
//!   objects such as PVs), `source.component` + `reportingComponent` from [`EventSource`];
//! - a repeat of the same (source, object, type, reason, message) within [`AGGREGATION_WINDOW`]
//!   PATCHes `count` and `lastTimestamp` of the existing Event instead of creating a new one
//!   (client-go's EventLogger), remembered in a bounded in-memory cache;
//! - an event carrying a [`EventSpec::dedupe_key`] is sent once per episode (e.g. "PV waits for
//!   detach"): repeats are dropped until [`Recorder::end_episode`], except one refresh of the same
//!   Event every [`EPISODE_REFRESH`] so a long wait stays visible after the server's event TTL.
//!
//! Events are fire-and-forget: a failure is logged and never reaches the caller. Messages are
//! shown to every user who can read Events: callers build them from our own error types, which
//! never carry secret values.
//!
//! # Between the recorder and the API server
//!
//! Aggregation, as client-go's correlator does it: which events are "the same" (so a repeat
//! updates one Event's count), and the episodes recorded once; pure, the recorder asks, then
//! writes. The send queue of a queued [`Recorder`]: events wait, in order, for spare rate budget;
//! repeats waiting together merge; a full queue drops its oldest event.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::core::v1::{Event, EventSource as K8sEventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client, Resource, ResourceExt};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use serde_json::json;
use tokio::sync::Notify;

use super::client::TokenBucket;
use crate::names;
use crate::retry::{ApiErrorClass, classify, describe};

/// Repeats within this time of the previous one update the existing Event (the API server keeps
/// Events for `--event-ttl`, 1h by default; an expired one is simply created again).
pub(crate) const AGGREGATION_WINDOW: SignedDuration = SignedDuration::from_hours(1);
/// While an episode lasts, its Event is refreshed (count + 1, lastTimestamp) at most this often.
pub(crate) const EPISODE_REFRESH: SignedDuration = SignedDuration::from_mins(10);
/// Remembered Events (and episodes); the oldest is forgotten first. client-go uses 4096 too.
pub(crate) const CACHE_CAPACITY: usize = 4096;
/// Longest message we send; longer ones are cut (the events API refuses notes over 1 kB).
pub(crate) const MAX_MESSAGE_BYTES: usize = 1024;

/// Event severity, as in `kubectl describe`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum EventType {
    /// Something happened as expected.
    Normal,
    /// Something needs a human's attention.
    Warning,
}

impl EventType {
    /// The wire value (`Normal` / `Warning`).
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Normal => "Normal",
            Self::Warning => "Warning",
        }
    }
}

/// Who reports the events (`source.component`, `source.host`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct EventSource {
    /// `source.component` and `reportingComponent`.
    pub(crate) component: String,
    /// `source.host` and `reportingInstance`, when known.
    pub(crate) host: Option<String>,
}

impl EventSource {
    /// The component upstream's CSI-specific code reports as: `external-provisioner` (its one
    /// event: a claim left to an external populator).
    pub(crate) fn csi_provisioner() -> Self {
        Self {
            component: names::EVENT_COMPONENT.to_owned(),
            host: None,
        }
    }

    /// The component upstream's provisioning library reports as (Provisioning,
    /// ProvisioningSucceeded, ProvisioningFailed, VolumeFailedDelete):
    /// `<driverName>_<hostname>_<id>`, `id` being a per-process UUID.
    pub(crate) fn provisioner_lib(driver: &str, hostname: &str, id: &str) -> Self {
        Self {
            component: format!("{driver}_{hostname}_{id}"),
            host: None,
        }
    }
}

/// A random RFC 4122 version-4 UUID, for [`EventSource::provisioner_lib`]'s per-process id.
pub(crate) fn random_uuid() -> String {
    uuid::Uuid::new_v4().to_string()
}

/// One event to record about an object.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct EventSpec {
    /// Normal or Warning.
    pub(crate) type_: EventType,
    /// Upstream's reason string ([`crate::names`] `EVENT_*`).
    pub(crate) reason: String,
    /// Human-readable message; never a secret value.
    pub(crate) message: String,
    /// When set, record this only once per episode with this key (see [`Recorder::end_episode`]).
    pub(crate) dedupe_key: Option<String>,
}

impl EventSpec {
    /// A Normal event.
    pub(crate) fn normal(reason: &str, message: impl Into<String>) -> Self {
        Self::new(EventType::Normal, reason, message)
    }

    /// A Warning event.
    pub(crate) fn warning(reason: &str, message: impl Into<String>) -> Self {
        Self::new(EventType::Warning, reason, message)
    }

    fn new(type_: EventType, reason: &str, message: impl Into<String>) -> Self {
        Self {
            type_,
            reason: reason.to_owned(),
            message: truncate(message.into()),
            dedupe_key: None,
        }
    }

    /// Records this once per episode `key` (e.g. `wait-detach/<pv uid>`), not once per retry.
    pub(crate) fn once_per(mut self, key: impl Into<String>) -> Self {
        self.dedupe_key = Some(key.into());
        self
    }
}

fn truncate(mut message: String) -> String {
    if message.len() > MAX_MESSAGE_BYTES {
        let mut cut = MAX_MESSAGE_BYTES - 3;
        while !message.is_char_boundary(cut) {
            cut -= 1;
        }
        message.truncate(cut);
        message.push_str("...");
    }
    message
}

/// The `involvedObject` reference for `obj`: kind, apiVersion, namespace, name, uid, resourceVersion.
pub(crate) fn reference_to<K: Resource<DynamicType = ()>>(obj: &K) -> ObjectReference {
    ObjectReference {
        api_version: Some(K::api_version(&()).into_owned()),
        kind: Some(K::kind(&()).into_owned()),
        namespace: obj.namespace(),
        name: Some(obj.name_any()),
        uid: obj.uid(),
        resource_version: obj.resource_version(),
        field_path: None,
    }
}

/// `<object-name>.<hex>`: client-go's `<name>.<hex UnixNano>`, made strictly increasing within the
/// process so two events in the same nanosecond never collide. Where that is no valid object
/// name (an object name of 237 characters or more makes it longer than 253), client-go's
/// fallback: `<random UUID as 32 hex digits>.<hex>`, so long-named claims still get events.
fn event_name(object_name: &str, now: Timestamp) -> String {
    static LAST: AtomicU64 = AtomicU64::new(0);
    let nanos = u64::try_from(now.as_nanosecond()).unwrap_or(0);
    let mut prev = LAST.load(Ordering::Relaxed);
    let unique = loop {
        let next = nanos.max(prev + 1);
        match LAST.compare_exchange_weak(prev, next, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => break next,
            Err(actual) => prev = actual,
        }
    };
    let name = format!("{object_name}.{unique:x}");
    if is_dns_subdomain(&name) {
        name
    } else {
        format!("{}.{unique:x}", random_uuid().replace('-', ""))
    }
}

/// Kubernetes' `IsDNS1123Subdomain`: at most 253 characters of lowercase alphanumerics, `-` and
/// `.`, each dot-separated label starting and ending alphanumeric.
fn is_dns_subdomain(name: &str) -> bool {
    let alnum = |c: u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    name.len() <= 253
        && name.split('.').all(|label| {
            let b = label.as_bytes();
            !b.is_empty()
                && alnum(b[0])
                && alnum(b[b.len() - 1])
                && b.iter().all(|&c| alnum(c) || c == b'-')
        })
}

/// The namespace an Event about `object` lives in (`default` for cluster-scoped objects).
fn event_namespace(object: &ObjectReference) -> String {
    object
        .namespace
        .clone()
        .filter(|ns| !ns.is_empty())
        .unwrap_or_else(|| names::EVENT_NAMESPACE_CLUSTER_SCOPED.to_owned())
}

/// The core/v1 Event object as client-go's `makeEvent` builds it.
pub(crate) fn build_event(
    source: &EventSource,
    object: &ObjectReference,
    spec: &EventSpec,
    name: &str,
    count: i32,
    first: Timestamp,
    last: Timestamp,
) -> Event {
    Event {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some(event_namespace(object)),
            ..ObjectMeta::default()
        },
        involved_object: object.clone(),
        reason: Some(spec.reason.clone()),
        message: Some(spec.message.clone()),
        type_: Some(spec.type_.as_str().to_owned()),
        first_timestamp: Some(Time(first)),
        last_timestamp: Some(Time(last)),
        count: Some(count),
        source: Some(K8sEventSource {
            component: Some(source.component.clone()),
            host: source.host.clone(),
        }),
        reporting_component: Some(source.component.clone()),
        reporting_instance: source.host.clone(),
        ..Event::default()
    }
}

// === The recorder ===

/// Writes Events; cheap to clone (clones share the client and the aggregation cache).
#[derive(Clone)]
pub(crate) struct Recorder {
    client: Client,
    source: Arc<EventSource>,
    correlator: Arc<Mutex<Correlator>>,
    /// Set for a [`Recorder::queued`] recorder: events wait here for spare rate budget.
    queue: Option<Arc<EventQueue>>,
}

impl Recorder {
    /// A recorder reporting as `source`.
    pub(crate) fn new(client: Client, source: EventSource) -> Self {
        Self {
            client,
            source: Arc::new(source),
            correlator: Arc::default(),
            queue: None,
        }
    }

    /// A recorder whose events never delay the workers: [`Recorder::emit`] queues them (at most
    /// [`QUEUE_CAPACITY`]; repeats waiting together are merged into one write with their count;
    /// when full, the oldest is dropped and counted), and one background task sends them through
    /// `client` (no limiter of its own) after taking a *spare* token of `bucket`
    /// ([`TokenBucket::try_acquire_spare`]): only while no worker request waits. Under sustained
    /// pressure events wait; when it ends every queued event is written, with the times it
    /// happened. Upstream's recorder instead competes for the same tokens and drops what loses.
    pub(crate) fn queued(
        client: Client,
        source: EventSource,
        bucket: Option<Arc<TokenBucket>>,
        metrics: EventQueueMetrics,
    ) -> Self {
        let queue = Arc::new(EventQueue::new(metrics));
        let sender = Self::new(client, source);
        tokio::spawn(send_queued(sender.clone(), queue.clone(), bucket));
        Self {
            queue: Some(queue),
            ..sender
        }
    }

    /// Records `spec` about `object`, awaiting the API call. Never fails: errors are logged.
    pub(crate) async fn publish(&self, object: &ObjectReference, spec: EventSpec) {
        let now = Timestamp::now();
        let source = self.source.clone();
        self.send(&source, object, spec, now, now, 1, None, || {})
            .await;
    }

    /// Writes `repeats` occurrences of `spec` (between `first` and `last`) as `source`; with a
    /// `gate`, every request first takes a spare token of its bucket (see [`spare_token`] for
    /// when a warning may force a turn).
    #[allow(clippy::too_many_arguments)]
    async fn send(
        &self,
        source: &EventSource,
        object: &ObjectReference,
        spec: EventSpec,
        first: Timestamp,
        last: Timestamp,
        repeats: i32,
        gate: Option<(&TokenBucket, &(dyn Fn() -> bool + Sync))>,
        observed: impl FnOnce(),
    ) {
        let now = last;
        let key = AggregationKey::new(source, object, &spec);
        let object_name = object.name.clone().unwrap_or_default();
        let decision = crate::sync::lock(&self.correlator).observe_n(
            key,
            spec.dedupe_key.as_deref(),
            first,
            now,
            repeats,
            || event_name(&object_name, now),
        );
        // The episode is recorded: an end from now on may apply at once.
        observed();
        if !matches!(decision, Decision::Suppress) {
            spare_token(gate).await;
        }
        let api: Api<Event> = Api::namespaced(self.client.clone(), &event_namespace(object));
        let create = async |name: &str, count, first, last| {
            let event = build_event(source, object, &spec, name, count, first, last);
            match api.create(&PostParams::default(), &event).await {
                Ok(_) => Ok(()),
                // A concurrent publish of the same event created it first: nothing lost.
                Err(err) if classify(&err) == ApiErrorClass::AlreadyExists => Ok(()),
                Err(err) => Err(err),
            }
        };
        let result = match decision {
            Decision::Suppress => return,
            Decision::Create {
                name,
                count,
                first,
                last,
            } => create(&name, count, first, last).await,
            Decision::Update {
                name,
                count,
                first,
                last,
            } => {
                let patch = json!({
                    "count": count,
                    "lastTimestamp": Time(last),
                    "message": spec.message,
                });
                match api
                    .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                {
                    Ok(_) => Ok(()),
                    // Expired or deleted meanwhile: write it again under the same name.
                    Err(err) if classify(&err) == ApiErrorClass::NotFound => {
                        spare_token(gate).await;
                        create(&name, count, first, last).await
                    }
                    Err(err) => Err(err),
                }
            }
        };
        if let Err(err) = result {
            tracing::warn!(
                reason = %spec.reason,
                kind = object.kind.as_deref().unwrap_or_default(),
                namespace = object.namespace.as_deref().unwrap_or_default(),
                name = object.name.as_deref().unwrap_or_default(),
                class = %classify(&err),
                error = %describe(&err),
                "could not record event (not retried)"
            );
        }
    }

    /// The same recorder (queue, rate budget, aggregation) reporting as `source`.
    pub(crate) fn as_source(&self, source: EventSource) -> Self {
        Self {
            source: Arc::new(source),
            ..self.clone()
        }
    }

    /// Records `spec` about `object` in a background task and returns at once.
    pub(crate) fn emit(&self, object: ObjectReference, spec: EventSpec) {
        if let Some(queue) = &self.queue {
            queue.push_event(self.source.clone(), object, spec, Timestamp::now());
            return;
        }
        let recorder = self.clone();
        tokio::spawn(async move { recorder.publish(&object, spec).await });
    }

    /// Ends the episode `key`: the next event carrying that key is recorded again.
    pub(crate) fn end_episode(&self, key: &str) {
        if let Some(queue) = &self.queue {
            // In order with the queued events: an event of the episode still waiting must not
            // open it again after this.
            queue.end_episode(key, || {
                crate::sync::lock(&self.correlator).end_episode(key);
            });
            return;
        }
        crate::sync::lock(&self.correlator).end_episode(key);
    }
}

/// Events waiting for spare rate budget, at most this many (client-go's broadcaster queue holds
/// 1000 and drops the newest; we drop the oldest, whose claim has likely moved on). A burst of
/// 3000 claims at QPS 1000 queues about 4500 at its peak (two events per claim, sent one at a
/// time); one waiting event takes about half a kilobyte.
const QUEUE_CAPACITY: usize = 16384;

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
enum Queued {
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
struct EventQueue {
    items: Mutex<VecDeque<Queued>>,
    /// The episode of the event the sender has taken and the correlator not yet seen (locked
    /// after `items`).
    sending: Mutex<Option<String>>,
    wake: Notify,
    metrics: EventQueueMetrics,
    /// Warning events waiting: while there is one, the sender may take a forced turn
    /// ([`spare_token`]).
    warnings: AtomicUsize,
}

impl EventQueue {
    /// An empty queue.
    fn new(metrics: EventQueueMetrics) -> Self {
        Self {
            metrics,
            ..Self::default()
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<Queued>> {
        crate::sync::lock(&self.items)
    }

    /// Queues an occurrence, merged into a waiting one of the same event when there is one.
    fn push_event(
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
    fn end_episode(&self, key: &str, end_now: impl FnOnce()) {
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

    fn push(&self, item: Queued) {
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
    fn pop(&self) -> Option<Queued> {
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
    fn warning_waits(&self) -> bool {
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
    fn sent(&self) {
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
async fn spare_token(gate: Option<(&TokenBucket, &(dyn Fn() -> bool + Sync))>) {
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
const MAX_SPARE_WAIT: std::time::Duration = std::time::Duration::from_secs(20);

/// The one background sender of a queued recorder: in order, one request at a time.
async fn send_queued(sender: Recorder, queue: Arc<EventQueue>, bucket: Option<Arc<TokenBucket>>) {
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
struct AggregationKey {
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
    fn new(source: &EventSource, object: &ObjectReference, spec: &EventSpec) -> Self {
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
struct Seen {
    name: String,
    count: i32,
    first: Timestamp,
    last: Timestamp,
}

/// What to send for one observed event.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Decision {
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
struct Correlator {
    seen: HashMap<AggregationKey, Seen>,
    episodes: HashMap<String, Timestamp>,
}

impl Correlator {
    #[cfg(test)]
    fn observe(
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
    fn observe_n(
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

    fn end_episode(&mut self, key: &str) {
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

#[cfg(test)]
#[path = "events_tests.rs"]
mod tests;
