//! CSI migration end to end (issue 31), for each of the seven plugins with a mock driver of its
//! name: an in-tree StorageClass and a claim of it (kube-sim annotates the claim for the CSI
//! driver, as kube-controller-manager does under migration) are provisioned to a PV in in-tree
//! form and deleted again through the driver; and an in-tree PV made before migration, released
//! with reclaim Delete, gets the deletion-protection finalizer and is deleted through the driver.
//! Issue 41: clones and restores into a migrated class, an in-tree PV whose handle does not
//! translate, Azure File shares whose in-tree PV does not tell the storage account (item 4) and
//! the capacity of a migrated volume's zone (item 5).

mod common;

use std::collections::BTreeMap;

use common::*;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::{CSINode, StorageClass};
use kube::api::{Api, DeleteParams, PostParams};
use mock_csi_driver::store::ContentSource;
use serde_json::{Value, json};

const NS: &str = "default";
const FINALIZER: &str = "external-provisioner.volume.kubernetes.io/finalizer";

/// One plugin's driver and what its volumes look like.
struct Plugin {
    in_tree: &'static str,
    driver: &'static str,
    /// The driver's zone key and the zone of its one node, for zonal plugins.
    zone: Option<(&'static str, &'static str)>,
    /// Mock driver flags giving volume ids (and context) of the plugin's shape.
    id_flags: &'static [&'static str],
    /// Class parameters.
    params: &'static [(&'static str, &'static str)],
    /// The in-tree source field of a PV, and `pre_made(id, name)`: the source of a PV made
    /// before migration for volume `id` created under `name`.
    field: &'static str,
    pre_made: fn(&str, &str) -> Value,
}

const PLUGINS: [Plugin; 7] = [
    Plugin {
        in_tree: "kubernetes.io/aws-ebs",
        driver: "ebs.csi.aws.com",
        zone: Some(("topology.ebs.csi.aws.com/zone", "us-east-1a")),
        id_flags: &[],
        params: &[("type", "gp2"), ("fsType", "ext4")],
        field: "awsElasticBlockStore",
        pre_made: |id, _| json!({"volumeID": format!("aws://us-east-1a/{id}"), "fsType": "ext4"}),
    },
    Plugin {
        in_tree: "kubernetes.io/gce-pd",
        driver: "pd.csi.storage.gke.io",
        zone: Some(("topology.gke.io/zone", "us-central1-a")),
        id_flags: &["--volume-id-template=projects/UNSPECIFIED/zones/{zone}/disks/{name}"],
        params: &[("type", "pd-standard")],
        field: "gcePersistentDisk",
        pre_made: |_, name| json!({"pdName": name}),
    },
    Plugin {
        in_tree: "kubernetes.io/azure-disk",
        driver: "disk.csi.azure.com",
        zone: None,
        id_flags: &[
            "--volume-id-template=/subscriptions/s1/resourceGroups/rg1/providers/Microsoft.Compute/disks/{name}",
        ],
        params: &[("skuName", "Standard_LRS"), ("kind", "Managed")],
        field: "azureDisk",
        pre_made: |id, name| json!({"diskName": name, "diskURI": id, "kind": "Managed"}),
    },
    Plugin {
        in_tree: "kubernetes.io/azure-file",
        driver: "file.csi.azure.com",
        zone: None,
        id_flags: &["--volume-id-template=rg1#acct1#{name}#{name}#default"],
        params: &[("skuName", "Standard_LRS")],
        field: "azureFile",
        pre_made: |_, name| {
            json!({"shareName": name, "secretName": "azure-storage-account-acct1-secret",
                   "secretNamespace": "default"})
        },
    },
    Plugin {
        in_tree: "kubernetes.io/cinder",
        driver: "cinder.csi.openstack.org",
        zone: Some(("topology.cinder.csi.openstack.org/zone", "nova")),
        id_flags: &[],
        params: &[("availability", "nova")],
        field: "cinder",
        pre_made: |id, _| json!({"volumeID": id}),
    },
    Plugin {
        in_tree: "kubernetes.io/vsphere-volume",
        driver: "csi.vsphere.vmware.com",
        zone: None,
        id_flags: &[
            "--volume-id-template=[ds1] {name}.vmdk",
            "--volume-context=initialvolumefilepath=[ds1] {name}.vmdk",
        ],
        params: &[("diskformat", "thin")],
        field: "vsphereVolume",
        pre_made: |id, _| json!({"volumePath": id}),
    },
    Plugin {
        in_tree: "kubernetes.io/portworx-volume",
        driver: "pxd.portworx.com",
        zone: None,
        id_flags: &[],
        params: &[("repl", "1")],
        field: "portworxVolume",
        pre_made: |id, _| json!({"volumeID": id}),
    },
];

