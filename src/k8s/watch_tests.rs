use super::*;
use crate::k8s::attachments::tests::va;
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::api::ObjectMeta;

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

#[tokio::test]
async fn a_first_list_larger_than_the_buffers_completes_before_anyone_reads_the_changes() {
    use k8s_openapi::api::core::v1::Secret;
    let sim = kube_sim::Sim::start(kube_sim::SimConfig::bare())
        .await
        .unwrap();
    let secrets: Api<Secret> = Api::namespaced(sim.client(), "default");
    let count = SHARED_BUFFER + 50;
    for i in 0..count {
        let secret = Secret {
            metadata: ObjectMeta {
                name: Some(format!("s-{i}")),
                ..Default::default()
            },
            ..Default::default()
        };
        sim.create(
            "",
            "secrets",
            "default",
            serde_json::to_value(&secret).unwrap(),
        )
        .unwrap();
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
