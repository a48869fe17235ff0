//! Finalizers and deletion, patch types, status subresource, pagination, selectors, the two
//! Event versions, faults and counters.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Event, PersistentVolume, PersistentVolumeClaim, Pod, Secret};
use k8s_openapi::api::events::v1::Event as EventV1;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch,
    PatchParams, PostParams, Preconditions,
};
use kube_sim::{FaultRule, Sim, SimConfig};
use serde_json::{Value, json};

fn obj<T: serde::de::DeserializeOwned>(v: Value) -> T {
    serde_json::from_value(v).unwrap()
}

fn status(e: kube::Error) -> kube::core::Status {
    match e {
        kube::Error::Api(s) => *s,
        other => panic!("expected an API error, got {other:?}"),
    }
}

fn pv(name: &str) -> PersistentVolume {
    obj(json!({"metadata": {"name": name},
               "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"], "csi": {"driver": "d", "volumeHandle": name}}}))
}

#[tokio::test]
async fn finalizers_hold_deletion_and_refuse_new_ones() {
    let sim = Sim::start(SimConfig::bare()).await.unwrap();
    let secrets: Api<Secret> = Api::namespaced(sim.client(), "default");
    let s: Secret = obj(json!({"metadata": {"name": "s", "finalizers": ["example.com/keep"]}}));
    let created = secrets.create(&PostParams::default(), &s).await.unwrap();

    let e = status(
        secrets
            .delete(
                "s",
                &DeleteParams::default().preconditions(Preconditions {
                    uid: Some("other".into()),
                    resource_version: None,
                }),
            )
            .await
            .unwrap_err(),
    );
    assert_eq!(e.code, 409);
    assert_eq!(
        e.message,
        format!(
            // kube-apiserver's BeforeDelete words it (the kind, not the resource).
            "Operation cannot be fulfilled on Secret \"s\": the UID in the precondition (other) does not match the UID in record ({}). The object might have been deleted and then recreated",
            created.metadata.uid.as_deref().unwrap()
        )
    );
    let stale = DeleteParams::default().preconditions(Preconditions {
        uid: None,
        resource_version: Some("1".into()),
    });
    assert_eq!(
        status(secrets.delete("s", &stale).await.unwrap_err()).code,
        409
    );

    let kept = secrets
        .delete("s", &DeleteParams::default())
        .await
        .unwrap()
        .left()
        .expect("object kept by its finalizer");
    assert!(kept.metadata.deletion_timestamp.is_some());
    assert_eq!(kept.metadata.deletion_grace_period_seconds, Some(0));

    let add = Patch::Json::<()>(obj(
        json!([{"op": "add", "path": "/metadata/finalizers/-", "value": "example.com/more"}]),
    ));
    let e = status(
        secrets
            .patch("s", &PatchParams::default(), &add)
            .await
            .unwrap_err(),
    );
    assert_eq!((e.code, e.reason.as_str()), (422, "Invalid"));
    assert_eq!(
        e.message,
        "Secret \"s\" is invalid: metadata.finalizers: Forbidden: no new finalizers can be added if the object is being deleted, found new finalizers []string{\"example.com/more\"}"
    );

    let clear = Patch::Json::<()>(obj(
        json!([{"op": "test", "path": "/metadata/finalizers/0", "value": "example.com/keep"},
                                              {"op": "remove", "path": "/metadata/finalizers"}]),
    ));
    secrets
        .patch("s", &PatchParams::default(), &clear)
        .await
        .unwrap();
    assert_eq!(
        status(secrets.get("s").await.unwrap_err()).code,
        404,
        "removing the last finalizer deletes it"
    );
}

