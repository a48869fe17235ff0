//! The built-in control loops as the sidecar sees them: provisioner annotations, binding,
//! Released/Lost, protection finalizers, selected-node.

use std::time::Duration;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube_sim::{Sim, SimConfig};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(10);

/// Polls `f` until it returns Some, or panics after `WAIT` naming `what`.
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

fn obj<T: serde::de::DeserializeOwned>(v: Value) -> T {
    serde_json::from_value(v).unwrap()
}

fn sc(name: &str, provisioner: &str, mode: &str) -> StorageClass {
    obj(json!({"metadata": {"name": name}, "provisioner": provisioner, "volumeBindingMode": mode}))
}

fn pvc(name: &str, class: &str) -> PersistentVolumeClaim {
    obj(
        json!({"metadata": {"name": name}, "spec": {"storageClassName": class, "accessModes": ["ReadWriteOnce"],
                                                    "resources": {"requests": {"storage": "1Gi"}}}}),
    )
}

fn pv(name: &str, class: &str, claim: Option<(&str, &str)>) -> PersistentVolume {
    let mut v = json!({"metadata": {"name": name, "annotations": {"pv.kubernetes.io/provisioned-by": "d.example.com"}},
                       "spec": {"capacity": {"storage": "2Gi"}, "accessModes": ["ReadWriteOnce"], "storageClassName": class,
                                "persistentVolumeReclaimPolicy": "Delete",
                                "csi": {"driver": "d.example.com", "volumeHandle": name}}});
    if let Some((name, uid)) = claim {
        v["spec"]["claimRef"] = json!({"kind": "PersistentVolumeClaim", "namespace": "default", "name": name, "uid": uid, "apiVersion": "v1"});
    }
    obj(v)
}

fn ann(m: &kube::api::ObjectMeta, k: &str) -> Option<String> {
    m.annotations.as_ref().and_then(|a| a.get(k).cloned())
}

fn phase_pv(p: &PersistentVolume) -> String {
    p.status
        .as_ref()
        .and_then(|s| s.phase.clone())
        .unwrap_or_default()
}
fn phase_pvc(p: &PersistentVolumeClaim) -> String {
    p.status
        .as_ref()
        .and_then(|s| s.phase.clone())
        .unwrap_or_default()
}

struct Apis {
    pvs: Api<PersistentVolume>,
    pvcs: Api<PersistentVolumeClaim>,
    scs: Api<StorageClass>,
    pods: Api<Pod>,
}

fn apis(sim: &Sim) -> Apis {
    let c = sim.client();
    Apis {
        pvs: Api::all(c.clone()),
        pvcs: Api::namespaced(c.clone(), "default"),
        scs: Api::all(c.clone()),
        pods: Api::namespaced(c, "default"),
    }
}

