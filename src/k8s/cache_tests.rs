use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::api::ObjectMeta;

use super::attachments_tests::va;
use super::*;

#[test]
fn mentions_finds_a_finalizer_only_where_one_is() {
    let mut pvc = PersistentVolumeClaim::default();
    pvc.metadata.name = Some("data-0".into());
    let plain = Lean::new(pvc.clone());
    pvc.metadata.finalizers = Some(vec!["csi-provisioner.rs/provisioning-intent".into()]);
    let recorded = Lean::new(pvc);
    assert!(!plain.mentions("csi-provisioner.rs/provisioning-intent"));
    assert!(recorded.mentions("csi-provisioner.rs/provisioning-intent"));
}

#[test]
fn full_gives_back_the_object_that_was_packed() {
    let claim: PersistentVolumeClaim = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "c", "namespace": "ns", "uid": "u1", "resourceVersion": "7",
            "annotations": {"a": "b"}, "finalizers": ["f"]},
        "spec": {"storageClassName": "fast", "resources": {"requests": {"storage": "1Gi"}}},
        "status": {"phase": "Pending"}
    }))
    .expect("claim");
    let lean = Lean::new(claim.clone());
    assert_eq!(lean.key(), "ns/c");
    assert_eq!(lean.namespace(), Some("ns"));
    assert_eq!(lean.name(), "c");
    assert_eq!(lean.uid(), "u1");
    assert_eq!(lean.resource_version(), "7");
    assert_eq!(lean.full(), claim);
    assert_eq!(lean.clone().full(), claim);
}

#[test]
fn a_cluster_scoped_object_is_keyed_by_its_name_and_missing_ids_stay_missing() {
    let pv: PersistentVolume = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "pvc-1"},
        "spec": {"storageClassName": "fast"}
    }))
    .expect("pv");
    let lean = Lean::new(pv.clone());
    assert_eq!(lean.key(), "pvc-1");
    assert_eq!(lean.namespace(), None);
    assert_eq!(lean.name(), "pvc-1");
    assert_eq!(lean.uid(), "");
    assert_eq!(lean.resource_version(), "");
    assert_eq!(
        lean.full(),
        pv,
        "no empty UID or resourceVersion is made up"
    );
    assert_eq!(key(None, "pvc-1"), "pvc-1");
    assert_eq!(key(Some("ns"), "c"), "ns/c");
}

/// The memory budget of the caches rests on this ratio: a bound PV as this sidecar writes it
/// (driver and class names the dictionary has never seen) packs into under a quarter of its JSON.
#[test]
fn a_bound_pv_and_claim_pack_into_a_fraction_of_their_json() {
    let uid = "2bf349aa-c890-4f69-b9d6-171025c7324d";
    let pv: PersistentVolume = serde_json::from_value(serde_json::json!({
        "metadata": {"name": format!("pvc-{uid}"), "uid": "67d8df02-a4f4-4c88-b743-325dad27fb0b",
            "resourceVersion": "13", "creationTimestamp": "2026-11-24T19:41:13Z",
            "annotations": {"pv.kubernetes.io/provisioned-by": "ebs.csi.aws.com",
                "volume.kubernetes.io/provisioner-deletion-secret-name": "",
                "volume.kubernetes.io/provisioner-deletion-secret-namespace": ""},
            "finalizers": ["external-provisioner.volume.kubernetes.io/finalizer",
                "kubernetes.io/pv-protection"]},
        "spec": {"accessModes": ["ReadWriteOnce"], "capacity": {"storage": "20Gi"},
            "claimRef": {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "name": "db-0",
                "namespace": "shop", "resourceVersion": "8", "uid": uid},
            "csi": {"driver": "ebs.csi.aws.com", "fsType": "ext4", "volumeHandle": "vol-0a1b2c3d4e5f60718",
                "volumeAttributes": {"storage.kubernetes.io/csiProvisionerIdentity":
                    "1795549269989-1687-ebs.csi.aws.com"}},
            "persistentVolumeReclaimPolicy": "Delete", "storageClassName": "gp3",
            "volumeMode": "Filesystem"},
        "status": {"lastPhaseTransitionTime": "2026-11-24T19:41:13Z", "phase": "Bound"}
    }))
    .expect("pv");
    let claim: PersistentVolumeClaim = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "db-0", "namespace": "shop", "uid": uid, "resourceVersion": "15",
            "creationTimestamp": "2026-11-24T19:41:13Z",
            "annotations": {"pv.kubernetes.io/bind-completed": "yes",
                "pv.kubernetes.io/bound-by-controller": "yes",
                "volume.beta.kubernetes.io/storage-provisioner": "ebs.csi.aws.com",
                "volume.kubernetes.io/storage-provisioner": "ebs.csi.aws.com"},
            "finalizers": ["kubernetes.io/pvc-protection"]},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "20Gi"}},
            "storageClassName": "gp3", "volumeMode": "Filesystem", "volumeName": format!("pvc-{uid}")},
        "status": {"accessModes": ["ReadWriteOnce"], "capacity": {"storage": "20Gi"}, "phase": "Bound"}
    }))
    .expect("claim");
    let json = serde_json::to_vec(&pv).expect("json").len();
    let lean = Lean::new(pv.clone());
    assert!(
        lean.rest.len() * 4 < json,
        "{} of {json} bytes",
        lean.rest.len()
    );
    assert_eq!(lean.full(), pv);
    let json = serde_json::to_vec(&claim).expect("json").len();
    let lean = Lean::new(claim.clone());
    assert!(
        lean.rest.len() * 4 < json,
        "{} of {json} bytes",
        lean.rest.len()
    );
    assert_eq!(lean.full(), claim);
}