#[tokio::test]
async fn patch_types_and_status_subresource() {
    let sim = Sim::start(SimConfig::bare()).await.unwrap();
    let pvs: Api<PersistentVolume> = Api::all(sim.client());
    pvs.create(&PostParams::default(), &pv("p")).await.unwrap();
    let pp = PatchParams::default();

    let failing_test = Patch::Json::<()>(obj(
        json!([{"op": "test", "path": "/metadata/name", "value": "other"}]),
    ));
    let e = status(pvs.patch("p", &pp, &failing_test).await.unwrap_err());
    assert_eq!((e.code, e.reason.as_str()), (422, "Invalid"));

    let sm =
        Patch::Strategic(json!({"metadata": {"finalizers": ["a/x", "a/y"], "labels": {"l": "1"}}}));
    pvs.patch("p", &pp, &sm).await.unwrap();
    let sm = Patch::Strategic(
        json!({"metadata": {"finalizers": ["a/z"], "$deleteFromPrimitiveList/finalizers": ["a/x"]}}),
    );
    let got = pvs.patch("p", &pp, &sm).await.unwrap();
    assert_eq!(
        got.metadata.finalizers.unwrap(),
        ["a/y", "a/z"],
        "finalizers merge as a set"
    );

    let before = pvs.get("p").await.unwrap();
    let merged = pvs
        .patch("p", &pp, &Patch::Merge(json!({"metadata": {"labels": {"l": null}}, "status": {"phase": "Failed"}, "spec": {"mountOptions": ["ro"]}})))
        .await
        .unwrap();
    assert_eq!(merged.status, before.status, "main resource ignores status");
    assert_eq!(merged.spec.unwrap().mount_options.unwrap(), ["ro"]);
    assert!(merged.metadata.labels.is_none_or(|l| l.is_empty()));

    let st = pvs
        .patch_status(
            "p",
            &pp,
            &Patch::Merge(json!({"status": {"phase": "Failed"}, "spec": {"mountOptions": ["rw"]}})),
        )
        .await
        .unwrap();
    assert_eq!(st.status.unwrap().phase.as_deref(), Some("Failed"));
    assert_eq!(
        st.spec.unwrap().mount_options.unwrap(),
        ["ro"],
        "status ignores spec"
    );

    // An unchanged write is not a write: same resourceVersion.
    let again = pvs
        .patch(
            "p",
            &pp,
            &Patch::Merge(json!({"spec": {"mountOptions": ["ro"]}})),
        )
        .await
        .unwrap();
    assert_eq!(
        again.metadata.resource_version,
        st.metadata.resource_version
    );

    // Custom resources do not take strategic merge patch.
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("snapshot.storage.k8s.io", "v1", "VolumeSnapshotClass"),
        "volumesnapshotclasses",
    );
    let vsc: Api<DynamicObject> = Api::all_with(sim.client(), &ar);
    let mut o = DynamicObject::new("snapclass", &ar);
    o.data = json!({"driver": "d", "deletionPolicy": "Delete"});
    let made = vsc.create(&PostParams::default(), &o).await.unwrap();
    assert_eq!(made.metadata.generation, Some(1));
    let e = status(
        vsc.patch("snapclass", &pp, &Patch::Strategic(json!({"driver": "e"})))
            .await
            .unwrap_err(),
    );
    assert_eq!(e.code, 415);
}

