use k8s_openapi::api::core::v1::PersistentVolumeClaimCondition;
use serde_json::json;

use super::*;
use crate::testing::{DRIVER, pvc};

fn pod(value: serde_json::Value) -> PodLite {
    serde_json::from_value(value).expect("a Pod decodes as PodLite")
}

#[test]
fn a_pod_keeps_only_its_identity_and_the_claims_it_uses() {
    let p = pod(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": "web-0", "namespace": "shop", "uid": "u1", "resourceVersion": "7",
            "labels": {"app": "web"}, "annotations": {"big": "x".repeat(10_000)},
            "managedFields": [{"manager": "kubectl", "fieldsV1": {"f:spec": {}}}]
        },
        "spec": {
            "nodeName": "node-1",
            "containers": [{"name": "c", "image": "nginx", "env": [{"name": "A", "value": "b"}]}],
            "volumes": [
                {"name": "data", "persistentVolumeClaim": {"claimName": "data-web-0"}},
                {"name": "scratch", "ephemeral": {"volumeClaimTemplate": {"spec": {}}}},
                {"name": "cfg", "configMap": {"name": "cfg"}},
                {"name": "again", "persistentVolumeClaim": {"claimName": "data-web-0", "readOnly": true}}
            ]
        },
        "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
    }));
    assert_eq!(p.key(), "shop/web-0");
    assert_eq!(p.claims(), ["shop/data-web-0", "shop/web-0-scratch"]);
    assert_eq!(p.metadata.labels, None, "nothing but identity is kept");
    assert_eq!(p.metadata.managed_fields, None);
    assert_eq!(p.metadata.resource_version.as_deref(), Some("7"));

    for phase in ["Succeeded", "Failed"] {
        let done = pod(json!({
            "metadata": {"name": "job", "namespace": "shop"},
            "spec": {"volumes": [{"name": "d", "persistentVolumeClaim": {"claimName": "d"}}]},
            "status": {"phase": phase}
        }));
        assert!(done.claims().is_empty(), "a {phase} Pod uses nothing");
    }
    let bare = pod(json!({"metadata": {"name": "p", "namespace": "n"}}));
    assert!(bare.claims().is_empty());
}

#[test]
fn usage_flips_only_when_the_first_pod_comes_or_the_last_goes() {
    let mut u = Usage::default();
    assert_eq!(u.set("ns/a", vec!["ns/c".into()]), ["ns/c"]);
    assert!(u.set("ns/b", vec!["ns/c".into()]).is_empty(), "second user");
    assert!(u.set("ns/a", vec!["ns/c".into()]).is_empty(), "no change");
    assert!(u.set("ns/a", Vec::new()).is_empty(), "b still uses it");
    assert!(u.is_used("ns/c"));
    assert_eq!(u.set("ns/b", vec!["ns/d".into()]), ["ns/c", "ns/d"]);
    assert!(!u.is_used("ns/c") && u.is_used("ns/d"));
    assert_eq!(u.pods(), 1, "Pods using nothing are not kept");
    // A re-list that lost Pod b and found a new user of c.
    let mut flipped = u.replace([("ns/e".to_owned(), vec!["ns/c".to_owned()])]);
    flipped.sort();
    assert_eq!(flipped, ["ns/c", "ns/d"]);
    assert!(u.is_used("ns/c") && !u.is_used("ns/d"));
    assert!(
        u.set("ns/unknown", Vec::new()).is_empty(),
        "deleting an unseen Pod"
    );
}

#[test]
fn one_write_per_transition_never_for_others_claims_or_where_kubernetes_keeps_the_condition() {
    let now: jiff::Timestamp = "2026-11-24T12:00:00.700Z".parse().unwrap();
    let ours = || pvc("ns", "c").provisioner(DRIVER);
    assert_eq!(
        transition(&ours().build(), DRIVER, false, now),
        Some(Transition::Unused("2026-11-24T12:00:01Z".into()))
    );
    assert_eq!(transition(&ours().build(), DRIVER, true, now), None);
    let marked = ours()
        .annotation(names::ANN_UNUSED_SINCE, "2026-11-01T00:00:00Z")
        .build();
    assert_eq!(
        transition(&marked, DRIVER, false, now),
        None,
        "already marked"
    );
    assert_eq!(
        transition(&marked, DRIVER, true, now),
        Some(Transition::Used)
    );
    let foreign = pvc("ns", "c").provisioner("other.csi").build();
    assert_eq!(transition(&foreign, DRIVER, false, now), None);
    assert_eq!(
        transition(&ours().deleting().build(), DRIVER, false, now),
        None
    );
    let mut kept = ours().build();
    kept.status.get_or_insert_default().conditions = Some(vec![PersistentVolumeClaimCondition {
        type_: names::CONDITION_UNUSED.into(),
        status: "False".into(),
        ..Default::default()
    }]);
    assert_eq!(transition(&kept, DRIVER, false, now), None);
}

#[test]
fn unused_ages_fall_in_day_buckets() {
    let day = 86_400;
    let counts = controller::buckets([0, day - 1, day, 6 * day, 7 * day, 29 * day, 400 * day]);
    assert_eq!(
        counts,
        [("lt_1d", 2), ("1d_7d", 2), ("7d_30d", 2), ("ge_30d", 1)]
    );
}