fn claim(name: &str, rv: &str) -> Lean<PersistentVolumeClaim> {
    let mut c = PersistentVolumeClaim::default();
    c.metadata.name = Some(name.to_owned());
    c.metadata.namespace = Some("ns".to_owned());
    c.metadata.resource_version = Some(rv.to_owned());
    Lean::new(c)
}

#[tokio::test]
async fn a_relist_replaces_the_content_and_updates_replace_entries() {
    let (cache, mut writer) = cache();
    writer.apply(watcher::Event::Init);
    writer.apply(watcher::Event::InitApply(claim("a", "1")));
    writer.apply(watcher::Event::InitApply(claim("b", "1")));
    assert_eq!(cache.len(), 0, "a list shows only once complete");
    let announced = writer.apply(watcher::Event::InitDone);
    assert_eq!(announced.len(), 2);
    cache.wait_until_ready().await.unwrap();

    let changed = writer.apply(watcher::Event::Apply(claim("a", "2")));
    assert_eq!(changed.len(), 1);
    assert_eq!(cache.get("ns/a").unwrap().resource_version(), "2");
    assert!(cache.get("a").is_none(), "the key carries the namespace");

    // The watch was down while b was deleted and c created: the re-list drops b.
    writer.apply(watcher::Event::Init);
    writer.apply(watcher::Event::InitApply(claim("a", "3")));
    writer.apply(watcher::Event::InitApply(claim("c", "1")));
    assert!(
        cache.get("ns/b").is_some(),
        "the old content serves until the list completes"
    );
    writer.apply(watcher::Event::InitDone);
    assert!(cache.get("ns/b").is_none());
    assert_eq!(cache.len(), 2);

    writer.apply(watcher::Event::Delete(claim("c", "1")));
    assert!(cache.get("ns/c").is_none());
    assert_eq!(cache.state().len(), 1);
}

#[tokio::test]
async fn waiting_for_a_cache_whose_watch_stopped_fails_instead_of_hanging() {
    let (cache, writer) = cache::<PersistentVolumeClaim>();
    drop(writer);
    assert!(cache.wait_until_ready().await.is_err());
}

#[tokio::test]
async fn departures_name_each_member_that_left_the_set_once() {
    let names = |list: &[&str]| list.iter().map(|s| (*s).to_owned()).collect::<HashSet<_>>();
    let set = Arc::new(std::sync::Mutex::new(names(&["a", "b"])));
    let shared = set.clone();
    let stream = departures(std::time::Duration::from_millis(5), move || {
        shared.lock().unwrap().clone()
    });
    futures::pin_mut!(stream);
    let deadline = std::time::Duration::from_secs(10);

    // b goes and c comes: only b is reported.
    *set.lock().unwrap() = names(&["a", "c"]);
    let left = tokio::time::timeout(deadline, stream.next()).await.unwrap();
    assert_eq!(left, Some(vec!["b".to_owned()]));
    // b coming back is no departure; a going is, and only once.
    *set.lock().unwrap() = names(&["b", "c"]);
    let left = tokio::time::timeout(deadline, stream.next()).await.unwrap();
    assert_eq!(left, Some(vec!["a".to_owned()]));
}

#[test]
fn scoping_drops_uninteresting_objects_and_turns_updates_that_leave_the_scope_into_removals() {
    let keep_pv1 =
        |va: &mut VolumeAttachment| va.spec.source.persistent_volume_name.as_deref() == Some("pv1");
    let kept = scope_event(watcher::Event::InitApply(va("a", "pv1", "n")), &keep_pv1);
    assert!(matches!(kept, Some(watcher::Event::InitApply(_))));
    assert!(scope_event(watcher::Event::InitApply(va("b", "pv2", "n")), &keep_pv1).is_none());
    let left = scope_event(watcher::Event::Apply(va("a", "pv2", "n")), &keep_pv1);
    assert!(matches!(left, Some(watcher::Event::Delete(_))));
    assert!(matches!(
        scope_event(watcher::Event::Apply(va("a", "pv1", "n")), &keep_pv1),
        Some(watcher::Event::Apply(_))
    ));
}