#[tokio::test]
async fn pagination_and_selectors() {
    let sim = Sim::start(SimConfig::bare()).await.unwrap();
    let pvs: Api<PersistentVolume> = Api::all(sim.client());
    for i in 0..7 {
        let mut p = pv(&format!("p{i}"));
        p.metadata.labels = Some(
            [(
                "parity".to_string(),
                if i % 2 == 0 { "even" } else { "odd" }.to_string(),
            )]
            .into(),
        );
        pvs.create(&PostParams::default(), &p).await.unwrap();
    }
    let mut names = Vec::new();
    let mut lp = ListParams::default().limit(3);
    let first = pvs.list(&lp).await.unwrap();
    assert_eq!(first.metadata.remaining_item_count, Some(4));
    let list_rv = first.metadata.resource_version.clone();
    // Changes between pages do not show: later pages come from the first page's snapshot.
    pvs.delete("p5", &DeleteParams::default()).await.unwrap();
    pvs.create(&PostParams::default(), &pv("p9")).await.unwrap();
    pvs.patch(
        "p4",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"parity": "changed"}}})),
    )
    .await
    .unwrap();
    let mut page = first;
    let mut p4_parity = String::new();
    loop {
        if let Some(p4) = page
            .items
            .iter()
            .find(|p| p.metadata.name.as_deref() == Some("p4"))
        {
            p4_parity = p4.metadata.labels.as_ref().unwrap()["parity"].clone();
        }
        assert_eq!(
            page.metadata.resource_version, list_rv,
            "every page reports the first page's resourceVersion"
        );
        names.extend(page.items.iter().map(|p| p.metadata.name.clone().unwrap()));
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(c) => {
                lp = lp.continue_token(&c);
                page = pvs.list(&lp).await.unwrap();
            }
            None => break,
        }
    }
    assert_eq!(names, ["p0", "p1", "p2", "p3", "p4", "p5", "p6"]);
    assert_eq!(p4_parity, "even");
    let exact = pvs
        .list(
            &ListParams::default()
                .at(list_rv.as_deref().unwrap())
                .matching(kube::api::VersionMatch::Exact),
        )
        .await
        .unwrap();
    assert_eq!(
        exact.items.len(),
        7,
        "an exact list at the old resourceVersion sees the old state"
    );
    assert!(
        exact
            .items
            .iter()
            .all(|p| p.metadata.name.as_deref() != Some("p9"))
    );
    let now: Vec<_> = pvs
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|p| p.metadata.name.unwrap())
        .collect();
    assert_eq!(now, ["p0", "p1", "p2", "p3", "p4", "p6", "p9"]);
    pvs.delete("p9", &DeleteParams::default()).await.unwrap();

    let e = status(
        pvs.list(&ListParams::default().continue_token("garbage"))
            .await
            .unwrap_err(),
    );
    assert_eq!(e.code, 400);
    let token = pvs
        .list(&ListParams::default().limit(2))
        .await
        .unwrap()
        .metadata
        .continue_
        .unwrap();
    pvs.delete("p6", &DeleteParams::default()).await.unwrap();
    sim.compact();
    let e = status(
        pvs.list(&ListParams::default().limit(2).continue_token(&token))
            .await
            .unwrap_err(),
    );
    assert_eq!((e.code, e.reason.as_str()), (410, "Expired"));

    let odd = pvs
        .list(&ListParams::default().labels("parity=odd"))
        .await
        .unwrap();
    assert_eq!(odd.items.len(), 2, "p1 and p3 (p5 is deleted)");
    let notin = pvs
        .list(&ListParams::default().labels("parity notin (odd),parity"))
        .await
        .unwrap();
    assert_eq!(notin.items.len(), 3, "p0, p2 and p4 (relabelled)");
    let one = pvs
        .list(&ListParams::default().fields("metadata.name=p3"))
        .await
        .unwrap();
    assert_eq!(one.items.len(), 1);
    let e = status(
        pvs.list(&ListParams::default().fields("spec.csi.driver=d"))
            .await
            .unwrap_err(),
    );
    assert_eq!(
        (e.code, e.message.as_str()),
        (
            400,
            "\"spec.csi.driver\" is not a known field selector: only \"metadata.name\", \"metadata.namespace\""
        )
    );

    let pods: Api<Pod> = Api::namespaced(sim.client(), "default");
    for (n, node) in [("a", "n1"), ("b", "n2")] {
        let p: Pod = obj(
            json!({"metadata": {"name": n}, "spec": {"nodeName": node, "containers": [{"name": "c", "image": "i"}]}}),
        );
        pods.create(&PostParams::default(), &p).await.unwrap();
    }
    let on_n2 = pods
        .list(&ListParams::default().fields("spec.nodeName=n2"))
        .await
        .unwrap();
    assert_eq!(
        on_n2
            .items
            .iter()
            .map(|p| p.metadata.name.clone().unwrap())
            .collect::<Vec<_>>(),
        ["b"]
    );
}

