//! Tests for `k8s::patch`: the pure patch builders, and the retry loop against a one-object fake
//! API server that applies JSON patches for real (a failed `test` op answers 422, as the API server
//! does) and lets a test play "another controller" between our read and our write.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use http::{Method, Request, Response, StatusCode};
use k8s_openapi::api::core::v1::PersistentVolume;
use kube::client::Body;
use kube::{Api, Client};
use serde_json::{Value, json};

use super::*;
use crate::names::FINALIZER_PV_DELETION_PROTECTION as OURS;
use crate::testing::pv;

const ATTACHER: &str = "external-attacher/mock-csi-test";

fn apply(meta_holder: &PersistentVolume, step: &Step) -> Result<Value, json_patch::PatchError> {
    let mut doc = serde_json::to_value(meta_holder).unwrap();
    match step {
        Step::Write(patch) => json_patch::patch(&mut doc, &patch.0).map(|()| doc),
        other => panic!("expected a write, got {other:?}"),
    }
}

fn finalizers(doc: &Value) -> Vec<String> {
    doc["metadata"]["finalizers"]
        .as_array()
        .map(|a| a.iter().map(|v| v.as_str().unwrap().to_owned()).collect())
        .unwrap_or_default()
}

// === Pure builders ===

#[test]
fn removal_names_the_index_of_our_finalizer_and_checks_it_is_still_ours() {
    let obj = pv("pv-1").finalizer(ATTACHER).finalizer(OURS).build();
    let Step::Write(patch) = remove_finalizer_step(&obj.metadata, OURS) else {
        panic!("expected a write");
    };
    assert_eq!(
        serde_json::to_value(&patch).unwrap(),
        json!([
            {"op": "test", "path": "/metadata/uid", "value": "uid-pv-1"},
            {"op": "test", "path": "/metadata/finalizers/1", "value": OURS},
            {"op": "remove", "path": "/metadata/finalizers/1"},
        ])
    );
}

#[test]
fn removal_computed_from_a_stale_copy_fails_instead_of_removing_someone_elses_finalizer() {
    // Cached copy: [attacher, ours]. Meanwhile the attacher removed its own: server has [ours].
    let stale = pv("pv-1").finalizer(ATTACHER).finalizer(OURS).build();
    let step = remove_finalizer_step(&stale.metadata, OURS);
    let server = pv("pv-1").finalizer(OURS).build();
    assert!(apply(&server, &step).is_err());
}

#[test]
fn removal_keeps_every_other_finalizer() {
    let obj = pv("pv-1")
        .finalizer("kubernetes.io/pv-protection")
        .finalizer(OURS)
        .finalizer(ATTACHER)
        .build();
    let doc = apply(&obj, &remove_finalizer_step(&obj.metadata, OURS)).unwrap();
    assert_eq!(finalizers(&doc), ["kubernetes.io/pv-protection", ATTACHER]);
}

#[test]
fn removing_an_absent_finalizer_is_already_done() {
    let obj = pv("pv-1").finalizer(ATTACHER).build();
    assert_eq!(
        remove_finalizer_step(&obj.metadata, OURS),
        Step::AlreadyDone
    );
    let no_list = pv("pv-1").build();
    assert_eq!(
        remove_finalizer_step(&no_list.metadata, OURS),
        Step::AlreadyDone
    );
}

#[test]
fn adding_appends_after_checking_the_list_we_read() {
    let obj = pv("pv-1").finalizer(ATTACHER).build();
    let step = add_finalizer_step(&obj.metadata, OURS);
    assert_eq!(finalizers(&apply(&obj, &step).unwrap()), [ATTACHER, OURS]);
    // The list changed since we read it: the append is refused rather than based on old data.
    let changed = pv("pv-1").build();
    assert!(apply(&changed, &step).is_err());
}