#[test]
fn strip_drops_managed_fields_and_last_applied_but_keeps_other_annotations() {
    let mut v = va("a", "pv", "n");
    v.metadata.managed_fields = Some(vec![Default::default()]);
    v.metadata.annotations = Some(
        [
            (LAST_APPLIED.to_string(), "{}".to_string()),
            ("keep".to_string(), "me".to_string()),
        ]
        .into(),
    );
    strip(&mut v);
    assert!(v.metadata.managed_fields.is_none());
    let ann = v.metadata.annotations.unwrap();
    assert_eq!(ann.len(), 1);
    assert_eq!(ann["keep"], "me");
}

/// Before 1.29 (no `lastPhaseTransitionTime`): the time of the write that set the phase, not of
/// another manager's later write, survives the strip; a server's own field is never replaced.
#[test]
fn a_pv_without_a_phase_transition_time_keeps_the_time_its_phase_was_written() {
    let entry = |manager: &str, at: &str, fields: serde_json::Value| ManagedFieldsEntry {
        manager: Some(manager.to_owned()),
        time: Some(serde_json::from_value(serde_json::json!(at)).unwrap()),
        fields_v1: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::FieldsV1(
            fields,
        )),
        ..Default::default()
    };
    let pv = |transition: Option<&str>| {
        let mut pv: PersistentVolume = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "pv-1"},
            "status": {"phase": "Released", "lastPhaseTransitionTime": transition},
        }))
        .unwrap();
        pv.metadata.managed_fields = Some(vec![
            entry(
                "kube-controller-manager",
                "2026-01-01T10:00:00Z",
                serde_json::json!({"f:status": {"f:phase": {}}}),
            ),
            entry(
                "csi-provisioner",
                "2026-01-01T11:00:00Z",
                serde_json::json!({"f:metadata": {"f:finalizers": {}}}),
            ),
        ]);
        pv
    };
    let since = |mut pv: PersistentVolume| {
        strip(&mut pv);
        assert!(pv.metadata.managed_fields.is_none());
        let time = pv.status.unwrap().last_phase_transition_time.unwrap();
        time.0.to_string()
    };
    assert_eq!(since(pv(None)), "2026-01-01T10:00:00Z");
    assert_eq!(
        since(pv(Some("2026-01-01T09:00:00Z"))),
        "2026-01-01T09:00:00Z"
    );
}

/// Creates Secret `name` in `default` directly in the simulator's store.
fn create_secret(sim: &kube_sim::Sim, name: String) {
    let secret = k8s_openapi::api::core::v1::Secret {
        metadata: ObjectMeta {
            name: Some(name),
            ..Default::default()
        },
        ..Default::default()
    };
    let secret = serde_json::to_value(&secret).unwrap();
    sim.create("", "secrets", "default", secret).unwrap();
}

#[tokio::test]
async fn a_first_list_larger_than_the_buffers_completes_before_anyone_reads_the_changes() {
    use k8s_openapi::api::core::v1::Secret;
    let sim = kube_sim::Sim::start(kube_sim::SimConfig::bare())
        .await
        .unwrap();
    let secrets: Api<Secret> = Api::namespaced(sim.client(), "default");
    let count = SHARED_BUFFER + 50;
    for i in 0..count {
        create_secret(&sim, format!("s-{i}"));
    }
    let mut watched = watch_shared(secrets, watcher::Config::default(), "secrets", 1);
    // The controllers start only once the caches are filled, so nothing reads the stream yet.
    tokio::time::timeout(
        std::time::Duration::from_secs(30),
        watched.store.wait_until_ready(),
    )
    .await
    .expect("the first list completes although nobody reads the changes yet")
    .unwrap();
    let changes = watched.subscribe();
    let seen = changes.take(count).count();
    let seen = tokio::time::timeout(std::time::Duration::from_secs(30), seen)
        .await
        .expect("every listed object is announced");
    assert_eq!(seen, count);
    watched.task.abort();
}