#[tokio::test]
async fn events_are_one_store_seen_through_two_versions() {
    let sim = Sim::start(SimConfig::bare()).await.unwrap();
    let v1: Api<EventV1> = Api::namespaced(sim.client(), "default");
    let e: EventV1 = obj(json!({
        "metadata": {"name": "pvc-a.1"}, "eventTime": "2025-01-01T00:00:00.000000Z", "type": "Normal", "reason": "Provisioning",
        "action": "Provision", "note": "External provisioner is provisioning volume for claim \"default/a\"",
        "reportingController": "d.example.com_csi-provisioner", "reportingInstance": "node-1",
        "regarding": {"kind": "PersistentVolumeClaim", "namespace": "default", "name": "a", "uid": "u1", "apiVersion": "v1"}
    }));
    v1.create(&PostParams::default(), &e).await.unwrap();
    let core: Api<Event> = Api::namespaced(sim.client(), "default");
    let l = core
        .list(
            &ListParams::default()
                .fields("involvedObject.name=a,involvedObject.kind=PersistentVolumeClaim"),
        )
        .await
        .unwrap();
    assert_eq!(l.items.len(), 1);
    let ce = &l.items[0];
    assert_eq!(
        ce.message.as_deref(),
        Some("External provisioner is provisioning volume for claim \"default/a\"")
    );
    assert_eq!(ce.involved_object.uid.as_deref(), Some("u1"));
    assert_eq!(
        ce.reporting_component.as_deref(),
        Some("d.example.com_csi-provisioner")
    );

    let bad: EventV1 = obj(json!({"metadata": {"name": "x"}, "type": "Normal", "reason": "R"}));
    let err = status(v1.create(&PostParams::default(), &bad).await.unwrap_err());
    assert_eq!(err.code, 422);

    // A core event read back through events.k8s.io.
    let c: Event = obj(
        json!({"metadata": {"name": "legacy"}, "involvedObject": {"kind": "PersistentVolumeClaim", "namespace": "default", "name": "b"},
                              "reason": "ProvisioningFailed", "message": "boom", "type": "Warning", "count": 3, "source": {"component": "c"}}),
    );
    core.create(&PostParams::default(), &c).await.unwrap();
    let back = v1.get("legacy").await.unwrap();
    assert_eq!(back.note.as_deref(), Some("boom"));
    assert_eq!(back.deprecated_count, Some(3));
    assert_eq!(back.regarding.unwrap().name.as_deref(), Some("b"));
}

#[tokio::test]
async fn faults_and_counters() {
    let sim = Sim::start(SimConfig::bare()).await.unwrap();
    // kube's default client retries 429/503/504 by itself; look at the raw answers here.
    let mut cfg = kube::Config::new(sim.url().parse().unwrap());
    cfg.default_retry = false;
    let raw = kube::Client::try_from(cfg).unwrap();
    let pvs: Api<PersistentVolume> = Api::all(raw.clone());
    let faults = sim.faults();
    faults.add(
        FaultRule::error(429)
            .verb("create")
            .resource("persistentvolumes")
            .retry_after(7)
            .times(1),
    );
    let e = status(
        pvs.create(&PostParams::default(), &pv("f"))
            .await
            .unwrap_err(),
    );
    assert_eq!((e.code, e.reason.as_str()), (429, "TooManyRequests"));
    assert_eq!(e.details.unwrap().retry_after_seconds, 7);
    pvs.create(&PostParams::default(), &pv("f")).await.unwrap();

    faults.add(FaultRule::error(409).verb("update").times(1));
    faults.add(
        FaultRule::error(503)
            .verb("get")
            .name("f")
            .rate(1.0)
            .times(2),
    );
    assert_eq!(status(pvs.get("f").await.unwrap_err()).code, 503);
    assert_eq!(status(pvs.get("f").await.unwrap_err()).code, 503);
    let got = pvs.get("f").await.unwrap();
    let e = status(
        pvs.replace("f", &PostParams::default(), &got)
            .await
            .unwrap_err(),
    );
    assert_eq!((e.code, e.reason.as_str()), (409, "Conflict"));
    faults.add(FaultRule::error(500).resource("persistentvolumeclaims"));
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(raw, "default");
    assert_eq!(
        status(pvcs.list(&ListParams::default()).await.unwrap_err()).code,
        500
    );
    faults.clear();
    assert!(pvcs.list(&ListParams::default()).await.is_ok());

    let c = sim.counters();
    assert_eq!(c.get("create", "persistentvolumes", 429), 1);
    assert_eq!(c.get("create", "persistentvolumes", 201), 1);
    assert_eq!(c.get("get", "persistentvolumes", 503), 2);
    assert_eq!(c.get("update", "persistentvolumes", 409), 1);
    assert_eq!(c.writes_to(Some("persistentvolumes")), 3);
    assert_eq!(
        c.count(Some("list"), Some("persistentvolumeclaims"), None),
        2
    );

    // The default client retries a 503 transparently.
    let retried = faults.add(FaultRule::error(503).verb("get").times(1));
    let retrying: Api<PersistentVolume> = Api::all(sim.client());
    retrying.get("f").await.unwrap();
    assert_eq!(faults.hits(retried), 1);

    // Latency is applied before serving.
    faults.add(
        FaultRule::latency(Duration::from_millis(200))
            .verb("get")
            .times(1),
    );
    let t = std::time::Instant::now();
    pvs.get("f").await.unwrap();
    assert!(t.elapsed() >= Duration::from_millis(200));

    // Pause holds requests until resume.
    sim.pause();
    let pending = tokio::spawn({
        let pvs = pvs.clone();
        async move { pvs.get("f").await }
    });
    sim.settle(Duration::from_secs(1)).await.unwrap();
    assert!(!pending.is_finished());
    sim.resume();
    assert!(pending.await.unwrap().is_ok());
}