#[test]
fn adding_to_an_object_without_finalizers_pins_the_resource_version() {
    let obj = pv("pv-1").resource_version("7").build();
    let step = add_finalizer_step(&obj.metadata, OURS);
    assert_eq!(finalizers(&apply(&obj, &step).unwrap()), [OURS]);
    // Someone created the list (and so bumped the resourceVersion) meanwhile: not replaced.
    let raced = pv("pv-1").resource_version("8").finalizer(ATTACHER).build();
    assert!(apply(&raced, &step).is_err());
}

#[test]
fn adding_a_present_finalizer_is_already_done_and_a_deleting_object_refuses_it() {
    let has = pv("pv-1").finalizer(OURS).deleting().build();
    assert_eq!(add_finalizer_step(&has.metadata, OURS), Step::AlreadyDone);
    let deleting = pv("pv-1").finalizer(ATTACHER).deleting().build();
    assert_eq!(
        add_finalizer_step(&deleting.metadata, OURS),
        Step::ObjectDeleting
    );
}

#[test]
fn every_write_refuses_an_object_recreated_under_the_same_name() {
    let ours = pv("pv-1").finalizer(OURS).annotation("a/b", "1").build();
    let recreated = pv("pv-1")
        .uid("another")
        .finalizer(OURS)
        .annotation("a/b", "1")
        .build();
    for step in [
        remove_finalizer_step(&ours.metadata, OURS),
        add_finalizer_step(&pv("pv-1").finalizer(ATTACHER).build().metadata, OURS),
        set_annotation_step(&ours.metadata, "a/b", "2"),
        remove_annotation_step(&ours.metadata, "a/b"),
    ] {
        assert!(apply(&recreated, &step).is_err(), "{step:?}");
    }
}

#[test]
fn annotation_keys_with_slashes_are_escaped_and_only_that_key_changes() {
    let obj = pv("pv-1")
        .annotation("example.com/keep", "k")
        .annotation("pv.kubernetes.io/provisioned-by", "old")
        .build();
    let doc = apply(
        &obj,
        &set_annotation_step(&obj.metadata, "pv.kubernetes.io/provisioned-by", "new"),
    )
    .unwrap();
    assert_eq!(
        doc["metadata"]["annotations"],
        json!({"example.com/keep": "k", "pv.kubernetes.io/provisioned-by": "new"})
    );
    let doc = apply(
        &obj,
        &remove_annotation_step(&obj.metadata, "pv.kubernetes.io/provisioned-by"),
    )
    .unwrap();
    assert_eq!(
        doc["metadata"]["annotations"],
        json!({"example.com/keep": "k"})
    );
}

#[test]
fn setting_the_first_annotation_creates_the_map_guarded_by_resource_version() {
    let obj = pv("pv-1").resource_version("3").build();
    let step = set_annotation_step(&obj.metadata, "a/b", "v");
    let doc = apply(&obj, &step).unwrap();
    assert_eq!(doc["metadata"]["annotations"], json!({"a/b": "v"}));
    let raced = pv("pv-1")
        .resource_version("4")
        .annotation("x", "y")
        .build();
    assert!(apply(&raced, &step).is_err());
}

#[test]
fn a_conditional_annotation_removal_only_removes_the_value_it_was_decided_on() {
    let key = "volume.kubernetes.io/selected-node";
    let decided = pv("pv-1").annotation(key, "n1").build();
    let step = remove_annotation_if_step(&decided.metadata, key, "n1");
    let removed = apply(&decided, &step).unwrap();
    assert!(removed["metadata"]["annotations"].get(key).is_none());
    // Meanwhile the scheduler selected n2: the write computed from the old copy is refused.
    let reselected = pv("pv-1").annotation(key, "n2").build();
    assert!(apply(&reselected, &step).is_err());
    assert_eq!(
        remove_annotation_if_step(&reselected.metadata, key, "n1"),
        Step::AlreadyDone
    );
}

#[test]
fn annotation_steps_that_change_nothing_are_already_done() {
    let obj = pv("pv-1").annotation("a", "1").build();
    assert_eq!(
        set_annotation_step(&obj.metadata, "a", "1"),
        Step::AlreadyDone
    );
    assert_eq!(
        remove_annotation_step(&obj.metadata, "b"),
        Step::AlreadyDone
    );
}

