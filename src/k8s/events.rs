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

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::core::v1::{Event, EventSource as K8sEventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client, Resource, ResourceExt};
use serde_json::json;

use super::client::TokenBucket;
use super::errors::{ApiErrorClass, classify, describe};
use crate::names;
pub(crate) use queue::EventQueueMetrics;
#[cfg(test)]
use queue::QUEUE_CAPACITY;
#[cfg(test)]
use queue::Queued;
use queue::{AggregationKey, Correlator, Decision, EventQueue, send_queued, spare_token};

mod queue;

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
    pub(super) correlator: Arc<Mutex<Correlator>>,
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
    pub(super) async fn send(
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

#[cfg(test)]
#[path = "events_tests.rs"]
mod tests;
