//! CRUD, conflicts, finalizers, patch types, pagination and selectors through kube-rs.

use k8s_openapi::api::core::v1::{Namespace, PersistentVolume, PersistentVolumeClaim};
use kube::api::{Api, DeleteParams, PostParams};
use kube_sim::{Sim, SimConfig};
use serde_json::json;

fn pv(name: &str) -> PersistentVolume {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {"name": name, "labels": {"app": "t"}},
        "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                 "csi": {"driver": "d.example.com", "volumeHandle": name}}
    }))
    .unwrap()
}

fn api_err(e: kube::Error) -> kube::core::Status {
    match e {
        kube::Error::Api(s) => *s,
        other => panic!("expected an API error, got {other:?}"),
    }
}

#[tokio::test]
async fn create_get_update_conflict_delete() {
    let sim = Sim::start(SimConfig::bare()).await.unwrap();
    let pvs: Api<PersistentVolume> = Api::all(sim.client());
    let created = pvs.create(&PostParams::default(), &pv("a")).await.unwrap();
    let meta = &created.metadata;
    assert!(meta.uid.is_some());
    assert!(meta.creation_timestamp.is_some());
    let rv1: u64 = meta.resource_version.as_deref().unwrap().parse().unwrap();
    assert_eq!(created.status.unwrap().phase.as_deref(), Some("Pending"));
    assert_eq!(
        created
            .spec
            .unwrap()
            .persistent_volume_reclaim_policy
            .as_deref(),
        Some("Retain")
    );

    let e = api_err(
        pvs.create(&PostParams::default(), &pv("a"))
            .await
            .unwrap_err(),
    );
    assert_eq!((e.code, e.reason.as_str()), (409, "AlreadyExists"));
    assert_eq!(e.message, "persistentvolumes \"a\" already exists");

    let mut got = pvs.get("a").await.unwrap();
    got.metadata.labels = Some([("x".to_string(), "y".to_string())].into());
    let updated = pvs
        .replace("a", &PostParams::default(), &got)
        .await
        .unwrap();
    let rv2: u64 = updated
        .metadata
        .resource_version
        .as_deref()
        .unwrap()
        .parse()
        .unwrap();
    assert!(rv2 > rv1);

    // `got` still carries the old resourceVersion: a stale write.
    let e = api_err(
        pvs.replace("a", &PostParams::default(), &got)
            .await
            .unwrap_err(),
    );
    assert_eq!((e.code, e.reason.as_str()), (409, "Conflict"));
    assert_eq!(
        e.message,
        "Operation cannot be fulfilled on persistentvolumes \"a\": the object has been modified; please apply your changes to the latest version and try again"
    );

    let e = api_err(pvs.get("missing").await.unwrap_err());
    assert_eq!(
        (e.code, e.reason.as_str(), e.message.as_str()),
        (404, "NotFound", "persistentvolumes \"missing\" not found")
    );

    pvs.delete("a", &DeleteParams::default()).await.unwrap();
    assert_eq!(api_err(pvs.get("a").await.unwrap_err()).code, 404);
    sim.shutdown().await;
}

#[tokio::test]
async fn two_racing_writers_exactly_one_conflicts() {
    let sim = Sim::start(SimConfig::bare()).await.unwrap();
    let pvs: Api<PersistentVolume> = Api::all(sim.client());
    pvs.create(&PostParams::default(), &pv("race"))
        .await
        .unwrap();
    let base = pvs.get("race").await.unwrap();
    let writers = (0..2).map(|i| {
        let pvs = pvs.clone();
        let mut obj = base.clone();
        obj.metadata.annotations = Some([("writer".to_string(), i.to_string())].into());
        tokio::spawn(async move { pvs.replace("race", &PostParams::default(), &obj).await })
    });
    let results: Vec<_> = futures::future::join_all(writers)
        .await
        .into_iter()
        .map(|r| r.unwrap())
        .collect();
    let ok = results.iter().filter(|r| r.is_ok()).count();
    let conflicts = results
        .iter()
        .filter(
            |r| matches!(r, Err(kube::Error::Api(s)) if s.code == 409 && s.reason == "Conflict"),
        )
        .count();
    assert_eq!((ok, conflicts), (1, 1), "{results:?}");
}