#[test]
fn the_steps_cover_upstreams_add_and_remove_finalizer_cases() {
    // TestRemoveFinalizer / TestAddFinalizer, as (list before, step, list after or None = no write).
    type Case = (
        &'static [&'static str],
        fn(&ObjectMeta) -> Step,
        Option<&'static [&'static str]>,
    );
    let remove: fn(&ObjectMeta) -> Step = |m| remove_finalizer_step(m, OURS);
    let add: fn(&ObjectMeta) -> Step = |m| add_finalizer_step(m, OURS);
    let cases: &[Case] = &[
        (&[OURS], remove, Some(&[])),
        (&["dummy"], remove, None),
        (&["dummy", OURS], remove, Some(&["dummy"])),
        (&[], remove, None),
        (&[OURS], add, None),
        (&[], add, Some(&[OURS])),
        (&["dummy"], add, Some(&["dummy", OURS])),
    ];
    for (i, (before, step, after)) in cases.iter().enumerate() {
        let obj = before
            .iter()
            .fold(pv("pv-1"), |b, f| b.finalizer(f))
            .build();
        let step = step(&obj.metadata);
        match after {
            None => assert_eq!(step, Step::AlreadyDone, "case {i}"),
            Some(after) => assert_eq!(finalizers(&apply(&obj, &step).unwrap()), *after, "case {i}"),
        }
    }
    // An explicitly empty list is handled like a missing one.
    let mut empty = pv("pv-1").build();
    empty.metadata.finalizers = Some(vec![]);
    assert_eq!(
        finalizers(&apply(&empty, &add_finalizer_step(&empty.metadata, OURS)).unwrap()),
        [OURS]
    );
}

// === Retry loop against a fake API server ===

type Interference = Box<dyn FnMut(&mut Option<Value>) + Send>;

/// One object behind `/api/v1/persistentvolumes/<name>`.
#[derive(Default)]
struct Server {
    obj: Option<Value>,
    /// Run before handling the next PATCH each: "another controller" writing in between.
    before_patch: VecDeque<Interference>,
    /// Answer the next PATCHes with these errors instead of applying them.
    patch_errors: VecDeque<(u16, &'static str)>,
    /// Run before handling the next PUT each.
    before_put: VecDeque<Interference>,
    /// Method of every request, in order.
    calls: Vec<Method>,
}

fn bump(obj: &mut Value) {
    let rv: u64 = obj["metadata"]["resourceVersion"]
        .as_str()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    obj["metadata"]["resourceVersion"] = json!((rv + 1).to_string());
}

fn status(code: u16, reason: &str, message: &str) -> Response<Body> {
    let body = json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {},
        "status": "Failure", "message": message, "reason": reason, "code": code,
    });
    let mut resp = Response::new(Body::from(serde_json::to_vec(&body).unwrap()));
    *resp.status_mut() = StatusCode::from_u16(code).unwrap();
    resp
}

fn ok(obj: &Value) -> Response<Body> {
    Response::new(Body::from(serde_json::to_vec(obj).unwrap()))
}

