//! Watch semantics through kube-rs: resume after dropped watches, forced 410 Gone, bookmarks,
//! metadata-only watches, selector transitions, and reflectors converging on the server state.

use std::collections::BTreeMap;
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{PersistentVolume, Secret};
use kube::api::{
    Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use kube::core::PartialObjectMeta;
use kube::runtime::{WatchStreamExt, reflector, watcher};
use kube_sim::{FaultRule, Sim, SimConfig};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(15);

async fn wait_for<T, F, Fut>(what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn pv(name: &str) -> PersistentVolume {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"tier": "gold"}},
        "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"], "csi": {"driver": "d", "volumeHandle": name}}
    }))
    .unwrap()
}

/// name -> resourceVersion of what the server holds.
fn server_pvs(sim: &Sim) -> BTreeMap<String, String> {
    sim.objects("persistentvolumes")
        .iter()
        .map(|o| {
            (
                o["metadata"]["name"].as_str().unwrap().to_string(),
                o["metadata"]["resourceVersion"]
                    .as_str()
                    .unwrap()
                    .to_string(),
            )
        })
        .collect()
}

async fn annotate(pvs: &Api<PersistentVolume>, name: &str, v: &str) {
    pvs.patch(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"annotations": {"step": v}}})),
    )
    .await
    .unwrap();
}

#[tokio::test]
async fn reflector_converges_across_dropped_watches_and_forced_410() {
    let sim = Sim::start(SimConfig::bare()).await.unwrap();
    let pvs: Api<PersistentVolume> = Api::all(sim.client());
    for i in 0..7 {
        pvs.create(&PostParams::default(), &pv(&format!("pv-{i}")))
            .await
            .unwrap();
    }
    let (reader, writer) = reflector::store();
    let stream = reflector(
        writer,
        watcher(pvs.clone(), watcher::Config::default().page_size(3)),
    )
    .default_backoff();
    let task = tokio::spawn(stream.for_each(|_| futures::future::ready(())));
    let in_sync = || async {
        let local: BTreeMap<String, String> = reader
            .state()
            .iter()
            .map(|o| {
                (
                    o.metadata.name.clone().unwrap(),
                    o.metadata.resource_version.clone().unwrap(),
                )
            })
            .collect();
        (local == server_pvs(&sim)).then_some(())
    };
    wait_for("initial sync", in_sync).await;
    let lists_after_start = sim
        .counters()
        .count(Some("list"), Some("persistentvolumes"), None);
    assert!(
        lists_after_start >= 3,
        "paged initial list (7 objects, pages of 3)"
    );

    // A dropped watch resumes from its resourceVersion without relisting.
    annotate(&pvs, "pv-0", "a").await;
    sim.drop_watches();
    annotate(&pvs, "pv-1", "b").await;
    pvs.delete("pv-2", &DeleteParams::default()).await.unwrap();
    wait_for("sync after dropped watch", in_sync).await;
    assert_eq!(
        sim.counters()
            .count(Some("list"), Some("persistentvolumes"), None),
        lists_after_start
    );

    // Resume from a compacted resourceVersion: the watch is told 410 Gone and the watcher relists.
    let delay = sim.faults().add(
        FaultRule::latency(Duration::from_millis(300))
            .verb("watch")
            .resource("persistentvolumes")
            .times(1),
    );
    sim.drop_watches();
    annotate(&pvs, "pv-3", "c").await;
    pvs.create(&PostParams::default(), &pv("pv-new"))
        .await
        .unwrap();
    sim.compact();
    wait_for("sync after 410", in_sync).await;
    assert_eq!(sim.faults().hits(delay), 1);
    assert!(
        sim.counters()
            .count(Some("list"), Some("persistentvolumes"), None)
            > lists_after_start,
        "410 forces a relist"
    );
    task.abort();
}