#[tokio::test]
async fn a_cache_whose_streams_nobody_reads_yet_stays_current_and_a_late_reader_misses_nothing() {
    use k8s_openapi::api::core::v1::Secret;
    let sim = kube_sim::Sim::start(kube_sim::SimConfig::bare())
        .await
        .unwrap();
    let create = |name: String| create_secret(&sim, name);
    let secrets: Api<Secret> = Api::namespaced(sim.client(), "default");
    // Two streams, as a standby's claims have: one taken but not read yet (a controller waiting
    // for something else first), one not even taken until later (a standby's, until it leads).
    let mut watched = watch_shared(secrets, watcher::Config::default(), "secrets", 2);
    tokio::time::timeout(
        std::time::Duration::from_secs(30),
        watched.store.wait_until_ready(),
    )
    .await
    .unwrap()
    .unwrap();
    let early = watched.subscribe();
    // More changes than the streams buffer, then one more: a stalled watch never caches it.
    let count = SHARED_BUFFER + 50;
    for i in 0..count {
        create(format!("s-{i}"));
    }
    let last = format!("s-{}", count - 1);
    let cached = |store: &Store<Secret>| {
        store
            .state()
            .iter()
            .any(|s| s.metadata.name.as_deref() == Some(last.as_str()))
    };
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
    while !cached(&watched.store) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the cache stopped following the watch while nobody read its streams"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    // Read late, each stream names every object cached, then what changes after.
    let late = watched.subscribe();
    futures::pin_mut!(early, late);
    for changes in [early.as_mut(), late.as_mut()] {
        let first = changes
            .take(count)
            .filter_map(|s| async move { s.metadata.name.clone() })
            .collect::<HashSet<String>>();
        let first = tokio::time::timeout(std::time::Duration::from_secs(30), first)
            .await
            .expect("the stream names what the cache held when it was first read");
        assert_eq!(first.len(), count);
    }
    create("after".to_owned());
    for mut changes in [early.as_mut(), late.as_mut()] {
        let next = tokio::time::timeout(std::time::Duration::from_secs(30), changes.next())
            .await
            .expect("a change after the stream was read is announced")
            .unwrap();
        assert_eq!(next.metadata.name.as_deref(), Some("after"));
    }
    watched.task.abort();
}

#[tokio::test]
async fn a_stream_left_unread_holds_up_neither_the_cache_nor_its_siblings_and_then_yields_the_latest()
 {
    use k8s_openapi::api::core::v1::Secret;
    use kube::api::{Patch, PatchParams};
    let within = std::time::Duration::from_secs(30);
    let sim = kube_sim::Sim::start(kube_sim::SimConfig::bare())
        .await
        .unwrap();
    let secrets: Api<Secret> = Api::namespaced(sim.client(), "default");
    let mut watched = watch_shared(secrets.clone(), watcher::Config::default(), "secrets", 2);
    tokio::time::timeout(within, watched.store.wait_until_ready())
        .await
        .unwrap()
        .unwrap();
    // Read once, then left unread: a controller awaiting requests.
    let lagging = watched.subscribe();
    futures::pin_mut!(lagging);
    create_secret(&sim, "first".to_owned());
    let first = tokio::time::timeout(within, lagging.next()).await.unwrap();
    assert_eq!(first.unwrap().metadata.name.as_deref(), Some("first"));
    let sibling = watched.subscribe();
    futures::pin_mut!(sibling);
    let first = tokio::time::timeout(within, sibling.next()).await.unwrap();
    assert_eq!(first.unwrap().metadata.name.as_deref(), Some("first"));
    let count = SHARED_BUFFER + 50;
    let names: Vec<String> = (0..count).map(|i| format!("s-{i}")).collect();
    for name in &names {
        create_secret(&sim, name.clone());
    }
    let seen = async {
        let mut seen = HashSet::new();
        while seen.len() < count {
            let Some(s) = sibling.next().await else { break };
            seen.insert(s.metadata.name.clone().unwrap());
        }
        seen
    };
    let seen = tokio::time::timeout(within, seen)
        .await
        .expect("the sibling stream goes on while the other is not read");
    assert!(
        names.iter().all(|n| seen.contains(n)),
        "{} of {count}",
        seen.len()
    );
    // A change to an object the lagging stream still holds, past its buffer.
    let labelled = serde_json::json!({"metadata": {"labels": {"version": "2"}}});
    secrets
        .patch("s-0", &PatchParams::default(), &Patch::Merge(&labelled))
        .await
        .unwrap();
    let is_labelled =
        |s: &Secret| (s.metadata.labels.as_ref()).is_some_and(|l| l.contains_key("version"));
    let next = tokio::time::timeout(within, sibling.next()).await.unwrap();
    assert!(
        next.is_some_and(|s| is_labelled(&s)),
        "the sibling is told of the change"
    );
    // Read at last: every object once, in order, each as it is now.
    // (`first` may come again: it was cached and announced around the stream's first read.)
    let rest = lagging.filter(|s| std::future::ready(s.metadata.name.as_deref() != Some("first")));
    let read: Vec<Arc<Secret>> = tokio::time::timeout(within, rest.take(count).collect())
        .await
        .expect("the lagging stream yields what it holds");
    let read_names: Vec<String> = read
        .iter()
        .map(|s| s.metadata.name.clone().unwrap())
        .collect();
    assert_eq!(read_names, names);
    assert!(is_labelled(&read[0]), "s-0 is yielded as it is now");
    watched.task.abort();
}
