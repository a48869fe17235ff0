//! Tests for `k8s::events`: the Event object, the aggregation and episode decisions, and the
//! requests the recorder sends (against a fake API answering every call).

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{Method, Request, Response, StatusCode};
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::client::Body;
use serde_json::{Value, json};

use super::*;
use crate::testing::{pv, pvc};

fn at(seconds: i64) -> Timestamp {
    Timestamp::from_second(1_800_000_000 + seconds).unwrap()
}

fn pv_ref() -> ObjectReference {
    reference_to(&pv("pv-1").resource_version("42").build())
}

fn key(spec: &EventSpec) -> AggregationKey {
    AggregationKey::new(&EventSource::csi_provisioner(), &pv_ref(), spec)
}

fn observe(c: &mut Correlator, spec: &EventSpec, t: Timestamp) -> Decision {
    c.observe(key(spec), spec.dedupe_key.as_deref(), t, || {
        format!("pv-1.{:x}", t.as_second())
    })
}

#[test]
fn the_involved_object_names_kind_version_namespace_uid_and_resource_version() {
    let claim: PersistentVolumeClaim = pvc("ns1", "data").resource_version("9").build();
    let r = reference_to(&claim);
    assert_eq!(r.kind.as_deref(), Some("PersistentVolumeClaim"));
    assert_eq!(r.api_version.as_deref(), Some("v1"));
    assert_eq!(r.namespace.as_deref(), Some("ns1"));
    assert_eq!(r.name.as_deref(), Some("data"));
    assert_eq!(r.uid.as_deref(), Some("uid-ns1-data"));
    assert_eq!(r.resource_version.as_deref(), Some("9"));
}

#[test]
fn an_event_about_a_pv_lives_in_default_with_the_upstream_fields() {
    let spec = EventSpec::warning(
        names::EVENT_VOLUME_FAILED_DELETE,
        "rpc error: code = Unavailable",
    );
    let source = EventSource::provisioner_lib("mock.csi.test", "host-a", "1234");
    let event = build_event(&source, &pv_ref(), &spec, "pv-1.abc", 1, at(0), at(0));
    let v = serde_json::to_value(&event).unwrap();
    assert_eq!(v["metadata"]["name"], "pv-1.abc");
    assert_eq!(v["metadata"]["namespace"], "default");
    assert_eq!(v["involvedObject"]["kind"], "PersistentVolume");
    assert_eq!(v["involvedObject"]["name"], "pv-1");
    assert_eq!(v["involvedObject"]["uid"], "uid-pv-1");
    assert_eq!(v["involvedObject"]["resourceVersion"], "42");
    assert_eq!(v["type"], "Warning");
    assert_eq!(v["reason"], "VolumeFailedDelete");
    assert_eq!(v["message"], "rpc error: code = Unavailable");
    assert_eq!(v["count"], 1);
    assert_eq!(v["source"]["component"], "mock.csi.test_host-a_1234");
    assert_eq!(v["reportingComponent"], "mock.csi.test_host-a_1234");
    assert_eq!(v["firstTimestamp"], v["lastTimestamp"]);
}

#[test]
fn an_event_about_a_claim_lives_in_the_claims_namespace() {
    let claim = reference_to(&pvc("ns1", "data").build());
    let spec = EventSpec::normal(names::EVENT_PROVISIONING, "x");
    let event = build_event(
        &EventSource::csi_provisioner(),
        &claim,
        &spec,
        "data.1",
        1,
        at(0),
        at(0),
    );
    assert_eq!(event.metadata.namespace.as_deref(), Some("ns1"));
    assert_eq!(
        event.source.unwrap().component.as_deref(),
        Some("external-provisioner")
    );
}

#[test]
fn event_names_are_the_object_name_and_a_unique_hex_suffix() {
    let t = at(0);
    let a = event_name("pv-1", t);
    let b = event_name("pv-1", t);
    assert_ne!(a, b, "same nanosecond must still give distinct names");
    for name in [&a, &b] {
        let suffix = name.strip_prefix("pv-1.").unwrap();
        assert!(u64::from_str_radix(suffix, 16).is_ok(), "{name}");
    }
}