fn obj<T: serde::de::DeserializeOwned>(v: Value) -> T {
    serde_json::from_value(v).expect("well-formed object")
}

/// The cluster with the plugin's driver (and, for zonal plugins, its node registered with the
/// driver's zone key), and the sidecar.
async fn start(p: &Plugin) -> (Cluster, Driver, Sidecar) {
    start_with(p, &[], &[]).await
}

/// [`start`] with more sidecar flags and environment.
async fn start_with(
    p: &Plugin,
    extra: &[&str],
    env: &[(&str, &str)],
) -> (Cluster, Driver, Sidecar) {
    let cluster = Cluster::start().await;
    let (node_id, mut flags): (&str, Vec<String>) = match p.zone {
        Some((key, zone)) => (
            zone,
            vec!["--topology".into(), format!("--topology-key={key}")],
        ),
        None => ("node-1", vec![]),
    };
    flags.extend(p.id_flags.iter().map(|f| (*f).to_owned()));
    let mut labels = BTreeMap::from([("kubernetes.io/hostname".to_owned(), "node-1".to_owned())]);
    if let Some((key, zone)) = p.zone {
        labels.insert(key.to_owned(), zone.to_owned());
    }
    cluster
        .create(
            &cluster.nodes(),
            &obj(json!({"metadata": {"name": "node-1", "labels": labels}})),
        )
        .await;
    let keys: Vec<&str> = p.zone.iter().map(|(k, _)| *k).collect();
    let csinode: CSINode = obj(json!({"metadata": {"name": "node-1"}, "spec": {"drivers": [
        {"name": p.driver, "nodeID": node_id, "topologyKeys": keys}]}}));
    cluster.create(&cluster.csinodes(), &csinode).await;
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let driver = Driver::start_as(cluster.dir.path(), node_id, p.driver, &flags).await;
    let mut sidecar_flags = vec![
        "--feature-gates=Topology=true",
        "--http-endpoint=127.0.0.1:0",
    ];
    sidecar_flags.extend_from_slice(extra);
    let sidecar = Sidecar::start_env(&cluster, &driver, &sidecar_flags, env).await;
    (cluster, driver, sidecar)
}

fn annotation<'a>(pv: &'a PersistentVolume, key: &str) -> Option<&'a str> {
    pv.metadata
        .annotations
        .as_ref()?
        .get(key)
        .map(String::as_str)
}

fn pv_json(pv: &PersistentVolume) -> Value {
    serde_json::to_value(pv).expect("PV as JSON")
}