async fn handle(server: Arc<Mutex<Server>>, req: Request<Body>) -> Response<Body> {
    let method = req.method().clone();
    let body = req.into_body().collect_bytes().await.unwrap();
    let mut s = server.lock().unwrap();
    s.calls.push(method.clone());
    match method {
        Method::GET => match &s.obj {
            Some(obj) => ok(obj),
            None => status(404, "NotFound", "persistentvolumes \"pv-1\" not found"),
        },
        Method::PATCH => {
            if let Some(mut interfere) = s.before_patch.pop_front() {
                interfere(&mut s.obj);
            }
            if let Some((code, reason)) = s.patch_errors.pop_front() {
                return status(code, reason, "scripted failure");
            }
            let Some(obj) = s.obj.as_mut() else {
                return status(404, "NotFound", "persistentvolumes \"pv-1\" not found");
            };
            let patch: json_patch::Patch = serde_json::from_slice(&body).unwrap();
            let mut patched = obj.clone();
            if let Err(e) = json_patch::patch(&mut patched, &patch.0) {
                return status(
                    422,
                    "Invalid",
                    &format!("the server rejected our request: {e}"),
                );
            }
            // The API server's rule that `add_finalizer` has to surface.
            let deleting = !patched["metadata"]["deletionTimestamp"].is_null();
            if deleting && finalizers(&patched).len() > finalizers(obj).len() {
                return status(
                    422,
                    "Invalid",
                    "Forbidden: no new finalizers can be added if the object is being deleted",
                );
            }
            bump(&mut patched);
            *obj = patched;
            ok(obj)
        }
        Method::PUT => {
            if let Some(mut interfere) = s.before_put.pop_front() {
                interfere(&mut s.obj);
            }
            let Some(obj) = s.obj.as_mut() else {
                return status(404, "NotFound", "not found");
            };
            let mut sent: Value = serde_json::from_slice(&body).unwrap();
            if sent["metadata"]["resourceVersion"] != obj["metadata"]["resourceVersion"] {
                return status(409, "Conflict", "the object has been modified");
            }
            bump(&mut sent);
            *obj = sent;
            ok(obj)
        }
        Method::DELETE => {
            let Some(obj) = s.obj.as_ref() else {
                return status(404, "NotFound", "not found");
            };
            let opts: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            let want = &opts["preconditions"]["uid"];
            if !want.is_null() && want != &obj["metadata"]["uid"] {
                return status(409, "Conflict", "Precondition failed: UID in precondition");
            }
            let obj = obj.clone();
            s.obj = None;
            ok(&obj)
        }
        other => panic!("unexpected {other}"),
    }
}

fn fake(obj: Option<PersistentVolume>) -> (Api<PersistentVolume>, Arc<Mutex<Server>>) {
    let server = Arc::new(Mutex::new(Server {
        obj: obj.map(|o| {
            let mut v = serde_json::to_value(o).unwrap();
            v["apiVersion"] = json!("v1");
            v["kind"] = json!("PersistentVolume");
            v
        }),
        ..Server::default()
    }));
    let shared = server.clone();
    let service = tower::service_fn(move |req| {
        let server = shared.clone();
        async move { Ok::<_, Infallible>(handle(server, req).await) }
    });
    (Api::all(Client::new(service, "default")), server)
}

fn server_finalizers(server: &Arc<Mutex<Server>>) -> Vec<String> {
    finalizers(server.lock().unwrap().obj.as_ref().unwrap())
}

fn calls(server: &Arc<Mutex<Server>>) -> Vec<Method> {
    server.lock().unwrap().calls.clone()
}

fn set_finalizers(list: &[&str]) -> Interference {
    let list: Vec<String> = list.iter().map(|s| (*s).to_owned()).collect();
    Box::new(move |obj| {
        let obj = obj.as_mut().unwrap();
        obj["metadata"]["finalizers"] = json!(list);
        bump(obj);
    })
}

#[tokio::test]
async fn removal_from_a_fresh_copy_takes_one_patch() {
    let obj = pv("pv-1").finalizer(ATTACHER).finalizer(OURS).build();
    let (api, server) = fake(Some(obj.clone()));
    let out = remove_finalizer(&api, &obj, OURS).await.unwrap();
    assert!(matches!(out, PatchOutcome::Patched(_)));
    assert_eq!(server_finalizers(&server), [ATTACHER]);
    assert_eq!(calls(&server), [Method::PATCH]);
}