#[tokio::test]
async fn dynamic_provisioning_flow_binds_and_releases() {
    let sim = Sim::start(SimConfig::default()).await.unwrap();
    let a = apis(&sim);
    let pp = PostParams::default();
    a.scs
        .create(&pp, &sc("fast", "d.example.com", "Immediate"))
        .await
        .unwrap();
    let claim = a.pvcs.create(&pp, &pvc("c1", "fast")).await.unwrap();
    assert_eq!(
        claim.metadata.finalizers.as_deref(),
        Some(&["kubernetes.io/pvc-protection".to_string()][..])
    );
    let claim = wait_for("provisioner annotations", || async {
        let c = a.pvcs.get("c1").await.unwrap();
        (ann(&c.metadata, "volume.kubernetes.io/storage-provisioner").as_deref()
            == Some("d.example.com"))
        .then_some(c)
    })
    .await;
    assert_eq!(
        ann(
            &claim.metadata,
            "volume.beta.kubernetes.io/storage-provisioner"
        )
        .as_deref(),
        Some("d.example.com")
    );
    assert_eq!(phase_pvc(&claim), "Pending");

    // What the external provisioner does: a PV pre-bound to the claim (with its uid).
    let uid = claim.metadata.uid.clone().unwrap();
    let vol = a
        .pvs
        .create(&pp, &pv("pv-c1", "fast", Some(("c1", &uid))))
        .await
        .unwrap();
    assert_eq!(
        vol.metadata.finalizers.as_deref(),
        Some(&["kubernetes.io/pv-protection".to_string()][..])
    );
    let bound = wait_for("claim bound", || async {
        let c = a.pvcs.get("c1").await.unwrap();
        (phase_pvc(&c) == "Bound").then_some(c)
    })
    .await;
    assert_eq!(
        bound.spec.as_ref().unwrap().volume_name.as_deref(),
        Some("pv-c1")
    );
    assert_eq!(
        ann(&bound.metadata, "pv.kubernetes.io/bind-completed").as_deref(),
        Some("yes")
    );
    assert_eq!(
        ann(&bound.metadata, "pv.kubernetes.io/bound-by-controller").as_deref(),
        Some("yes")
    );
    let st = bound.status.unwrap();
    assert_eq!(st.capacity.unwrap()["storage"].0, "2Gi");
    assert_eq!(st.access_modes.unwrap(), ["ReadWriteOnce"]);
    let vol = wait_for("volume bound", || async {
        let v = a.pvs.get("pv-c1").await.unwrap();
        (phase_pv(&v) == "Bound").then_some(v)
    })
    .await;
    // The provisioner set the claimRef, so the controller did not mark the PV.
    assert_eq!(
        ann(&vol.metadata, "pv.kubernetes.io/bound-by-controller"),
        None
    );

    a.pvcs.delete("c1", &DeleteParams::default()).await.unwrap();
    let released = wait_for("volume released", || async {
        let v = a.pvs.get("pv-c1").await.unwrap();
        (phase_pv(&v) == "Released").then_some(v)
    })
    .await;
    assert_eq!(
        released.spec.unwrap().claim_ref.unwrap().uid.as_deref(),
        Some(uid.as_str())
    );
    assert!(matches!(a.pvcs.get("c1").await, Err(kube::Error::Api(s)) if s.code == 404));
    sim.shutdown().await;
}

#[tokio::test]
async fn static_volume_matches_claim_of_class_without_provisioner() {
    let sim = Sim::start(SimConfig::default()).await.unwrap();
    let a = apis(&sim);
    let pp = PostParams::default();
    let mut small = pv("small", "manual", None);
    small.spec.as_mut().unwrap().capacity = Some(
        [(
            "storage".to_string(),
            k8s_openapi::apimachinery::pkg::api::resource::Quantity("512Mi".into()),
        )]
        .into(),
    );
    a.pvs.create(&pp, &small).await.unwrap();
    a.pvs.create(&pp, &pv("big", "manual", None)).await.unwrap();
    wait_for("volume available", || async {
        (phase_pv(&a.pvs.get("big").await.unwrap()) == "Available").then_some(())
    })
    .await;
    a.pvcs.create(&pp, &pvc("c2", "manual")).await.unwrap();
    let c = wait_for("claim bound", || async {
        let c = a.pvcs.get("c2").await.unwrap();
        (phase_pvc(&c) == "Bound").then_some(c)
    })
    .await;
    assert_eq!(
        c.spec.unwrap().volume_name.as_deref(),
        Some("big"),
        "the only volume large enough"
    );
    let v = a.pvs.get("big").await.unwrap();
    assert_eq!(
        ann(&v.metadata, "pv.kubernetes.io/bound-by-controller").as_deref(),
        Some("yes")
    );
    assert_eq!(
        v.spec.unwrap().claim_ref.unwrap().name.as_deref(),
        Some("c2")
    );
    assert_eq!(phase_pv(&a.pvs.get("small").await.unwrap()), "Available");
}