/// Issue 33: a claim name of 237+ characters would give an event name over 253; client-go then
/// names the event `<uuid hex>.<hex>`, so long-named claims still get their events.
#[test]
fn an_event_of_a_long_named_object_gets_a_generated_name() {
    let long = format!("c{}", "x".repeat(238));
    let name = event_name(&long, at(0));
    assert!(name.len() <= 253, "{name}");
    let (head, tail) = name.split_once('.').unwrap();
    assert_eq!(head.len(), 32);
    assert!(head.bytes().all(|c| c.is_ascii_hexdigit()), "{name}");
    assert!(u64::from_str_radix(tail, 16).is_ok(), "{name}");
    let fits = "c".repeat(236);
    assert!(event_name(&fits, at(0)).starts_with(&format!("{fits}.")));
}

#[test]
fn a_repeat_within_the_window_updates_the_same_event() {
    let mut c = Correlator::default();
    let spec = EventSpec::warning(names::EVENT_VOLUME_FAILED_DELETE, "boom");
    let Decision::Create { name, count: 1, .. } = observe(&mut c, &spec, at(0)) else {
        panic!("first sighting creates");
    };
    assert_eq!(
        observe(&mut c, &spec, at(30)),
        Decision::Update {
            name: name.clone(),
            count: 2,
            first: at(0),
            last: at(30)
        }
    );
    assert!(matches!(
        observe(&mut c, &spec, at(90)),
        Decision::Update { count: 3, .. }
    ));
}

#[test]
fn a_different_message_or_reason_is_a_different_event() {
    let mut c = Correlator::default();
    let a = EventSpec::warning(names::EVENT_VOLUME_FAILED_DELETE, "boom");
    let b = EventSpec::warning(names::EVENT_VOLUME_FAILED_DELETE, "other");
    let n = EventSpec::normal(names::EVENT_VOLUME_FAILED_DELETE, "boom");
    assert!(matches!(
        observe(&mut c, &a, at(0)),
        Decision::Create { .. }
    ));
    assert!(matches!(
        observe(&mut c, &b, at(1)),
        Decision::Create { .. }
    ));
    assert!(matches!(
        observe(&mut c, &n, at(2)),
        Decision::Create { .. }
    ));
}

#[test]
fn a_repeat_after_the_window_creates_a_new_event() {
    let mut c = Correlator::default();
    let spec = EventSpec::warning(names::EVENT_VOLUME_FAILED_DELETE, "boom");
    observe(&mut c, &spec, at(0));
    let later = at(0) + AGGREGATION_WINDOW + SignedDuration::from_secs(1);
    assert!(matches!(
        observe(&mut c, &spec, later),
        Decision::Create { count: 1, .. }
    ));
}

#[test]
fn an_episode_is_recorded_once_then_only_refreshed_until_it_ends() {
    let mut c = Correlator::default();
    let wait = EventSpec::warning(
        names::EVENT_VOLUME_FAILED_DELETE,
        "persistentvolume pv-1 is still attached to node n1",
    )
    .once_per("wait-detach/uid-pv-1");
    assert!(matches!(
        observe(&mut c, &wait, at(0)),
        Decision::Create { .. }
    ));
    for retry in 1..20 {
        assert_eq!(observe(&mut c, &wait, at(retry * 10)), Decision::Suppress);
    }
    let refresh = at(0) + EPISODE_REFRESH;
    assert!(matches!(
        observe(&mut c, &wait, refresh),
        Decision::Update { count: 2, .. }
    ));
    c.end_episode("wait-detach/uid-pv-1");
    assert!(matches!(
        observe(&mut c, &wait, refresh + SignedDuration::from_secs(1)),
        Decision::Update { count: 3, .. }
    ));
}