async fn provisioned_and_deleted(p: &Plugin) {
    let (cluster, driver, sidecar) = start(p).await;
    let class: StorageClass = obj(json!({
        "metadata": {"name": "intree"}, "provisioner": p.in_tree,
        "reclaimPolicy": "Delete", "volumeBindingMode": "Immediate",
        "parameters": p.params.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect::<BTreeMap<_, _>>()
    }));
    cluster.add_class(&class).await;
    cluster.claim_of_class(NS, "data", "intree", "1Gi").await;
    let pv = cluster.wait_bound(NS, "data").await;
    let json = pv_json(&pv);
    let state = driver.wait_volumes(1).await;
    let volume = &state.volumes[0];
    assert!(
        json["spec"]["csi"].is_null(),
        "{}: written back in in-tree form: {json}",
        p.driver
    );
    assert!(json["spec"][p.field].is_object(), "{}: {json}", p.driver);
    assert_eq!(
        annotation(&pv, "pv.kubernetes.io/provisioned-by"),
        Some(p.in_tree)
    );
    assert!(
        pv.metadata
            .finalizers
            .iter()
            .flatten()
            .any(|f| f == FINALIZER),
        "{}: the deletion-protection finalizer: {json}",
        p.driver
    );
    if let Some((_, zone)) = p.zone {
        let labels = pv.metadata.labels.clone().unwrap_or_default();
        assert_eq!(
            labels
                .get("topology.kubernetes.io/zone")
                .map(String::as_str),
            Some(zone),
            "{}: the zone label: {json}",
            p.driver
        );
        let affinity = json["spec"]["nodeAffinity"].to_string();
        assert!(
            affinity.contains("topology.kubernetes.io/zone"),
            "{affinity}"
        );
        assert!(
            !affinity.contains(p.zone.unwrap().0),
            "no CSI key left: {affinity}"
        );
    }
    match p.field {
        "awsElasticBlockStore" => {
            assert_eq!(json["spec"][p.field]["volumeID"], volume.id.as_str());
            assert_eq!(
                json["spec"][p.field]["fsType"], "ext4",
                "fsType from the class"
            );
            let labels = pv.metadata.labels.clone().unwrap_or_default();
            assert_eq!(
                labels
                    .get("topology.kubernetes.io/region")
                    .map(String::as_str),
                Some("us-east-1"),
                "the region of the zone"
            );
        }
        "gcePersistentDisk" => assert_eq!(json["spec"][p.field]["pdName"], volume.name.as_str()),
        "azureDisk" => {
            assert_eq!(json["spec"][p.field]["diskURI"], volume.id.as_str());
            assert_eq!(json["spec"][p.field]["diskName"], volume.name.as_str());
        }
        "azureFile" => assert_eq!(json["spec"][p.field]["shareName"], volume.name.as_str()),
        "vsphereVolume" => assert_eq!(json["spec"][p.field]["volumePath"], volume.id.as_str()),
        _ => assert_eq!(json["spec"][p.field]["volumeID"], volume.id.as_str()),
    }
    // kube-controller-manager (here kube-sim) marks it migrated; the sidecar deletes it.
    wait_for("migrated-to on the PV", DEADLINE, || async {
        let pv = cluster.pvs().get(pv.metadata.name.as_deref()?).await.ok()?;
        (annotation(&pv, "pv.kubernetes.io/migrated-to") == Some(p.driver)).then_some(())
    })
    .await;
    let migrated_calls = sidecar
        .try_metrics()
        .await
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains("CreateVolume") && l.contains("migrated=\"true\""))
        .count();
    assert!(
        migrated_calls > 0,
        "{}: CreateVolume labelled migrated",
        p.driver
    );
    cluster.delete_pvc_and_wait(NS, "data").await;
    cluster
        .wait_pv_gone(pv.metadata.name.as_deref().unwrap())
        .await;
    let state = driver.wait_volumes(0).await;
    assert!(
        state.delete_calls.iter().any(|(id, _)| *id == volume.id),
        "{}: deleted through the driver",
        p.driver
    );
}

async fn pre_migration_pv_deleted(p: &Plugin) {
    let (cluster, driver, _sidecar) = start(p).await;
    let name = "premade-1";
    // On the driver's own node: its zone for zonal plugins.
    let id = driver.create_volume_on(name, None, Some(1 << 30)).await;
    let mut labels = BTreeMap::new();
    if let Some((_, zone)) = p.zone {
        labels.insert("topology.kubernetes.io/zone".to_owned(), zone.to_owned());
    }
    let mut annotations = BTreeMap::from([(
        "pv.kubernetes.io/provisioned-by".to_owned(),
        p.in_tree.to_owned(),
    )]);
    if p.field == "azureFile" {
        // The share's resource group, which its handle starts with.
        annotations.insert(
            "kubernetes.io/azure-file-resource-group".to_owned(),
            "rg1".to_owned(),
        );
    }
    let pv: PersistentVolume = obj(json!({
        "metadata": {"name": name, "labels": labels, "annotations": annotations},
        "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                 "persistentVolumeReclaimPolicy": "Delete", "storageClassName": "old",
                 p.field: (p.pre_made)(&id, name),
                 "claimRef": {"namespace": NS, "name": "old-data"}}
    }));
    Api::<PersistentVolume>::all(cluster.client.clone())
        .create(&PostParams::default(), &pv)
        .await
        .expect("create the in-tree PV");
    let mut claim: PersistentVolumeClaim = claim(NS, "old-data", "old", "1Gi");
    claim.spec.as_mut().unwrap().volume_name = Some(name.to_owned());
    cluster.create(&cluster.pvcs(NS), &claim).await;
    cluster.wait_bound(NS, "old-data").await;
    wait_for("the finalizer on the in-tree PV", DEADLINE, || async {
        let pv = cluster.pvs().get(name).await.ok()?;
        pv.metadata
            .finalizers
            .iter()
            .flatten()
            .any(|f| f == FINALIZER)
            .then_some(())
    })
    .await;
    let _ = cluster
        .pvcs(NS)
        .delete("old-data", &DeleteParams::default())
        .await;
    cluster.wait_pv_gone(name).await;
    let state = driver.wait_volumes(0).await;
    assert!(
        state.delete_calls.iter().any(|(d, _)| *d == id),
        "{}: the translated handle {id} was deleted through the driver",
        p.driver
    );
}