#[tokio::test]
async fn validation_rejects_with_field_causes() {
    let sim = Sim::start(SimConfig::bare()).await.unwrap();
    let pvs: Api<PersistentVolume> = Api::all(sim.client());
    let bad: PersistentVolume =
        serde_json::from_value(json!({"metadata": {"name": "Bad_Name"}, "spec": {}})).unwrap();
    let e = api_err(pvs.create(&PostParams::default(), &bad).await.unwrap_err());
    assert_eq!((e.code, e.reason.as_str()), (422, "Invalid"));
    assert!(e.message.starts_with("PersistentVolume \"Bad_Name\" is invalid: [metadata.name: Invalid value: \"Bad_Name\": a lowercase RFC 1123 subdomain"), "{}", e.message);
    let fields: Vec<String> = e
        .details
        .unwrap()
        .causes
        .into_iter()
        .map(|c| c.field)
        .collect();
    // kube-apiserver's order; a missing capacity is both Required and NotSupported.
    assert_eq!(
        fields,
        [
            "metadata.name",
            "spec.accessModes",
            "spec.capacity",
            "spec.capacity",
            "spec"
        ]
    );

    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(sim.client(), "default");
    let bad: PersistentVolumeClaim =
        serde_json::from_value(json!({"metadata": {"name": "c"}, "spec": {}})).unwrap();
    let e = api_err(pvcs.create(&PostParams::default(), &bad).await.unwrap_err());
    assert_eq!(
        e.message,
        "PersistentVolumeClaim \"c\" is invalid: [spec.accessModes: Required value: at least 1 access mode is required, spec.resources[storage]: Required value]"
    );

    let nowhere: Api<PersistentVolumeClaim> = Api::namespaced(sim.client(), "nowhere");
    let e = api_err(
        nowhere
            .create(&PostParams::default(), &bad)
            .await
            .unwrap_err(),
    );
    assert_eq!(
        (e.code, e.message.as_str()),
        (404, "namespaces \"nowhere\" not found")
    );
    let nss: Api<Namespace> = Api::all(sim.client());
    assert!(nss.get("default").await.is_ok());
}

/// A path of no served group (a CRD not installed, as snapshots on a bare 1.20 cluster) gets
/// kube-apiserver's plain-text "404 page not found"; an unknown resource of a served group gets a
/// `Status` 404.
#[tokio::test]
async fn unknown_groups_get_a_plain_404_and_unknown_resources_a_status() {
    let sim = Sim::start(SimConfig::bare()).await.unwrap();
    let send = |path: &'static str| {
        let client = sim.client();
        async move {
            let req = http::Request::get(path)
                .body(kube::client::Body::empty())
                .unwrap();
            let resp = client.send(req).await.unwrap();
            let status = resp.status().as_u16();
            let ct = resp.headers()[http::header::CONTENT_TYPE]
                .to_str()
                .unwrap()
                .to_owned();
            let body = resp.into_body().collect_bytes().await.unwrap();
            (status, ct, String::from_utf8(body.to_vec()).unwrap())
        }
    };
    for path in [
        "/apis/example.com/v1/namespaces/default/things",
        "/apis/example.com/v1",
        "/apis/example.com",
        "/nothing",
    ] {
        assert_eq!(
            send(path).await,
            (
                404,
                "text/plain; charset=utf-8".to_owned(),
                "404 page not found\n".to_owned()
            ),
            "{path}"
        );
    }
    let (status, ct, body) = send("/api/v1/things").await;
    assert_eq!((status, ct.as_str()), (404, "application/json"));
    assert!(
        body.contains("the server could not find the requested resource"),
        "{body}"
    );
}