/// Two retries of a wait that queued together (the second run came a fraction of a millisecond
/// after the first) are still one event of count 1.
#[test]
fn repeats_of_an_episode_sent_together_count_once() {
    let mut c = Correlator::default();
    let wait = EventSpec::warning(names::EVENT_VOLUME_FAILED_DELETE, "still attached")
        .once_per("wait-detach/uid-pv-1");
    let decision = c.observe_n(
        key(&wait),
        wait.dedupe_key.as_deref(),
        at(0),
        at(0),
        2,
        || "pv-1.a".to_owned(),
    );
    assert!(
        matches!(decision, Decision::Create { count: 1, .. }),
        "{decision:?}"
    );
    let plain = EventSpec::warning("R", "plain");
    let decision = c.observe_n(key(&plain), None, at(0), at(0), 2, || "pv-1.b".to_owned());
    assert!(
        matches!(decision, Decision::Create { count: 2, .. }),
        "repeats of other events are counted: {decision:?}"
    );
}

#[test]
fn the_cache_is_bounded_and_forgets_the_least_recently_seen_first() {
    let mut c = Correlator::default();
    for i in 0..(CACHE_CAPACITY + 10) {
        let spec = EventSpec::warning("R", format!("message {i}"));
        observe(&mut c, &spec, at(i as i64));
    }
    assert_eq!(c.seen.len(), CACHE_CAPACITY);
    let oldest = EventSpec::warning("R", "message 0");
    assert!(!c.seen.contains_key(&key(&oldest)));
    let newest = EventSpec::warning("R", format!("message {}", CACHE_CAPACITY + 9));
    assert!(c.seen.contains_key(&key(&newest)));
}

#[test]
fn long_messages_are_cut_at_a_character_boundary() {
    let spec = EventSpec::warning("R", "é".repeat(MAX_MESSAGE_BYTES));
    assert!(spec.message.len() <= MAX_MESSAGE_BYTES);
    assert!(spec.message.ends_with("..."));
    let short = EventSpec::warning("R", "fine");
    assert_eq!(short.message, "fine");
}

#[test]
fn random_uuids_look_like_version_4_uuids() {
    let id = random_uuid();
    assert_eq!(id.len(), 36);
    assert_eq!(id.as_bytes()[14], b'4');
    assert_ne!(id, random_uuid());
}

// === Requests ===

#[derive(Default)]
struct Log {
    requests: Vec<(Method, String, Value)>,
    fail_with: Option<u16>,
}

fn fake_client() -> (Client, Arc<Mutex<Log>>) {
    let log = Arc::new(Mutex::new(Log::default()));
    let shared = log.clone();
    let service = tower::service_fn(move |req: Request<Body>| {
        let log = shared.clone();
        async move {
            let method = req.method().clone();
            let path = req.uri().path().to_owned();
            let body = req.into_body().collect_bytes().await.unwrap();
            let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            let mut log = log.lock().unwrap();
            log.requests.push((method, path, body.clone()));
            let resp = match log.fail_with {
                Some(code) => {
                    let status = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                        "message": "no", "reason": "InternalError", "code": code});
                    let mut r = Response::new(Body::from(serde_json::to_vec(&status).unwrap()));
                    *r.status_mut() = StatusCode::from_u16(code).unwrap();
                    r
                }
                None => {
                    let mut obj = json!({"apiVersion": "v1", "kind": "Event",
                        "metadata": {"name": "x", "namespace": "default"},
                        "involvedObject": {}});
                    if let Value::Object(fields) = body {
                        for (k, v) in fields {
                            obj[k] = v;
                        }
                    }
                    Response::new(Body::from(serde_json::to_vec(&obj).unwrap()))
                }
            };
            Ok::<_, Infallible>(resp)
        }
    });
    (Client::new(service, "default"), log)
}

#[tokio::test]
async fn repeats_patch_the_count_and_an_episode_is_sent_once() {
    let (client, log) = fake_client();
    let recorder = Recorder::new(client, EventSource::csi_provisioner());
    let failed = EventSpec::warning(names::EVENT_VOLUME_FAILED_DELETE, "boom");
    recorder.publish(&pv_ref(), failed.clone()).await;
    recorder.publish(&pv_ref(), failed).await;
    let waiting =
        EventSpec::warning(names::EVENT_VOLUME_FAILED_DELETE, "attached").once_per("wait/pv-1");
    for _ in 0..5 {
        recorder.publish(&pv_ref(), waiting.clone()).await;
    }

    let log = log.lock().unwrap();
    let methods: Vec<_> = log.requests.iter().map(|(m, ..)| m.clone()).collect();
    assert_eq!(methods, [Method::POST, Method::PATCH, Method::POST]);
    let (_, create_path, created) = &log.requests[0];
    assert_eq!(create_path, "/api/v1/namespaces/default/events");
    let name = created["metadata"]["name"].as_str().unwrap();
    let (_, patch_path, patch) = &log.requests[1];
    assert_eq!(
        patch_path,
        &format!("/api/v1/namespaces/default/events/{name}")
    );
    assert_eq!(patch["count"], 2);
    assert_eq!(log.requests[2].2["message"], "attached");
}