#[tokio::test]
async fn each_plugin_provisions_an_in_tree_class_to_an_in_tree_pv_and_deletes_it() {
    for p in &PLUGINS {
        provisioned_and_deleted(p).await;
    }
}

#[tokio::test]
async fn each_plugin_deletes_a_released_pre_migration_in_tree_pv_through_the_driver() {
    for p in &PLUGINS {
        pre_migration_pv_deleted(p).await;
    }
}

/// A driver answering a volume id its in-tree plugin cannot hold (a GCE PD id that is not
/// `projects/…/disks/<name>`): no PV is written, the volume is deleted again and the claim says
/// why (upstream keeps the volume and retries writing the PV for ever).
#[tokio::test]
async fn a_volume_that_cannot_be_written_in_tree_is_deleted_again_and_reported() {
    let gce = &PLUGINS[1];
    // The mock's own uuid ids, not GCE's handle shape.
    let p = Plugin {
        id_flags: &[],
        ..*gce
    };
    let (cluster, driver, _sidecar) = start(&p).await;
    let class: StorageClass = obj(json!({
        "metadata": {"name": "intree"}, "provisioner": p.in_tree,
        "reclaimPolicy": "Delete", "volumeBindingMode": "Immediate"
    }));
    cluster.add_class(&class).await;
    cluster.claim_of_class(NS, "data", "intree", "1Gi").await;
    let message = cluster
        .wait_claim_event(NS, "data", "ProvisioningFailed", "kubernetes.io/gce-pd")
        .await;
    assert!(
        message.contains("failed to get id components"),
        "the translation's own words: {message}"
    );
    let state = wait_for("the volume deleted again", DEADLINE, || async {
        let s = driver.state().await;
        (s.ok_calls("CreateVolume") > 0 && !s.delete_calls.is_empty()).then_some(s)
    })
    .await;
    let made = &state.delete_calls[0].0;
    assert!(
        cluster
            .pvs()
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .is_empty(),
        "no PV for a volume the sidecar could not describe"
    );
    let _ = cluster
        .pvcs(NS)
        .delete("data", &DeleteParams::default())
        .await;
    let state = driver.wait_volumes(0).await;
    assert!(
        state.volumes.iter().all(|v| &v.id != made),
        "nothing left on the driver"
    );
}

const CLONE_FINALIZER: &str = "provisioner.storage.kubernetes.io/cloning-protection";

/// `claim(ns, name, class, size)` with a data source of `kind` (`group`) named `source`.
fn with_source(
    name: &str,
    class: &str,
    group: Option<&str>,
    kind: &str,
    source: &str,
) -> PersistentVolumeClaim {
    let mut c = claim(NS, name, class, "1Gi");
    c.spec.as_mut().expect("spec").data_source =
        Some(k8s_openapi::api::core::v1::TypedLocalObjectReference {
            api_group: group.map(str::to_owned),
            kind: kind.to_owned(),
            name: source.to_owned(),
        });
    c
}