#[tokio::test]
async fn raw_watch_reports_410_as_error_event_and_sends_bookmarks() {
    let sim = Sim::start(SimConfig {
        bookmark_interval: Duration::from_millis(50),
        ..SimConfig::bare()
    })
    .await
    .unwrap();
    let pvs: Api<PersistentVolume> = Api::all(sim.client());
    let first = pvs.create(&PostParams::default(), &pv("a")).await.unwrap();
    let old_rv = first.metadata.resource_version.unwrap();
    annotate(&pvs, "a", "x").await;
    sim.compact();
    let mut s = pvs
        .watch(&WatchParams::default(), &old_rv)
        .await
        .unwrap()
        .boxed();
    match s.try_next().await.unwrap() {
        Some(WatchEvent::Error(e)) => {
            assert_eq!((e.code, e.reason.as_str()), (410, "Expired"));
            assert!(
                e.message.starts_with("too old resource version: "),
                "{}",
                e.message
            );
        }
        other => panic!("expected a 410 ERROR event, got {other:?}"),
    }
    assert!(
        s.try_next().await.unwrap().is_none(),
        "the stream ends after the error"
    );

    let now_rv = sim.resource_version().to_string();
    let mut s = pvs
        .watch(&WatchParams::default().timeout(5), &now_rv)
        .await
        .unwrap()
        .boxed();
    annotate(&pvs, "a", "y").await;
    let mut next = s.try_next().await.unwrap();
    while let Some(WatchEvent::Bookmark(_)) = next {
        next = s.try_next().await.unwrap();
    }
    match next {
        Some(WatchEvent::Modified(o)) => assert_eq!(o.metadata.annotations.unwrap()["step"], "y"),
        other => panic!("expected MODIFIED, got {other:?}"),
    }
    let bm = tokio::time::timeout(WAIT, async {
        loop {
            if let Some(WatchEvent::Bookmark(b)) = s.try_next().await.unwrap() {
                return b;
            }
        }
    })
    .await
    .expect("a bookmark");
    assert!(bm.metadata.resource_version.parse::<u64>().unwrap() >= sim.resource_version() - 1);
}

#[tokio::test]
async fn label_selector_watch_sees_objects_leave_and_enter() {
    let sim = Sim::start(SimConfig::bare()).await.unwrap();
    let pvs: Api<PersistentVolume> = Api::all(sim.client());
    pvs.create(&PostParams::default(), &pv("a")).await.unwrap();
    let rv = sim.resource_version().to_string();
    let mut s = pvs
        .watch(&WatchParams::default().labels("tier=gold").timeout(10), &rv)
        .await
        .unwrap()
        .boxed();
    let relabel = |v: &'static str| {
        let pvs = pvs.clone();
        async move {
            pvs.patch(
                "a",
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"labels": {"tier": v}}})),
            )
            .await
            .unwrap()
        }
    };
    relabel("silver").await;
    relabel("gold").await;
    // Bookmarks come every second whatever happens, so on a busy machine one may fall between.
    let mut kinds = Vec::new();
    while kinds.len() < 2 {
        match s.try_next().await.unwrap().unwrap() {
            WatchEvent::Bookmark(_) => {}
            WatchEvent::Deleted(_) => kinds.push("DELETED"),
            WatchEvent::Added(_) => kinds.push("ADDED"),
            _ => kinds.push("other"),
        }
    }
    assert_eq!(kinds, ["DELETED", "ADDED"]);
}

#[tokio::test]
async fn metadata_only_list_get_and_watch() {
    let sim = Sim::start(SimConfig::bare()).await.unwrap();
    let secrets: Api<Secret> = Api::namespaced(sim.client(), "default");
    let s: Secret = serde_json::from_value(
        json!({"metadata": {"name": "s1", "labels": {"a": "b"}}, "data": {"k": "c2VjcmV0"}}),
    )
    .unwrap();
    secrets.create(&PostParams::default(), &s).await.unwrap();
    let m = secrets.get_metadata("s1").await.unwrap();
    assert_eq!(m.types.as_ref().unwrap().kind, "PartialObjectMetadata");
    assert_eq!(m.metadata.labels.unwrap()["a"], "b");
    let l = secrets.list_metadata(&ListParams::default()).await.unwrap();
    assert_eq!(l.items.len(), 1);

    let (reader, writer) = reflector::store();
    let stream = reflector(
        writer,
        watcher(
            Api::<PartialObjectMeta<Secret>>::namespaced(sim.client(), "default"),
            watcher::Config::default(),
        ),
    )
    .default_backoff();
    let task = tokio::spawn(stream.for_each(|_| futures::future::ready(())));
    secrets
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "s2"}})).unwrap(),
        )
        .await
        .unwrap();
    wait_for("metadata reflector sees both", || async {
        (reader.state().len() == 2).then_some(())
    })
    .await;
    task.abort();
    // The raw body of a metadata watch event carries no data.
    let raw = reqwest_like_get(
        &sim,
        "/api/v1/namespaces/default/secrets?watch=true&timeoutSeconds=1&resourceVersion=0",
        "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1",
    )
    .await;
    assert!(
        raw.contains("\"kind\":\"PartialObjectMetadata\"") && !raw.contains("c2VjcmV0"),
        "{raw}"
    );
}

