//! SelfSubjectAccessReview answers: everything is allowed until a test "removes a permission" with
//! a standing 403 fault rule, which both refuses the requests and makes the review say so.

use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
};
use k8s_openapi::api::core::v1::PersistentVolume;
use kube::api::PostParams;
use kube::{Api, Client};
use kube_sim::{FaultRule, Sim, SimConfig};

async fn allowed(client: &Client, verb: &str, group: &str, resource: &str) -> (bool, String) {
    let review = SelfSubjectAccessReview {
        spec: SelfSubjectAccessReviewSpec {
            resource_attributes: Some(ResourceAttributes {
                verb: Some(verb.into()),
                group: Some(group.into()),
                resource: Some(resource.into()),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    let answer = Api::<SelfSubjectAccessReview>::all(client.clone())
        .create(&PostParams::default(), &review)
        .await
        .expect("review answered");
    let status = answer.status.expect("status");
    (status.allowed, status.reason.unwrap_or_default())
}

#[tokio::test]
async fn a_standing_403_rule_is_a_denied_permission_and_others_stay_allowed() {
    let sim = Sim::start(SimConfig::bare()).await.expect("sim");
    let client = sim.client();
    assert!(allowed(&client, "create", "", "persistentvolumes").await.0);

    sim.faults().add(
        FaultRule::error(403)
            .verb("create")
            .resource("persistentvolumes")
            .message("no create on PVs for this test"),
    );
    // A one-off 403 is a fault, not a missing permission.
    sim.faults().add(
        FaultRule::error(403)
            .verb("list")
            .resource("persistentvolumes")
            .times(1),
    );

    let (ok, reason) = allowed(&client, "create", "", "persistentvolumes").await;
    assert!(!ok, "the review must report the denied permission");
    assert_eq!(reason, "no create on PVs for this test");
    assert!(allowed(&client, "list", "", "persistentvolumes").await.0);
    assert!(allowed(&client, "delete", "", "persistentvolumes").await.0);
    assert!(
        allowed(&client, "get", "storage.k8s.io", "storageclasses")
            .await
            .0
    );

    // The request itself is refused as the review said.
    let err = Api::<PersistentVolume>::all(client.clone())
        .create(&PostParams::default(), &serde_json::from_value(serde_json::json!({
            "metadata": {"name": "pv-1"},
            "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"], "hostPath": {"path": "/x"}}
        })).unwrap())
        .await
        .expect_err("create refused");
    assert!(
        matches!(err, kube::Error::Api(ref s) if s.code == 403),
        "{err:?}"
    );
}