#[tokio::test]
async fn protection_keeps_bound_volume_until_claim_is_gone_and_claim_until_pod_is_gone() {
    let sim = Sim::start(SimConfig::default()).await.unwrap();
    let a = apis(&sim);
    let pp = PostParams::default();
    let claim = a.pvcs.create(&pp, &pvc("c3", "")).await.unwrap();
    a.pvs
        .create(
            &pp,
            &pv(
                "pv3",
                "",
                Some(("c3", claim.metadata.uid.as_deref().unwrap())),
            ),
        )
        .await
        .unwrap();
    wait_for("claim bound", || async {
        (phase_pvc(&a.pvcs.get("c3").await.unwrap()) == "Bound").then_some(())
    })
    .await;
    let pod: Pod = obj(
        json!({"metadata": {"name": "user"}, "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "i"}],
                               "volumes": [{"name": "v", "persistentVolumeClaim": {"claimName": "c3"}}]}}),
    );
    a.pods.create(&pp, &pod).await.unwrap();
    wait_for("pod running", || async {
        (a.pods
            .get("user")
            .await
            .unwrap()
            .status
            .and_then(|s| s.phase)
            .as_deref()
            == Some("Running"))
        .then_some(())
    })
    .await;

    a.pvs.delete("pv3", &DeleteParams::default()).await.unwrap();
    a.pvcs.delete("c3", &DeleteParams::default()).await.unwrap();
    // Held by the pod (claim) and by the claim (volume). Let the controllers run a full pass.
    sim.settle(WAIT).await.unwrap();
    let v = a.pvs.get("pv3").await.unwrap();
    assert!(v.metadata.deletion_timestamp.is_some());
    assert_eq!(phase_pv(&v), "Bound");
    assert!(
        a.pvcs
            .get("c3")
            .await
            .unwrap()
            .metadata
            .deletion_timestamp
            .is_some()
    );

    a.pods
        .delete("user", &DeleteParams::default())
        .await
        .unwrap();
    wait_for("claim and volume gone", || async {
        let claim_gone =
            matches!(a.pvcs.get("c3").await, Err(kube::Error::Api(s)) if s.code == 404);
        let vol_gone = matches!(a.pvs.get("pv3").await, Err(kube::Error::Api(s)) if s.code == 404);
        (claim_gone && vol_gone).then_some(())
    })
    .await;
}