/// GET through the kube client's raw request path, returning the body text.
async fn reqwest_like_get(sim: &Sim, path: &str, accept: &str) -> String {
    let req = http::Request::get(path)
        .header("Accept", accept)
        .body(Vec::new())
        .unwrap();
    sim.client().request_text(req).await.unwrap()
}

#[tokio::test]
async fn streaming_list_watcher_uses_send_initial_events() {
    let sim = Sim::start(SimConfig::bare()).await.unwrap();
    let pvs: Api<PersistentVolume> = Api::all(sim.client());
    for i in 0..3 {
        pvs.create(&PostParams::default(), &pv(&format!("s-{i}")))
            .await
            .unwrap();
    }
    let (reader, writer) = reflector::store();
    let cfg = watcher::Config::default().streaming_lists();
    let stream = reflector(writer, watcher(pvs.clone(), cfg)).default_backoff();
    let task = tokio::spawn(stream.for_each(|_| futures::future::ready(())));
    pvs.create(&PostParams::default(), &pv("s-3"))
        .await
        .unwrap();
    wait_for("streaming reflector sees all four", || async {
        (reader.state().len() == 4).then_some(())
    })
    .await;
    assert_eq!(
        sim.counters()
            .count(Some("list"), Some("persistentvolumes"), None),
        0,
        "no list call"
    );
    task.abort();
}

/// The status of a request the server refuses (code and message).
async fn refused(sim: &Sim, path: &str) -> (u16, String) {
    let req = http::Request::get(path).body(Vec::new()).unwrap();
    match sim.client().request_text(req).await {
        Err(kube::Error::Api(s)) => (s.code, s.message),
        other => panic!("{path}: expected a refusal, got {other:?}"),
    }
}

/// kube-apiserver validates ListOptions (a misplaced resourceVersionMatch is 422, not ignored);
/// kube-sim used to ignore them. Texts as kube-apiserver 1.33 words them (1.20's differ only for
/// watch: "resourceVersionMatch is forbidden for watch"; tests/kube_sim_vs_real.rs).
#[tokio::test]
async fn misplaced_resource_version_match_is_refused_as_kube_apiserver_does() {
    let sim = Sim::start(SimConfig::bare()).await.unwrap();
    let cases = [
        (
            "/api/v1/persistentvolumes?resourceVersionMatch=NotOlderThan",
            "ListOptions.meta.k8s.io \"\" is invalid: resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden unless resourceVersion is provided",
        ),
        (
            "/api/v1/persistentvolumes?resourceVersionMatch=Exact&resourceVersion=0",
            "ListOptions.meta.k8s.io \"\" is invalid: resourceVersionMatch: Forbidden: resourceVersionMatch \"exact\" is forbidden for resourceVersion \"0\"",
        ),
        (
            "/api/v1/persistentvolumes?resourceVersionMatch=Newest&resourceVersion=1",
            "ListOptions.meta.k8s.io \"\" is invalid: resourceVersionMatch: Unsupported value: \"Newest\": supported values: \"Exact\", \"NotOlderThan\", \"\"",
        ),
        (
            "/api/v1/persistentvolumes?watch=true&resourceVersionMatch=NotOlderThan&resourceVersion=0",
            "ListOptions.meta.k8s.io \"\" is invalid: resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided",
        ),
        (
            "/api/v1/persistentvolumes?watch=true&sendInitialEvents=true",
            "ListOptions.meta.k8s.io \"\" is invalid: resourceVersionMatch: Forbidden: sendInitialEvents requires setting resourceVersionMatch to NotOlderThan",
        ),
    ];
    for (path, message) in cases {
        assert_eq!(
            refused(&sim, path).await,
            (422, message.to_owned()),
            "{path}"
        );
    }
    // What clients send stays served: a list from any version, and a streaming list.
    let pvs: Api<PersistentVolume> = Api::all(sim.client());
    pvs.list(&ListParams::default().match_any()).await.unwrap();
    let req = http::Request::get(
        "/api/v1/persistentvolumes?watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true&timeoutSeconds=1",
    )
    .body(Vec::new())
    .unwrap();
    sim.client().request_text(req).await.unwrap();
}
