use std::collections::BTreeMap;

use super::*;
use kube::api::{ObjectMeta, Patch, PatchParams, PostParams};
use kube_sim::{Sim, SimConfig};

fn claim(name: &str, annotations: &[(&str, &str)]) -> PersistentVolumeClaim {
    PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("default".into()),
            annotations: Some(
                annotations
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect::<BTreeMap<_, _>>(),
            ),
            ..ObjectMeta::default()
        },
        spec: Some(
            serde_json::from_value(serde_json::json!({
                "accessModes": ["ReadWriteOnce"],
                "resources": {"requests": {"storage": "1Gi"}}
            }))
            .unwrap(),
        ),
        ..PersistentVolumeClaim::default()
    }
}

async fn wait_until(what: &str, mut check: impl FnMut() -> bool) {
    for _ in 0..500 {
        if check() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("timed out waiting for {what}");
}

#[tokio::test]
async fn the_scoped_claim_cache_keeps_only_claims_this_instance_may_act_on() {
    let sim = Sim::start(SimConfig::bare()).await.unwrap();
    let client = sim.client();
    let api: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), "default");
    let pp = PostParams::default();
    let driver = crate::testing::DRIVER;
    let ours = [(names::ANN_STORAGE_PROVISIONER, driver)];
    api.create(&pp, &claim("unselected", &ours)).await.unwrap();
    let mine = [
        (names::ANN_STORAGE_PROVISIONER, driver),
        (names::ANN_SELECTED_NODE, "n1"),
    ];
    api.create(&pp, &claim("mine", &mine)).await.unwrap();
    let theirs = [
        (names::ANN_STORAGE_PROVISIONER, driver),
        (names::ANN_SELECTED_NODE, "n2"),
    ];
    api.create(&pp, &claim("theirs", &theirs)).await.unwrap();
    api.create(
        &pp,
        &claim("foreign", &[(names::ANN_STORAGE_PROVISIONER, "other")]),
    )
    .await
    .unwrap();
    let watched: WatchedLean<PersistentVolumeClaim> = watch_lean_scoped(
        Api::all(client.clone()),
        scope::paged_watch(),
        "persistentvolumeclaims",
        0,
        move |pvc: &mut PersistentVolumeClaim| scope::cached_claim(&pvc.metadata, driver, "n1"),
    );
    let store = watched.store.clone();
    store.wait_until_ready().await.unwrap();
    let names = || {
        let mut n: Vec<String> = store.state().iter().map(|c| c.name().to_owned()).collect();
        n.sort();
        n
    };
    assert_eq!(names(), vec!["mine", "theirs", "unselected"]);

    // Bound: another node's claim leaves the cache, ours stays (its volume is ours); a foreign
    // claim that becomes ours enters it.
    let bound =
        serde_json::json!({"metadata": {"annotations": {names::ANN_BIND_COMPLETED: "yes"}}});
    for name in ["mine", "theirs"] {
        api.patch(name, &PatchParams::default(), &Patch::Merge(&bound))
            .await
            .unwrap();
    }
    let adopt =
        serde_json::json!({"metadata": {"annotations": {names::ANN_STORAGE_PROVISIONER: driver}}});
    api.patch("foreign", &PatchParams::default(), &Patch::Merge(&adopt))
        .await
        .unwrap();
    wait_until("the cache to follow the claims", || {
        names() == vec!["foreign", "mine", "unselected"]
    })
    .await;
    assert!(store.get("default/theirs").is_none());
    watched.task.abort();
}