#[tokio::test]
async fn volume_gone_while_bound_makes_claim_lost() {
    let sim = Sim::start(SimConfig::default()).await.unwrap();
    let a = apis(&sim);
    let pp = PostParams::default();
    let claim = a.pvcs.create(&pp, &pvc("c4", "")).await.unwrap();
    a.pvs
        .create(
            &pp,
            &pv(
                "pv4",
                "",
                Some(("c4", claim.metadata.uid.as_deref().unwrap())),
            ),
        )
        .await
        .unwrap();
    wait_for("claim bound", || async {
        (phase_pvc(&a.pvcs.get("c4").await.unwrap()) == "Bound").then_some(())
    })
    .await;
    a.pvs.delete("pv4", &DeleteParams::default()).await.unwrap();
    // An admin forcing it: drop the protection finalizer.
    a.pvs
        .patch(
            "pv4",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await
        .unwrap();
    wait_for("claim lost", || async {
        (phase_pvc(&a.pvcs.get("c4").await.unwrap()) == "Lost").then_some(())
    })
    .await;
}

#[tokio::test]
async fn wait_for_first_consumer_gets_selected_node_then_provisioner() {
    let sim = Sim::start(SimConfig::default()).await.unwrap();
    let a = apis(&sim);
    let pp = PostParams::default();
    a.scs
        .create(&pp, &sc("late", "d.example.com", "WaitForFirstConsumer"))
        .await
        .unwrap();
    a.pvcs.create(&pp, &pvc("c5", "late")).await.unwrap();
    let events: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(sim.client(), "default");
    wait_for("WaitForFirstConsumer event", || async {
        let l = events.list(&Default::default()).await.unwrap();
        l.items
            .iter()
            .any(|e| e.reason.as_deref() == Some("WaitForFirstConsumer"))
            .then_some(())
    })
    .await;
    assert_eq!(
        ann(
            &a.pvcs.get("c5").await.unwrap().metadata,
            "volume.kubernetes.io/storage-provisioner"
        ),
        None
    );
    let pod: Pod = obj(
        json!({"metadata": {"name": "consumer"}, "spec": {"nodeName": "node-7", "containers": [{"name": "c", "image": "i"}],
                               "volumes": [{"name": "v", "persistentVolumeClaim": {"claimName": "c5"}}]}}),
    );
    a.pods.create(&pp, &pod).await.unwrap();
    let c = wait_for("selected node and provisioner", || async {
        let c = a.pvcs.get("c5").await.unwrap();
        ann(&c.metadata, "volume.kubernetes.io/storage-provisioner").map(|_| c)
    })
    .await;
    assert_eq!(
        ann(&c.metadata, "volume.kubernetes.io/selected-node").as_deref(),
        Some("node-7")
    );
}

#[tokio::test]
async fn provisioned_volume_for_a_claim_bound_elsewhere_is_released() {
    let sim = Sim::start(SimConfig::default()).await.unwrap();
    let a = apis(&sim);
    let pp = PostParams::default();
    let claim = a.pvcs.create(&pp, &pvc("c6", "")).await.unwrap();
    let uid = claim.metadata.uid.clone().unwrap();
    a.pvs
        .create(&pp, &pv("first", "", Some(("c6", &uid))))
        .await
        .unwrap();
    wait_for("claim bound", || async {
        (phase_pvc(&a.pvcs.get("c6").await.unwrap()) == "Bound").then_some(())
    })
    .await;
    // A second, duplicate volume provisioned for the same claim is not needed any more.
    a.pvs
        .create(&pp, &pv("second", "", Some(("c6", &uid))))
        .await
        .unwrap();
    wait_for("duplicate released", || async {
        (phase_pv(&a.pvs.get("second").await.unwrap()) == "Released").then_some(())
    })
    .await;
    assert_eq!(
        a.pvcs
            .get("c6")
            .await
            .unwrap()
            .spec
            .unwrap()
            .volume_name
            .as_deref(),
        Some("first")
    );
}

#[tokio::test]
async fn deleting_a_namespace_deletes_its_contents_then_itself() {
    use k8s_openapi::api::core::v1::{Namespace, Secret};
    let sim = Sim::start(SimConfig::default()).await.unwrap();
    let c = sim.client();
    let nss: Api<Namespace> = Api::all(c.clone());
    nss.create(
        &PostParams::default(),
        &obj(json!({"metadata": {"name": "scratch"}})),
    )
    .await
    .unwrap();
    let secrets: Api<Secret> = Api::namespaced(c.clone(), "scratch");
    secrets
        .create(
            &PostParams::default(),
            &obj(json!({"metadata": {"name": "s"}})),
        )
        .await
        .unwrap();
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(c, "scratch");
    claims
        .create(&PostParams::default(), &pvc("c", ""))
        .await
        .unwrap();
    let ns = nss
        .delete("scratch", &DeleteParams::default())
        .await
        .unwrap()
        .left()
        .expect("namespace terminates first");
    assert_eq!(ns.status.unwrap().phase.as_deref(), Some("Terminating"));
    let refused = secrets
        .create(
            &PostParams::default(),
            &obj(json!({"metadata": {"name": "late"}})),
        )
        .await;
    assert!(matches!(refused, Err(kube::Error::Api(s)) if s.code == 403 || s.code == 404));
    wait_for("namespace gone", || async {
        matches!(nss.get("scratch").await, Err(kube::Error::Api(s)) if s.code == 404).then_some(())
    })
    .await;
    assert!(sim.objects("persistentvolumeclaims").is_empty() && sim.objects("secrets").is_empty());
}

/// kube-scheduler places a pod that names no node: for its unbound WaitForFirstConsumer claim it
/// writes `selected-node` (a node the pod's nodeSelector and tolerations allow, inside the
/// class's allowedTopologies), and binds the pod only once the claim is Bound. kube-sim used to
/// leave such a pod unscheduled, and selected a node only for pods created with `nodeName`.
#[tokio::test]
async fn a_pod_without_a_node_is_scheduled_as_kube_scheduler_does() {
    let sim = Sim::start(SimConfig::default()).await.unwrap();
    let a = apis(&sim);
    let pp = PostParams::default();
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(sim.client());
    let node = |name: &str, zone: &str, taint: bool| {
        let mut n = json!({"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "zone": zone}}});
        if taint {
            n["spec"] = json!({"taints": [{"key": "node.kubernetes.io/unreachable", "effect": "NoSchedule"}]});
        }
        obj::<k8s_openapi::api::core::v1::Node>(n)
    };
    // n1: outside the class's zone; n2: tainted; n3: the only fit for an intolerant pod.
    for (name, zone, taint) in [("n1", "b", false), ("n2", "a", true), ("n3", "a", false)] {
        nodes.create(&pp, &node(name, zone, taint)).await.unwrap();
    }
    let mut class = sc("zonal", "d.example.com", "WaitForFirstConsumer");
    class.allowed_topologies = Some(obj(
        json!([{"matchLabelExpressions": [{"key": "zone", "values": ["a"]}]}]),
    ));
    a.scs.create(&pp, &class).await.unwrap();
    let claim = a.pvcs.create(&pp, &pvc("data", "zonal")).await.unwrap();
    let pod: Pod = obj(json!({"metadata": {"name": "app"}, "spec": {
        "containers": [{"name": "c", "image": "i"}],
        "volumes": [{"name": "v", "persistentVolumeClaim": {"claimName": "data"}}]}}));
    a.pods.create(&pp, &pod).await.unwrap();
    wait_for("the selected node", || async {
        let c = a.pvcs.get("data").await.unwrap();
        (ann(&c.metadata, "volume.kubernetes.io/selected-node").as_deref() == Some("n3"))
            .then_some(())
    })
    .await;
    let unbound = a.pods.get("app").await.unwrap();
    assert_eq!(
        unbound.spec.unwrap().node_name,
        None,
        "bound only once its claim is"
    );
    // The provisioner's PV: the claim binds, the pod is bound to the node and runs.
    let uid = claim.metadata.uid.as_deref().unwrap();
    a.pvs
        .create(&pp, &pv("pv-data", "zonal", Some(("data", uid))))
        .await
        .unwrap();
    let placed = wait_for("the pod bound to n3 and running", || async {
        let p = a.pods.get("app").await.unwrap();
        let running = p.status.as_ref()?.phase.as_deref() == Some("Running");
        running.then(|| p.spec?.node_name)?
    })
    .await;
    assert_eq!(placed, "n3");
}

/// kube-controller-manager's pv- and pvc-protection controllers put their finalizer back on a
/// live PV or claim that lost it (seen on 1.20); kube-sim added them only at creation.
#[tokio::test]
async fn protection_finalizers_come_back_on_live_objects() {
    let sim = Sim::start(SimConfig::default()).await.unwrap();
    let a = apis(&sim);
    let pp = PostParams::default();
    a.pvcs.create(&pp, &pvc("held", "none")).await.unwrap();
    a.pvs
        .create(&pp, &pv("held-pv", "none", None))
        .await
        .unwrap();
    let strip = PatchParams::default();
    let none = Patch::Merge(json!({"metadata": {"finalizers": null}}));
    a.pvcs.patch("held", &strip, &none).await.unwrap();
    a.pvs.patch("held-pv", &strip, &none).await.unwrap();
    wait_for("both protection finalizers back", || async {
        let claim = a.pvcs.get("held").await.unwrap().metadata.finalizers?;
        let pv = a.pvs.get("held-pv").await.unwrap().metadata.finalizers?;
        (claim == ["kubernetes.io/pvc-protection"] && pv == ["kubernetes.io/pv-protection"])
            .then_some(())
    })
    .await;
}