#[tokio::test]
async fn a_failing_api_never_reaches_the_caller() {
    let (client, log) = fake_client();
    log.lock().unwrap().fail_with = Some(500);
    let recorder = Recorder::new(client, EventSource::csi_provisioner());
    // Returns (unit) even though every request fails.
    recorder
        .publish(&pv_ref(), EventSpec::normal(names::EVENT_PROVISIONING, "x"))
        .await;
    assert_eq!(log.lock().unwrap().requests.len(), 1);
}

#[tokio::test]
async fn kube_sim_accepts_the_event_and_its_aggregated_update() {
    let sim = kube_sim::Sim::start(kube_sim::SimConfig::bare())
        .await
        .unwrap();
    let recorder = Recorder::new(sim.client(), EventSource::csi_provisioner());
    let spec = EventSpec::warning(names::EVENT_VOLUME_FAILED_DELETE, "rpc error: boom");
    recorder.publish(&pv_ref(), spec.clone()).await;
    recorder.publish(&pv_ref(), spec).await;

    let events: Api<Event> = Api::namespaced(sim.client(), "default");
    let list = events.list(&Default::default()).await.unwrap();
    assert_eq!(list.items.len(), 1, "{:?}", list.items);
    let event = &list.items[0];
    assert_eq!(event.count, Some(2));
    assert_eq!(event.reason.as_deref(), Some("VolumeFailedDelete"));
    assert_eq!(event.involved_object.name.as_deref(), Some("pv-1"));
    assert!(event.last_timestamp >= event.first_timestamp);
}

fn queue() -> EventQueue {
    EventQueue::new(EventQueueMetrics::default())
}

fn queued_events(q: &EventQueue) -> Vec<(String, i32)> {
    q.lock()
        .iter()
        .filter_map(|i| match i {
            Queued::Event { spec, repeats, .. } => Some((spec.message.clone(), *repeats)),
            Queued::EndEpisode(_) => None,
        })
        .collect()
}

#[test]
fn repeats_waiting_together_become_one_write_with_their_count_and_times() {
    let q = queue();
    let source = Arc::new(EventSource::csi_provisioner());
    let failed = EventSpec::warning(names::EVENT_PROVISIONING_FAILED, "quota exceeded");
    let other = EventSpec::normal(names::EVENT_PROVISIONING, "provisioning");
    q.push_event(source.clone(), pv_ref(), failed.clone(), at(0));
    q.push_event(source.clone(), pv_ref(), other, at(1));
    q.push_event(source.clone(), pv_ref(), failed.clone(), at(2));
    q.push_event(source, pv_ref(), failed, at(3));
    assert_eq!(
        queued_events(&q),
        [
            ("quota exceeded".to_owned(), 3),
            ("provisioning".to_owned(), 1)
        ]
    );
    let Some(Queued::Event { first, last, .. }) = q.pop() else {
        panic!("an event first")
    };
    assert_eq!((first, last), (at(0), at(3)));
    assert_eq!(q.metrics.queued.get(), 1);
}

#[test]
fn a_full_queue_drops_its_oldest_event_and_counts_it() {
    let q = queue();
    let source = Arc::new(EventSource::csi_provisioner());
    for i in 0..QUEUE_CAPACITY + 2 {
        let spec = EventSpec::normal(names::EVENT_PROVISIONING, format!("event {i}"));
        q.push_event(source.clone(), pv_ref(), spec, at(0));
    }
    let events = queued_events(&q);
    assert_eq!(events.len(), QUEUE_CAPACITY);
    assert_eq!(events[0].0, "event 2", "the two oldest were dropped");
    assert_eq!(q.metrics.dropped.get(), 2);
}