/// The in-tree class `intree` of `p`, and `csi`, the driver's own class; then a claim `src` of
/// `csi` bound to a CSI PV of the driver. Returns that PV's volume handle.
async fn classes_and_a_csi_source(cluster: &Cluster, p: &Plugin) -> String {
    for (name, provisioner) in [("intree", p.in_tree), ("csi", p.driver)] {
        let class: StorageClass = obj(json!({
            "metadata": {"name": name}, "provisioner": provisioner,
            "reclaimPolicy": "Delete", "volumeBindingMode": "Immediate",
            "parameters": p.params.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect::<BTreeMap<_, _>>()
        }));
        cluster.add_class(&class).await;
    }
    cluster.claim_of_class(NS, "src", "csi", "1Gi").await;
    let pv = cluster.wait_bound(NS, "src").await;
    pv.spec
        .and_then(|s| s.csi)
        .expect("a CSI PV of the driver's own class")
        .volume_handle
}

/// The driver's volume behind the in-tree PV `pv` (its handle is the portworxVolume id).
async fn content_source_of(driver: &Driver, pv: &PersistentVolume) -> Option<ContentSource> {
    let json = pv_json(pv);
    let id = json["spec"]["portworxVolume"]["volumeID"]
        .as_str()
        .expect("written back in in-tree form");
    let state = driver.state().await;
    state
        .volumes
        .iter()
        .find(|v| v.id == id)
        .expect("the PV's volume on the driver")
        .content_source
        .clone()
}

/// Issue 41: a clone and a snapshot restore into a migrated class (Portworx, whose translation
/// names the driver as provisioner) are checked against the translated class, as upstream: both
/// bind, with the content source sent and the clone-protection finalizer on the source claim.
#[tokio::test]
async fn a_migrated_class_clones_and_restores_sources_of_its_driver() {
    let p = &PLUGINS[6];
    let (cluster, driver, _sidecar) = start(p).await;
    let handle = classes_and_a_csi_source(&cluster, p).await;

    let copy = with_source("copy", "intree", None, "PersistentVolumeClaim", "src");
    cluster.create(&cluster.pvcs(NS), &copy).await;
    let pv = cluster.wait_bound(NS, "copy").await;
    assert_eq!(
        content_source_of(&driver, &pv).await,
        Some(ContentSource::Volume(handle.clone()))
    );
    assert_eq!(
        annotation(&pv, "pv.kubernetes.io/provisioned-by"),
        Some(p.in_tree)
    );
    let source = cluster.pvcs(NS).get("src").await.expect("the source claim");
    assert!(
        source
            .metadata
            .finalizers
            .iter()
            .flatten()
            .any(|f| f == CLONE_FINALIZER),
        "the clone-protection finalizer on the source: {:?}",
        source.metadata.finalizers
    );

    let id = make_snapshot(&cluster, &driver, p.driver, NS, &handle, "snap", true).await;
    let restore = with_source(
        "restored",
        "intree",
        Some("snapshot.storage.k8s.io"),
        "VolumeSnapshot",
        "snap",
    );
    cluster.create(&cluster.pvcs(NS), &restore).await;
    let pv = cluster.wait_bound(NS, "restored").await;
    assert_eq!(
        content_source_of(&driver, &pv).await,
        Some(ContentSource::Snapshot(id))
    );
    for claim in ["copy", "restored"] {
        let events = cluster.events_for("PersistentVolumeClaim", NS, claim).await;
        assert!(
            events
                .iter()
                .all(|(reason, _)| reason != "ProvisioningFailed"),
            "{claim}: {events:?}"
        );
    }
}

/// Issue 41: for a plugin whose translated class keeps the in-tree provisioner (EBS), upstream
/// finds the source's driver is not the class's and refuses a clone in its own words; ours says
/// the same, sends no CreateVolume for it and never claims it will read the source later.
#[tokio::test]
async fn a_clone_into_a_migrated_class_the_translation_refuses_fails_in_upstreams_words() {
    let p = &PLUGINS[0];
    let (cluster, driver, _sidecar) = start(p).await;
    classes_and_a_csi_source(&cluster, p).await;

    let copy = with_source("copy", "intree", None, "PersistentVolumeClaim", "src");
    cluster.create(&cluster.pvcs(NS), &copy).await;
    let message = cluster
        .wait_claim_event(NS, "copy", "ProvisioningFailed", "DataSource")
        .await;
    assert_eq!(
        message,
        "error getting handle for DataSource Type PersistentVolumeClaim by Name src: claim in dataSource not bound or invalid"
    );
    let state = driver.state().await;
    assert_eq!(state.volumes.len(), 1, "only the source's volume");
    let events = cluster
        .events_for("PersistentVolumeClaim", NS, "copy")
        .await;
    assert!(
        events.iter().all(|(_, m)| !m.contains("not read")),
        "{events:?}"
    );
}