#[tokio::test]
async fn the_attacher_removing_its_finalizer_meanwhile_does_not_leave_the_pv_stuck() {
    // Upstream issue 1217: the attacher's write lands between our read and our write.
    let cached = pv("pv-1").finalizer(ATTACHER).finalizer(OURS).build();
    let (api, server) = fake(Some(cached.clone()));
    server
        .lock()
        .unwrap()
        .before_patch
        .push_back(set_finalizers(&[OURS]));
    let out = remove_finalizer(&api, &cached, OURS).await.unwrap();
    assert!(matches!(out, PatchOutcome::Patched(_)));
    assert!(server_finalizers(&server).is_empty());
    assert_eq!(calls(&server), [Method::PATCH, Method::GET, Method::PATCH]);
}

fn patch_count(server: &Arc<Mutex<Server>>) -> usize {
    calls(server)
        .iter()
        .filter(|m| **m == Method::PATCH)
        .count()
}

#[tokio::test]
async fn conflicts_are_retried_far_beyond_upstreams_cap_of_six() {
    let obj = pv("pv-1").finalizer(ATTACHER).finalizer(OURS).build();
    let (api, server) = fake(Some(obj.clone()));
    server.lock().unwrap().patch_errors = (0..25).map(|_| (409, "Conflict")).collect();
    let out = remove_finalizer(&api, &obj, OURS).await.unwrap();
    assert!(matches!(out, PatchOutcome::Patched(_)));
    assert_eq!(server_finalizers(&server), [ATTACHER]);
    assert_eq!(patch_count(&server), 26);
}

#[tokio::test]
async fn a_writer_reordering_finalizers_before_every_attempt_only_delays_the_removal() {
    let obj = pv("pv-1").finalizer(OURS).build();
    let (api, server) = fake(Some(obj.clone()));
    {
        let mut s = server.lock().unwrap();
        for i in 0..25 {
            // Each write moves our finalizer away from the index we just read.
            s.before_patch.push_back(if i % 2 == 0 {
                set_finalizers(&[ATTACHER, OURS])
            } else {
                set_finalizers(&[OURS, ATTACHER])
            });
        }
    }
    let out = remove_finalizer(&api, &obj, OURS).await.unwrap();
    assert!(matches!(out, PatchOutcome::Patched(_)));
    assert_eq!(server_finalizers(&server), [ATTACHER]);
    assert_eq!(patch_count(&server), 26);
}

#[tokio::test]
async fn a_stale_copy_without_our_finalizer_does_not_skip_the_removal() {
    let stale = pv("pv-1").build();
    let (api, server) = fake(Some(pv("pv-1").finalizer(OURS).build()));
    let out = remove_finalizer(&api, &stale, OURS).await.unwrap();
    assert!(matches!(out, PatchOutcome::Patched(_)));
    assert!(server_finalizers(&server).is_empty());
    assert_eq!(calls(&server), [Method::GET, Method::PATCH]);
}

#[tokio::test]
async fn a_stale_copy_with_our_finalizer_does_not_skip_adding_it() {
    let stale = pv("pv-1").finalizer(OURS).build();
    let (api, server) = fake(Some(pv("pv-1").finalizer(ATTACHER).build()));
    let out = add_finalizer(&api, &stale, OURS).await.unwrap();
    assert!(matches!(out, PatchOutcome::Patched(_)));
    assert_eq!(server_finalizers(&server), [ATTACHER, OURS]);
}

#[tokio::test]
async fn a_fresh_read_that_already_matches_is_unchanged_without_a_write() {
    let obj = pv("pv-1").finalizer(ATTACHER).build();
    let (api, server) = fake(Some(obj.clone()));
    let out = remove_finalizer(&api, &obj, OURS).await.unwrap();
    assert!(matches!(out, PatchOutcome::Unchanged(_)));
    assert_eq!(calls(&server), [Method::GET]);
}