#[tokio::test]
async fn admin_routes_and_deletecollection() {
    let sim = Sim::start(SimConfig::bare()).await.unwrap();
    let client = sim.client();
    let call = |method: &str, path: &str, body: &str| {
        let req = http::Request::builder()
            .method(method)
            .uri(path)
            .header("Content-Type", "application/json")
            .body(body.as_bytes().to_vec())
            .unwrap();
        let client = client.clone();
        async move { serde_json::from_str::<Value>(&client.request_text(req).await.unwrap()).unwrap() }
    };
    let added = call(
        "POST",
        "/sim/faults",
        r#"{"verb":"create","resource":"secrets","status":500,"count":1}"#,
    )
    .await;
    assert!(added["id"].as_u64().is_some());
    let secrets: Api<Secret> = Api::namespaced(sim.client(), "default");
    let s = |n: &str| -> Secret { obj(json!({"metadata": {"name": n, "labels": {"k": "v"}}})) };
    assert_eq!(
        status(
            secrets
                .create(&PostParams::default(), &s("a"))
                .await
                .unwrap_err()
        )
        .code,
        500
    );
    for n in ["a", "b", "c"] {
        secrets.create(&PostParams::default(), &s(n)).await.unwrap();
    }
    let counters = call("GET", "/sim/counters", "").await;
    let row = counters["requests"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["verb"] == "create" && r["code"] == 500)
        .unwrap()
        .clone();
    assert_eq!(row["count"], 1);
    let dump = call("GET", "/sim/dump", "").await;
    assert_eq!(dump["objects"]["secrets"].as_array().unwrap().len(), 3);

    let gone = secrets
        .delete_collection(
            &DeleteParams::default(),
            &ListParams::default().labels("k=v"),
        )
        .await
        .unwrap();
    assert_eq!(gone.left().unwrap().items.len(), 3);
    assert!(
        secrets
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );
    assert_eq!(call("POST", "/sim/pause", "").await["paused"], true);
    assert_eq!(call("POST", "/sim/resume", "").await["paused"], false);
    assert_eq!(call("DELETE", "/sim/faults", "").await["cleared"], true);
}

#[tokio::test]
async fn secret_string_data_is_stored_as_data() {
    let sim = Sim::start(SimConfig::bare()).await.unwrap();
    let secrets: Api<Secret> = Api::namespaced(sim.client(), "default");
    let s: Secret = obj(json!({"metadata": {"name": "creds"}, "stringData": {"user": "admin"}}));
    let made = secrets.create(&PostParams::default(), &s).await.unwrap();
    assert_eq!(made.data.unwrap()["user"].0, b"admin");
    assert_eq!(made.type_.as_deref(), Some("Opaque"));
    assert!(made.string_data.is_none());
}

#[tokio::test]
async fn protobuf_bodies_get_415_naming_the_content_type() {
    let sim = Sim::start(SimConfig::bare()).await.unwrap();
    let client = sim.client();
    // What client-go sends by default for built-in types: the "k8s\0" envelope, then protobuf.
    let body = b"k8s\x00\x0a\x0e\x0a\x02v1\x12\x08PersistentVolume".to_vec();
    for (method, path) in [
        ("POST", "/api/v1/persistentvolumes"),
        ("PUT", "/api/v1/persistentvolumes/p1"),
        ("PUT", "/api/v1/persistentvolumes/p1/status"),
    ] {
        let req = http::Request::builder()
            .method(method)
            .uri(path)
            .header("Content-Type", "application/vnd.kubernetes.protobuf")
            .body(body.clone())
            .unwrap();
        let s = status(client.request_text(req).await.unwrap_err());
        assert_eq!(s.code, 415, "{method} {path}: {s:?}");
        assert_eq!(s.reason, "UnsupportedMediaType");
        assert!(
            s.message.contains("application/vnd.kubernetes.protobuf")
                && s.message.contains("JSON")
                && !s.message.contains("could not be decoded"),
            "{}",
            s.message
        );
    }
    // The same object as JSON is accepted.
    let pvs: Api<PersistentVolume> = Api::all(sim.client());
    pvs.create(&PostParams::default(), &pv("p1")).await.unwrap();
    assert_eq!(sim.counters().get("create", "persistentvolumes", 415), 1);
}