/// Issue 41: an in-tree EBS PV made before migration whose volume id does not translate is
/// protected while bound, as upstream; once released its deletion fails with upstream's event,
/// counted as a failed deletion, and the PV stays (with the finalizer) while it is retried.
#[tokio::test]
async fn an_in_tree_pv_whose_handle_does_not_translate_is_kept_and_its_deletion_reported() {
    const ID: &str = "aws://us-east-1a/not-an-ebs-id";
    let p = &PLUGINS[0];
    let (cluster, driver, sidecar) = start(p).await;
    let name = "broken-1";
    let pv: PersistentVolume = obj(json!({
        "metadata": {"name": name,
            "labels": {"topology.kubernetes.io/zone": "us-east-1a"},
            "annotations": {"pv.kubernetes.io/provisioned-by": p.in_tree}},
        "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                 "persistentVolumeReclaimPolicy": "Delete", "storageClassName": "old",
                 "awsElasticBlockStore": {"volumeID": ID, "fsType": "ext4"},
                 "claimRef": {"namespace": NS, "name": "old-data"}}
    }));
    Api::<PersistentVolume>::all(cluster.client.clone())
        .create(&PostParams::default(), &pv)
        .await
        .expect("create the in-tree PV");
    bind_protect_and_release(&cluster, name, None).await;
    let message = cluster
        .wait_pv_event(name, "VolumeFailedDelete", "translate")
        .await;
    assert_eq!(
        message,
        format!(
            "failed to translate Kubernetes ID to EBS Volume ID Invalid format for AWS volume ({ID})"
        )
    );
    let failed = r#"controller_persistentvolume_delete_failed_total{class="old"}"#;
    wait_for("the failed deletion counted", DEADLINE, || async {
        (sidecar.metric(failed).await? >= 1.0).then_some(())
    })
    .await;
    let pv = cluster.pvs().get(name).await.expect("the PV is kept");
    assert!(
        has_finalizer(&pv),
        "the finalizer stays while it is retried"
    );
    assert!(pv.metadata.deletion_timestamp.is_none());
    assert_eq!(
        driver.state().await.calls("DeleteVolume"),
        0,
        "nothing is deleted on the driver"
    );
}

/// Issue 41, item 5: the capacity of the zone a migrated in-tree volume lands in (the driver's
/// own class's object there) is refreshed right after it is provisioned, although its PV's
/// affinity names the in-tree zone label, which no segment of the driver uses; the poll interval
/// is longer than the test.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_capacity_of_a_migrated_volumes_zone_is_refreshed_at_once() {
    let p = &PLUGINS[0];
    assert_eq!(p.driver, "ebs.csi.aws.com");
    let (key, zone) = p.zone.expect("a zonal plugin");
    let (cluster, _driver, _sidecar) = start_with(
        p,
        &[
            "--enable-capacity",
            "--capacity-poll-interval=1h",
            "--capacity-ownerref-level=-1",
        ],
        &[("NAMESPACE", NS)],
    )
    .await;
    let class: StorageClass = obj(json!({
        "metadata": {"name": "intree"}, "provisioner": p.in_tree,
        "reclaimPolicy": "Delete", "volumeBindingMode": "WaitForFirstConsumer",
        "parameters": {"type": "gp2"}
    }));
    cluster.add_class(&class).await;
    // Capacity is published for the driver's own classes (as upstream: not for in-tree ones);
    // an in-tree volume takes from the same pool.
    let csi_class: StorageClass = obj(json!({
        "metadata": {"name": "csi"}, "provisioner": p.driver,
        "reclaimPolicy": "Delete", "volumeBindingMode": "WaitForFirstConsumer",
    }));
    cluster.add_class(&csi_class).await;
    let capacities: Api<k8s_openapi::api::storage::v1::CSIStorageCapacity> =
        Api::namespaced(cluster.client.clone(), NS);
    let capacity_of_zone = || async {
        let list = capacities.list(&Default::default()).await.ok()?;
        list.items.into_iter().find_map(|c| {
            let labels = c.node_topology.as_ref()?.match_labels.as_ref()?;
            (c.storage_class_name == "csi" && labels.get(key).map(String::as_str) == Some(zone))
                .then(|| c.capacity.clone())?
        })
    };
    let before = wait_for("the zone's capacity object", DEADLINE, || async {
        capacity_of_zone().await
    })
    .await;

    cluster.claim_of_class(NS, "data", "intree", "1Gi").await;
    cluster.schedule(NS, "app", "data", "node-1").await;
    let pv = cluster.wait_bound(NS, "data").await;
    assert!(
        pv_json(&pv)["spec"]["awsElasticBlockStore"].is_object(),
        "an in-tree PV"
    );
    let after = wait_for("the zone's capacity refreshed", DEADLINE, || async {
        capacity_of_zone().await.filter(|q| *q != before)
    })
    .await;
    assert_ne!(after, before);
}