#[tokio::test]
async fn adding_to_an_object_that_started_deleting_meanwhile_is_reported_as_deleting() {
    let cached = pv("pv-1").finalizer(ATTACHER).build();
    let (api, server) = fake(Some(cached.clone()));
    server
        .lock()
        .unwrap()
        .before_patch
        .push_back(Box::new(|obj| {
            let obj = obj.as_mut().unwrap();
            obj["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
            bump(obj);
        }));
    let out = add_finalizer(&api, &cached, OURS).await.unwrap();
    assert!(matches!(out, PatchOutcome::Deleting(_)), "{out:?}");
    assert_eq!(server_finalizers(&server), [ATTACHER]);
}

#[tokio::test]
async fn a_missing_object_is_gone() {
    let (api, server) = fake(None);
    let obj = pv("pv-1").finalizer(OURS).build();
    let out = remove_finalizer(&api, &obj, OURS).await.unwrap();
    assert_eq!(out, PatchOutcome::Gone);
    assert_eq!(calls(&server), [Method::PATCH]);
}

#[tokio::test]
async fn an_object_recreated_under_the_same_name_is_gone_and_untouched() {
    let old = pv("pv-1").build();
    let (api, server) = fake(Some(pv("pv-1").uid("new-uid").finalizer(OURS).build()));
    let out = remove_finalizer(&api, &old, OURS).await.unwrap();
    assert_eq!(out, PatchOutcome::Gone);
    assert_eq!(server_finalizers(&server), [OURS]);
}

#[tokio::test]
async fn a_rejection_that_is_not_a_lost_race_is_returned_instead_of_retried_forever() {
    let obj = pv("pv-1").finalizer(OURS).build();
    let (api, server) = fake(Some(obj.clone()));
    server.lock().unwrap().patch_errors = (0..100).map(|_| (422, "Invalid")).collect();
    let err = remove_finalizer(&api, &obj, OURS).await.unwrap_err();
    assert_eq!(err.class, ApiErrorClass::Invalid);
    assert!(err.to_string().contains("remove finalizer"), "{err}");
    // Seeded write, fresh read + write, fresh read showing nothing moved: stop.
    assert_eq!(
        calls(&server),
        [Method::PATCH, Method::GET, Method::PATCH, Method::GET]
    );
}

#[tokio::test]
async fn other_api_errors_are_returned_classified() {
    let obj = pv("pv-1").finalizer(OURS).build();
    let (api, server) = fake(Some(obj.clone()));
    server
        .lock()
        .unwrap()
        .patch_errors
        .push_back((401, "Unauthorized"));
    let err = remove_finalizer(&api, &obj, OURS).await.unwrap_err();
    assert_eq!(err.class, ApiErrorClass::Forbidden);
    assert_eq!(err.kind, "PersistentVolume");
    assert_eq!(err.name, "pv-1");
}

#[tokio::test]
async fn annotations_are_set_and_removed_on_the_server() {
    let obj = pv("pv-1").annotation("keep", "1").build();
    let (api, server) = fake(Some(obj.clone()));
    let out = set_annotation(&api, &obj, "example.com/k", "v")
        .await
        .unwrap();
    let PatchOutcome::Patched(updated) = out else {
        panic!("expected a patch");
    };
    let out = remove_annotation(&api, &updated, "keep").await.unwrap();
    assert!(matches!(out, PatchOutcome::Patched(_)));
    let s = server.lock().unwrap();
    assert_eq!(
        s.obj.as_ref().unwrap()["metadata"]["annotations"],
        json!({"example.com/k": "v"})
    );
}

#[tokio::test]
async fn delete_with_uid_never_deletes_a_recreated_object() {
    let (api, server) = fake(Some(pv("pv-1").uid("new-uid").build()));
    assert_eq!(
        delete_with_uid(&api, "pv-1", "uid-pv-1").await.unwrap(),
        DeleteOutcome::Gone
    );
    assert!(server.lock().unwrap().obj.is_some());
    assert_eq!(
        delete_with_uid(&api, "pv-1", "new-uid").await.unwrap(),
        DeleteOutcome::Deleted
    );
    assert!(server.lock().unwrap().obj.is_none());
    assert_eq!(
        delete_with_uid(&api, "pv-1", "new-uid").await.unwrap(),
        DeleteOutcome::Gone
    );
}

// === Against kube-sim (the API server semantics the e2e tests run on) ===

mod against_kube_sim {
    use k8s_openapi::api::core::v1::PersistentVolume;
    use kube::Api;
    use kube::api::{DeleteParams, PostParams};
    use kube_sim::{Sim, SimConfig};

    use super::{ATTACHER, OURS};
    use crate::k8s::patch::*;
    use crate::testing::pv;

    async fn sim_with(obj: PersistentVolume) -> (Sim, Api<PersistentVolume>, PersistentVolume) {
        let sim = Sim::start(SimConfig::bare()).await.unwrap();
        let api: Api<PersistentVolume> = Api::all(sim.client());
        let mut obj = obj;
        obj.metadata.uid = None;
        obj.metadata.resource_version = None;
        let created = api.create(&PostParams::default(), &obj).await.unwrap();
        (sim, api, created)
    }

    fn finalizers(obj: &PersistentVolume) -> Vec<String> {
        obj.metadata.finalizers.clone().unwrap_or_default()
    }

    #[tokio::test]
    async fn a_stale_copy_never_removes_the_attachers_finalizer_on_a_real_api() {
        let (_sim, api, created) =
            sim_with(pv("pv-1").finalizer(ATTACHER).finalizer(OURS).build()).await;
        // The attacher removes its finalizer after our cache saw the object.
        let attacher_done = remove_finalizer(&api, &created, ATTACHER).await.unwrap();
        assert!(matches!(attacher_done, PatchOutcome::Patched(_)));
        // We act on the stale copy (ours at index 1, now at index 0).
        let out = remove_finalizer(&api, &created, OURS).await.unwrap();
        let PatchOutcome::Patched(after) = out else {
            panic!("expected a patch, got {out:?}");
        };
        assert!(finalizers(&after).is_empty());
    }

    #[tokio::test]
    async fn adding_a_finalizer_to_a_pv_being_deleted_is_reported_not_retried() {
        let (_sim, api, created) = sim_with(pv("pv-1").finalizer(ATTACHER).build()).await;
        api.delete("pv-1", &DeleteParams::default()).await.unwrap();
        // Our cached copy predates the deletion: the server's refusal is recognised on re-read.
        let out = add_finalizer(&api, &created, OURS).await.unwrap();
        let PatchOutcome::Deleting(fresh) = out else {
            panic!("expected Deleting, got {out:?}");
        };
        assert_eq!(finalizers(&fresh), [ATTACHER]);
    }

    #[tokio::test]
    async fn claims_are_patched_in_their_namespace() {
        use k8s_openapi::api::core::v1::PersistentVolumeClaim;
        let sim = Sim::start(SimConfig::bare()).await.unwrap();
        let api: Api<PersistentVolumeClaim> = Api::namespaced(sim.client(), "default");
        let mut claim = crate::testing::pvc("default", "data").build();
        claim.metadata.uid = None;
        claim.metadata.resource_version = None;
        let created = api.create(&PostParams::default(), &claim).await.unwrap();
        let key = crate::names::ANN_SELECTED_NODE;
        let out = set_annotation(&api, &created, key, "node-1").await.unwrap();
        assert!(matches!(out, PatchOutcome::Patched(_)), "{out:?}");
        let out = remove_annotation(&api, &created, key).await.unwrap();
        let PatchOutcome::Patched(after) = out else {
            panic!("expected a patch, got {out:?}");
        };
        assert!(after.metadata.annotations.unwrap_or_default().is_empty());
    }

    #[tokio::test]
    async fn finalizers_and_annotations_round_trip_on_a_real_api() {
        let (_sim, api, created) = sim_with(pv("pv-1").build()).await;
        let PatchOutcome::Patched(with) = add_finalizer(&api, &created, OURS).await.unwrap() else {
            panic!("expected a patch");
        };
        assert_eq!(finalizers(&with), [OURS]);
        assert!(matches!(
            add_finalizer(&api, &with, OURS).await.unwrap(),
            PatchOutcome::Unchanged(_)
        ));
        let PatchOutcome::Patched(annotated) = set_annotation(&api, &with, "example.com/a", "1")
            .await
            .unwrap()
        else {
            panic!("expected a patch");
        };
        assert_eq!(
            annotated.metadata.annotations.as_ref().unwrap()["example.com/a"],
            "1"
        );
        api.delete("pv-1", &DeleteParams::default()).await.unwrap();
        let out = remove_finalizer(&api, &annotated, OURS).await.unwrap();
        // Removing the last finalizer of a deleting object lets the server delete it.
        assert!(matches!(out, PatchOutcome::Patched(_)), "{out:?}");
        assert!(api.get_opt("pv-1").await.unwrap().is_none());
        assert_eq!(
            remove_finalizer(&api, &annotated, OURS).await.unwrap(),
            PatchOutcome::Gone
        );
    }
}

// === PATCH refused by RBAC: the same change as GET + PUT ===

#[tokio::test]
async fn a_patch_refused_by_rbac_is_made_with_get_and_put_keeping_unknown_fields_and_preconditions()
{
    use k8s_openapi::api::core::v1::ConfigMap;
    // The refusal is remembered per resource for the whole process: ConfigMaps are this test's own.
    let server = Arc::new(Mutex::new(Server {
        obj: Some(json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "cm", "namespace": "ns", "uid": "u1", "resourceVersion": "1",
                         "finalizers": [ATTACHER]},
            "data": {"k": "v"},
            // A field a newer API server has and our types do not: a PUT must not drop it.
            "futureField": {"x": 1},
        })),
        patch_errors: VecDeque::from([(403, "Forbidden")]),
        ..Server::default()
    }));
    let shared = server.clone();
    let service = tower::service_fn(move |req| {
        let server = shared.clone();
        async move { Ok::<_, Infallible>(handle(server, req).await) }
    });
    let api: Api<ConfigMap> = Api::namespaced(Client::new(service, "default"), "ns");
    let seed: ConfigMap =
        serde_json::from_value(server.lock().unwrap().obj.clone().unwrap()).unwrap();

    let outcome = add_finalizer(&api, &seed, OURS).await.unwrap();
    assert!(matches!(outcome, PatchOutcome::Patched(_)), "{outcome:?}");
    assert_eq!(server_finalizers(&server), [ATTACHER, OURS]);
    assert_eq!(calls(&server), [Method::PATCH, Method::GET, Method::PUT]);
    let stored = server.lock().unwrap().obj.clone().unwrap();
    assert_eq!(stored["futureField"], json!({"x": 1}));
    assert_eq!(stored["data"], json!({"k": "v"}));

    // Next write: no PATCH any more. The attacher removes its finalizer between our read and
    // our PUT: the PUT's resourceVersion makes it fail (409), and the retry removes only ours.
    server.lock().unwrap().calls.clear();
    server
        .lock()
        .unwrap()
        .before_put
        .push_back(set_finalizers(&[OURS]));
    let outcome = remove_finalizer(&api, &seed, OURS).await.unwrap();
    assert!(matches!(outcome, PatchOutcome::Patched(_)), "{outcome:?}");
    assert!(server_finalizers(&server).is_empty());
    assert!(
        !calls(&server).contains(&Method::PATCH),
        "{:?}",
        calls(&server)
    );
}

#[tokio::test]
async fn a_seed_that_only_names_the_object_is_read_first_and_every_finalizer_is_kept() {
    // As a clone's source claim that this node's instance does not cache (node mode).
    let mut seed = PersistentVolume::default();
    seed.metadata.name = Some("pv-1".into());
    let (api, server) = fake(Some(pv("pv-1").finalizer(ATTACHER).build()));
    let out = add_finalizer(&api, &seed, OURS).await.unwrap();
    assert!(matches!(out, PatchOutcome::Patched(_)));
    assert_eq!(server_finalizers(&server), [ATTACHER, OURS]);
    assert_eq!(calls(&server), [Method::GET, Method::PATCH]);
}