#[tokio::test]
async fn counters_per_user_agent() {
    let sim = Sim::start(SimConfig::bare()).await.unwrap();
    let client = sim.client();
    let get = |agent: &'static str| {
        let req = http::Request::get("/api/v1/persistentvolumes")
            .header("User-Agent", agent)
            .body(Vec::new())
            .unwrap();
        let client = client.clone();
        async move { client.request_text(req).await.unwrap() }
    };
    get("bench/1.0").await;
    get("csi-provisioner/v6.3.0 (linux/amd64) kubernetes/abc").await;
    get("csi-provisioner/v6.3.0 (linux/amd64) kubernetes/abc").await;
    let c = sim.counters();
    assert_eq!(c.count(Some("list"), Some("persistentvolumes"), None), 3);
    let others = c.agent(|a| !a.starts_with("bench/"));
    assert_eq!(others.get("list", "persistentvolumes", 200), 2);
    assert_eq!(c.agent(|a| a.starts_with("bench/")).total(), 1);
    let rows = c.agent_rows();
    assert!(
        rows.iter()
            .any(|r| r.agent.starts_with("csi-provisioner/") && r.count == 2),
        "{rows:?}"
    );
    assert_eq!(others.since(&others), kube_sim::Counters::default());
}

/// Go never stores an empty `omitempty` list or map: a finalizer list emptied by a patch reads
/// back absent, as from a real API server (the differential suite compares such objects).
#[tokio::test]
async fn emptied_metadata_lists_and_maps_read_back_absent() {
    let sim = Sim::start(SimConfig::bare()).await.unwrap();
    let secrets: Api<Secret> = Api::namespaced(sim.client(), "default");
    let s: Secret = obj(
        json!({"metadata": {"name": "s", "finalizers": ["example.com/keep"],
        "labels": {}, "annotations": {"a": "b"}}}),
    );
    secrets.create(&PostParams::default(), &s).await.unwrap();
    let patch = json!({"metadata": {"finalizers": [], "annotations": {"a": null}}});
    secrets
        .patch("s", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    let raw = sim.object("secrets", "default", "s").unwrap();
    let meta = raw["metadata"].as_object().unwrap();
    assert!(!meta.contains_key("finalizers"), "{raw}");
    assert!(!meta.contains_key("labels"), "{raw}");
    assert!(!meta.contains_key("annotations"), "{raw}");
}

/// What a delete answers, as kube-apiserver 1.20 does: the deleted object for PVs (and claims,
/// Pods, StorageClasses, CSINodes), a `Status` for Secrets (and Leases, Nodes, Events).
#[tokio::test]
async fn a_delete_answers_the_object_or_a_status_as_the_real_registry_does() {
    let sim = Sim::start(SimConfig::bare()).await.unwrap();
    let pvs: Api<PersistentVolume> = Api::all(sim.client());
    pvs.create(&PostParams::default(), &pv("gone"))
        .await
        .unwrap();
    let answer = pvs.delete("gone", &DeleteParams::default()).await.unwrap();
    let deleted = answer.left().expect("the deleted PV");
    assert_eq!(deleted.metadata.name.as_deref(), Some("gone"));
    let secrets: Api<Secret> = Api::namespaced(sim.client(), "default");
    secrets
        .create(
            &PostParams::default(),
            &obj(json!({"metadata": {"name": "s"}})),
        )
        .await
        .unwrap();
    let answer = secrets.delete("s", &DeleteParams::default()).await.unwrap();
    assert!(answer.is_right(), "a Status for a Secret: {answer:?}");
}