/// Azure File with the driver's own id shape (`<rg>#<account>#<share>#<disk>#<uuid>#<namespace>`,
/// no disk and no uuid for a share named after the volume) and a context naming the share.
fn azure_file_with_the_drivers_ids() -> Plugin {
    Plugin {
        id_flags: &[
            "--volume-id-template=rg1#acct1#{name}###default",
            "--volume-context=sharename={name}",
        ],
        ..PLUGINS[3]
    }
}

/// Issue 41, item 4: a claim of an Azure File class with a node-stage secret. The in-tree source
/// keeps that secret's name, which does not tell the storage account, and (the driver's context
/// naming the share) no resource group: upstream deletes `#azure-secret#<share>#...`, which the
/// driver answers as a share that does not exist, and the share leaks. Ours keeps the driver's id
/// on the PV and deletes exactly that.
#[tokio::test]
async fn an_azure_file_share_with_a_node_stage_secret_is_deleted_under_the_drivers_id() {
    let p = azure_file_with_the_drivers_ids();
    let (cluster, driver, _sidecar) = start(&p).await;
    let class: StorageClass = obj(json!({
        "metadata": {"name": "intree"}, "provisioner": p.in_tree,
        "reclaimPolicy": "Delete", "volumeBindingMode": "Immediate",
        "parameters": {"skuName": "Standard_LRS",
            "csi.storage.k8s.io/node-stage-secret-name": "azure-secret",
            "csi.storage.k8s.io/node-stage-secret-namespace": "default"}
    }));
    cluster.add_class(&class).await;
    cluster.claim_of_class(NS, "data", "intree", "1Gi").await;
    let pv = cluster.wait_bound(NS, "data").await;
    let volume = driver.wait_volumes(1).await.volumes[0].clone();
    assert_eq!(volume.id, format!("rg1#acct1#{}###default", volume.name));
    let json = pv_json(&pv);
    assert_eq!(
        json["spec"]["azureFile"]["secretName"], "azure-secret",
        "{json}"
    );
    assert_eq!(json["spec"]["azureFile"]["shareName"], volume.name.as_str());
    assert_eq!(
        annotation(&pv, "kubernetes.io/azure-file-resource-group"),
        None,
        "as upstream: the share was named, so the id was not read for it"
    );
    assert_eq!(
        annotation(&pv, "csi-provisioner.rs/volume-id"),
        Some(volume.id.as_str())
    );

    cluster.delete_pvc_and_wait(NS, "data").await;
    cluster
        .wait_pv_gone(pv.metadata.name.as_deref().unwrap())
        .await;
    let state = driver.wait_volumes(0).await;
    let deleted: Vec<&str> = state
        .delete_calls
        .iter()
        .map(|(id, _)| id.as_str())
        .collect();
    assert_eq!(
        deleted,
        [volume.id.as_str()],
        "deleted under the driver's own id"
    );
}