#[tokio::test]
async fn a_queued_recorder_writes_every_event_once_the_budget_allows() {
    let sim = kube_sim::Sim::start(kube_sim::SimConfig::bare())
        .await
        .unwrap();
    // A bucket with no spare token for a while: one token every 200 ms, none left now.
    let limit = crate::config::RateLimit { qps: 5.0, burst: 1 };
    let bucket = Arc::new(TokenBucket::with_clock(limit, Default::default()));
    assert_eq!(bucket.try_acquire(), Ok(()));
    let metrics = EventQueueMetrics::default();
    let recorder = Recorder::queued(
        sim.client(),
        EventSource::csi_provisioner(),
        Some(bucket),
        metrics.clone(),
    );
    let spec = EventSpec::warning(names::EVENT_VOLUME_FAILED_DELETE, "rpc error: boom");
    for _ in 0..3 {
        recorder.emit(pv_ref(), spec.clone());
    }
    recorder.emit(
        pv_ref(),
        EventSpec::normal(names::EVENT_PROVISIONING, "other"),
    );
    let events: Api<Event> = Api::namespaced(sim.client(), "default");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let list = loop {
        let list = events.list(&Default::default()).await.unwrap();
        if list.items.len() == 2 || std::time::Instant::now() > deadline {
            break list;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let counts: Vec<_> = list
        .items
        .iter()
        .map(|e| (e.reason.clone().unwrap_or_default(), e.count))
        .collect();
    assert!(
        counts.contains(&("VolumeFailedDelete".to_owned(), Some(3))),
        "{counts:?}"
    );
    assert!(
        counts.contains(&("Provisioning".to_owned(), Some(1))),
        "{counts:?}"
    );
    assert_eq!(metrics.queued.get(), 0);
}

/// A bound PV ends its wait-for-detach episode at every reconcile: ends with nothing of the
/// episode waiting take no room, so a burst of them never pushes real events out.
#[test]
fn ending_episodes_with_nothing_waiting_takes_no_room_in_the_queue() {
    let q = queue();
    let source = Arc::new(EventSource::csi_provisioner());
    let spec = EventSpec::normal(names::EVENT_PROVISIONING, "provisioning");
    q.push_event(source, pv_ref(), spec, at(0));
    let mut ended = 0;
    for i in 0..QUEUE_CAPACITY * 2 {
        q.end_episode(&format!("detach/pv-{i}"), || ended += 1);
    }
    assert_eq!(ended, QUEUE_CAPACITY * 2, "ended at once");
    assert_eq!(q.lock().len(), 1, "only the event waits");
    assert_eq!(q.metrics.dropped.get(), 0);
}

#[test]
fn an_episode_with_an_event_waiting_or_in_flight_ends_once_after_it() {
    let q = queue();
    let source = Arc::new(EventSource::csi_provisioner());
    let waiting = EventSpec::warning(names::EVENT_PROVISIONING_FAILED, "wait").once_per("ep");
    q.push_event(source.clone(), pv_ref(), waiting.clone(), at(0));
    let mut ended = false;
    q.end_episode("ep", || ended = true);
    q.end_episode("ep", || ended = true);
    assert!(!ended, "not before the waiting event is sent");
    let markers = |q: &EventQueue| {
        q.lock()
            .iter()
            .filter(|i| matches!(i, Queued::EndEpisode(k) if k == "ep"))
            .count()
    };
    assert_eq!(markers(&q), 1, "one marker, after the event");
    // The same event after the end opens a new episode: queued on its own, not merged into the
    // one before the marker.
    q.push_event(source.clone(), pv_ref(), waiting.clone(), at(1));
    assert_eq!(
        queued_events(&q),
        [("wait".to_owned(), 1), ("wait".to_owned(), 1)]
    );
    q.end_episode("ep", || ended = true);
    assert_eq!(markers(&q), 2, "the second occurrence gets its own end");
    for _ in 0..4 {
        q.pop();
        q.sent();
    }
    // Taken by the sender and not yet seen by the correlator: the end waits its turn.
    q.push_event(source, pv_ref(), waiting, at(2));
    assert!(matches!(q.pop(), Some(Queued::Event { .. })));
    q.end_episode("ep", || ended = true);
    assert!(!ended);
    assert_eq!(markers(&q), 1);
    q.sent();
    assert!(matches!(q.pop(), Some(Queued::EndEpisode(_))));
    q.end_episode("ep", || ended = true);
    assert!(ended, "nothing of the episode left: ended at once");
}

/// A QPS-5 bucket whose workers never pause (a request for a token every 10 ms until the handle
/// is aborted), returned once they have asked.
async fn saturated() -> (Arc<TokenBucket>, tokio::task::JoinHandle<()>) {
    let limit = crate::config::RateLimit {
        qps: 5.0,
        burst: 10,
    };
    let bucket = Arc::new(TokenBucket::with_clock(limit, Default::default()));
    let demand = bucket.clone();
    let workers = tokio::spawn(async move {
        loop {
            let _ = demand.try_acquire();
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    });
    tokio::time::sleep(Duration::from_millis(20)).await;
    (bucket, workers)
}

#[tokio::test(start_paused = true)]
async fn under_endless_demand_only_a_waiting_warning_forces_an_event_through() {
    let (bucket, workers) = saturated().await;
    let never = || false;
    let normal_alone =
        tokio::time::timeout(MAX_SPARE_WAIT * 5, spare_token(Some((&bucket, &never)))).await;
    assert!(
        normal_alone.is_err(),
        "a Normal event took a worker's token while no warning waited"
    );

    let start = tokio::time::Instant::now();
    let always = || true;
    tokio::time::timeout(MAX_SPARE_WAIT * 2, spare_token(Some((&bucket, &always))))
        .await
        .expect("a waiting warning gets its turn");
    assert!(start.elapsed() >= MAX_SPARE_WAIT);
    workers.abort();
}

#[test]
fn the_queue_knows_whether_a_warning_waits_until_it_is_taken_or_dropped() {
    let q = queue();
    let source = Arc::new(EventSource::csi_provisioner());
    let failed = EventSpec::warning(names::EVENT_PROVISIONING_FAILED, "quota exceeded");
    let started = EventSpec::normal(names::EVENT_PROVISIONING, "provisioning");
    q.push_event(source.clone(), pv_ref(), started.clone(), at(0));
    assert!(!q.warning_waits());
    q.push_event(source.clone(), pv_ref(), failed.clone(), at(1));
    q.push_event(source.clone(), pv_ref(), failed.clone(), at(2));
    assert!(q.warning_waits(), "merged repeats are one waiting warning");
    q.pop();
    assert!(
        q.warning_waits(),
        "taking the Normal event leaves the warning"
    );
    q.pop();
    assert!(!q.warning_waits(), "the warning was taken");

    q.push_event(source.clone(), pv_ref(), failed, at(3));
    for i in 0..QUEUE_CAPACITY {
        let spec = EventSpec::normal(names::EVENT_PROVISIONING, format!("event {i}"));
        q.push_event(source.clone(), pv_ref(), spec, at(4));
    }
    assert!(!q.warning_waits(), "the warning was dropped as the oldest");
}

#[tokio::test(start_paused = true)]
async fn under_endless_demand_a_lone_warning_is_written_and_a_lone_normal_event_waits() {
    let (client, log) = fake_client();
    let (bucket, workers) = saturated().await;
    let recorder = Recorder::queued(
        client,
        EventSource::csi_provisioner(),
        Some(bucket),
        EventQueueMetrics::default(),
    );
    let written = || log.lock().unwrap().requests.len();

    recorder.emit(
        pv_ref(),
        EventSpec::warning(names::EVENT_PROVISIONING_FAILED, "quota exceeded"),
    );
    tokio::time::sleep(MAX_SPARE_WAIT + Duration::from_secs(5)).await;
    assert_eq!(written(), 1, "the warning being sent forces its turn");

    recorder.emit(
        pv_ref(),
        EventSpec::normal(names::EVENT_PROVISIONING, "provisioning"),
    );
    tokio::time::sleep(MAX_SPARE_WAIT * 5).await;
    assert_eq!(written(), 1, "a Normal event alone waits for spare budget");

    workers.abort();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(written(), 2, "written once the workers leave a token spare");
}