/// Issue 41, item 4: an in-tree Azure File PV whose secret does not tell its storage account
/// (made by upstream for such a class) is never deleted under a made-up id: its deletion fails
/// with a Warning that says why and what to do, counted as a failed deletion, the PV and share
/// stay; once an operator annotates the PV with the share's id, it is deleted under that id.
#[tokio::test]
async fn an_in_tree_azure_file_pv_whose_account_cannot_be_told_is_kept_until_annotated() {
    let p = azure_file_with_the_drivers_ids();
    let (cluster, driver, sidecar) = start(&p).await;
    let name = "share-1";
    let id = driver.create_volume_on(name, None, Some(1 << 30)).await;
    assert_eq!(id, "rg1#acct1#share-1###default");
    let pv: PersistentVolume = obj(json!({
        "metadata": {"name": name,
            "annotations": {"pv.kubernetes.io/provisioned-by": p.in_tree}},
        "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteMany"],
                 "persistentVolumeReclaimPolicy": "Delete", "storageClassName": "old",
                 "azureFile": {"shareName": name, "secretName": "azure-secret",
                               "secretNamespace": NS},
                 "claimRef": {"namespace": NS, "name": "old-data"}}
    }));
    cluster
        .pvs()
        .create(&PostParams::default(), &pv)
        .await
        .expect("create the in-tree PV");
    bind_protect_and_release(&cluster, name, Some("ReadWriteMany")).await;
    let message = cluster
        .wait_pv_event(name, "VolumeFailedDelete", "storage account")
        .await;
    assert_eq!(
        message,
        "cannot tell the storage account of Azure File share \"share-1\": secretName \
         \"azure-secret\" is not azure-storage-account-<storage account>-secret; the share is \
         kept: to delete it, annotate the PV with csi-provisioner.rs/volume-id=<resource \
         group>#<storage account>#<share> (an empty resource group is the cluster's)"
    );
    let failed = r#"controller_persistentvolume_delete_failed_total{class="old"}"#;
    wait_for("the failed deletion counted", DEADLINE, || async {
        (sidecar.metric(failed).await? >= 1.0).then_some(())
    })
    .await;
    let kept = cluster.pvs().get(name).await.expect("the PV is kept");
    assert!(
        has_finalizer(&kept),
        "the finalizer stays while it is retried"
    );
    assert_eq!(driver.state().await.calls("DeleteVolume"), 0);
    assert_eq!(driver.state().await.volumes.len(), 1, "the share is kept");

    // What the event tells the operator to do.
    let patch = json!({"metadata": {"annotations": {"csi-provisioner.rs/volume-id": id}}});
    cluster
        .pvs()
        .patch(
            name,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&patch),
        )
        .await
        .expect("annotate the PV");
    cluster.wait_pv_gone(name).await;
    let state = driver.wait_volumes(0).await;
    let deleted: Vec<&str> = state.delete_calls.iter().map(|(d, _)| d.as_str()).collect();
    assert_eq!(deleted, [id.as_str()]);
}

/// Binds the claim `old-data` (class `old`, `access_mode` if given) to the in-tree PV `name`,
/// waits for our finalizer on the PV, then deletes the claim: the PV is released.
async fn bind_protect_and_release(cluster: &Cluster, name: &str, access_mode: Option<&str>) {
    let mut claim: PersistentVolumeClaim = claim(NS, "old-data", "old", "1Gi");
    let spec = claim.spec.as_mut().unwrap();
    spec.volume_name = Some(name.to_owned());
    if let Some(mode) = access_mode {
        spec.access_modes = Some(vec![mode.to_owned()]);
    }
    cluster.create(&cluster.pvcs(NS), &claim).await;
    cluster.wait_bound(NS, "old-data").await;
    wait_for(
        "the finalizer on the bound in-tree PV",
        DEADLINE,
        || async { has_finalizer(&cluster.pvs().get(name).await.ok()?).then_some(()) },
    )
    .await;
    let _ = cluster
        .pvcs(NS)
        .delete("old-data", &DeleteParams::default())
        .await;
}

/// Whether `pv` carries our deletion-protection finalizer.
fn has_finalizer(pv: &PersistentVolume) -> bool {
    pv.metadata
        .finalizers
        .iter()
        .flatten()
        .any(|f| f == FINALIZER)
}
