//! End to end: PVC -> CreateVolume -> PV on the API simulator with the mock driver as a separate
//! process, checked against both the API objects and the driver's own volume list.
//!
//! This file holds the shared helpers and the basic shape of what is provisioned; the cases are
//! grouped in `provision/`: bad input and wrong driver answers, topology, crashes and races.

mod common;

#[path = "provision/bad_input.rs"]
mod bad_input;
#[path = "provision/crash.rs"]
mod crash;
#[path = "provision/topology.rs"]
mod topology;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use common::*;
use futures::StreamExt;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::runtime::{WatchStreamExt, watcher};

const NS: &str = "default";
const INTENT_FINALIZER: &str = "csi-provisioner.rs/provisioning-intent";
const SELECTED_NODE: &str = "volume.kubernetes.io/selected-node";

/// Waits until `probe` accepts the claim `NS/name` and returns what it extracted.
async fn wait_claim<T>(
    cluster: &Cluster,
    name: &str,
    what: &str,
    probe: impl Fn(&PersistentVolumeClaim) -> Option<T>,
) -> T {
    let api = cluster.pvcs(NS);
    wait_for(&format!("claim {name}: {what}"), DEADLINE, || async {
        probe(&api.get_opt(name).await.ok()??)
    })
    .await
}

fn has_intent(pvc: &PersistentVolumeClaim) -> bool {
    pvc.metadata
        .finalizers
        .as_ref()
        .is_some_and(|f| f.iter().any(|x| x == INTENT_FINALIZER))
}

fn uid(pvc: &PersistentVolumeClaim) -> String {
    pvc.metadata.uid.clone().expect("claim uid")
}

/// Every version of one claim the API server reported, in order (a watch sees a state that a
/// poll could miss, e.g. an annotation removed and set again a moment later).
struct ClaimHistory {
    versions: Arc<Mutex<Vec<PersistentVolumeClaim>>>,
    task: tokio::task::JoinHandle<()>,
}

impl ClaimHistory {
    fn start(cluster: &Cluster, name: &str) -> Self {
        let api = cluster.pvcs(NS);
        let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
        let versions = Arc::new(Mutex::new(Vec::new()));
        let sink = versions.clone();
        let task = tokio::spawn(async move {
            let mut stream = watcher(api, config)
                .default_backoff()
                .applied_objects()
                .boxed();
            while let Some(event) = stream.next().await {
                if let Ok(pvc) = event {
                    sink.lock().unwrap().push(pvc);
                }
            }
        });
        Self { versions, task }
    }

    /// Waits until the versions seen so far satisfy `check`.
    async fn wait(&self, what: &str, check: impl Fn(&[PersistentVolumeClaim]) -> bool) {
        wait_for(what, DEADLINE, || async {
            check(&self.versions.lock().unwrap()).then_some(())
        })
        .await;
    }

    /// Waits until the selected node was set to `node` and later removed.
    async fn wait_selected_node_cleared(&self, node: &str) {
        self.wait(
            &format!("selected-node {node} to be set and then removed"),
            |versions| {
                let set = versions
                    .iter()
                    .position(|p| annotation(p, SELECTED_NODE) == Some(node));
                set.is_some_and(|i| {
                    versions[i..]
                        .iter()
                        .any(|p| annotation(p, SELECTED_NODE).is_none())
                })
            },
        )
        .await;
    }
}

impl Drop for ClaimHistory {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[tokio::test]
async fn immediate_claim_gets_a_pv_exactly_like_upstream_builds_it() {
    let (cluster, driver, _sidecar) = start_single_node(&[], &[]).await;
    let mut class = storage_class(
        "fast",
        &[("tier", "gold"), ("csi.storage.k8s.io/fstype", "xfs")],
    );
    class.mount_options = Some(vec!["noatime".into()]);
    cluster.add_class(&class).await;
    let before = cluster.sim().counters();
    let pvc = cluster.claim_of_class(NS, "data", "fast", "1Gi").await;
    let uid = pvc.metadata.uid.clone().unwrap();

    let pv = cluster.wait_bound(NS, "data").await;
    assert_eq!(
        pv.metadata.name.as_deref(),
        Some(format!("pvc-{uid}").as_str())
    );
    let ann = pv.metadata.annotations.clone().unwrap_or_default();
    assert_eq!(
        ann.get("pv.kubernetes.io/provisioned-by")
            .map(String::as_str),
        Some(DRIVER)
    );
    assert_eq!(
        ann.get("volume.kubernetes.io/provisioner-deletion-secret-name")
            .map(String::as_str),
        Some("")
    );
    let finalizers = pv.metadata.finalizers.clone().unwrap_or_default();
    assert!(
        finalizers.contains(&"external-provisioner.volume.kubernetes.io/finalizer".to_string())
    );
    let spec = pv.spec.clone().unwrap();
    let csi = spec.csi.clone().unwrap();
    assert_eq!(csi.driver, DRIVER);
    assert_eq!(csi.fs_type.as_deref(), Some("xfs"));
    assert!(
        csi.volume_attributes
            .unwrap_or_default()
            .contains_key("storage.kubernetes.io/csiProvisionerIdentity")
    );
    assert_eq!(
        spec.persistent_volume_reclaim_policy.as_deref(),
        Some("Delete")
    );
    assert_eq!(spec.storage_class_name.as_deref(), Some("fast"));
    assert_eq!(spec.mount_options, Some(vec!["noatime".to_string()]));
    assert_eq!(spec.capacity.unwrap()["storage"].0, "1Gi");
    assert_eq!(spec.claim_ref.unwrap().uid.as_deref(), Some(uid.as_str()));

    // The driver holds exactly one volume, named after the claim, with the class parameters minus
    // the reserved keys.
    let state = driver.wait_volumes(1).await;
    let volume = &state.volumes[0];
    assert_eq!(volume.name, format!("pvc-{uid}"));
    assert_eq!(volume.id, csi.volume_handle);
    assert_eq!(
        volume.parameters,
        BTreeMap::from([("tier".to_string(), "gold".to_string())])
    );

    // Upstream's events, and the intent finalizer is gone from the bound claim.
    cluster
        .wait_claim_event(
            NS,
            "data",
            "ProvisioningSucceeded",
            &format!("Successfully provisioned volume pvc-{uid}"),
        )
        .await;
    cluster
        .wait_claim_event(
            NS,
            "data",
            "Provisioning",
            "External provisioner is provisioning volume for claim \"default/data\"",
        )
        .await;
    let pvc = wait_claim(&cluster, "data", "intent removed", |pvc| {
        (!has_intent(pvc)).then(|| pvc.clone())
    })
    .await;
    let ours = pvc
        .metadata
        .annotations
        .unwrap_or_default()
        .into_keys()
        .filter(|k| k.starts_with("csi-provisioner.rs/"))
        .collect::<Vec<_>>();
    assert!(ours.is_empty(), "intent annotations left behind: {ours:?}");

    // API cost of one volume: the intent in the ledger (one Lease write, a second one later when
    // the entry is dropped lazily), the PV create and two events; the claim is never written
    // (the test's own claim create is the only claim write).
    let spent = cluster.sim().counters().since(&before);
    assert_eq!(
        spent.writes_to(Some("persistentvolumeclaims")),
        1,
        "{:#}",
        spent.to_json()
    );
    assert_eq!(
        spent.writes_to(Some("persistentvolumes")),
        1,
        "{:#}",
        spent.to_json()
    );
    assert!(
        spent.writes_to(Some("leases")) <= 2,
        "{:#}",
        spent.to_json()
    );
    assert!(spent.writes() <= 6, "{:#}", spent.to_json());
}

/// Under a tight rate limit a backlog's intents share Lease writes: what is recorded while a write
/// is in flight rides the next write, and removals ride the intent writes or one last flush.
/// (This test ran five workers and asserted one write for the whole backlog, which waiting
/// workers giving their slots back made possible; that parking is gone, issue 40.)
#[tokio::test]
async fn a_backlog_under_a_tight_rate_limit_shares_its_intent_writes() {
    const CLAIMS: usize = 40;
    let cluster = Cluster::start().await;
    let driver = Driver::start(cluster.dir.path(), "node-1", &[]).await;
    cluster.add_class(&storage_class("fast", &[])).await;
    for i in 0..CLAIMS {
        cluster
            .claim_of_class(NS, &format!("c{i}"), "fast", "1Gi")
            .await;
    }
    let before = cluster.sim().counters();
    let _sidecar = Sidecar::start(
        &cluster,
        &driver,
        &["--kube-api-qps=5", "--kube-api-burst=10"],
    )
    .await;
    for i in 0..CLAIMS {
        cluster.wait_bound(NS, &format!("c{i}")).await;
    }
    let spent = cluster.sim().counters().since(&before);
    // The backlog's intents in one or two writes, and the removals in one more.
    assert!(
        spent.writes_to(Some("leases")) <= 4,
        "{:#}",
        spent.to_json()
    );
    assert_eq!(
        spent.writes_to(Some("persistentvolumes")),
        CLAIMS as u64,
        "{:#}",
        spent.to_json()
    );
    let state = driver.wait_volumes(CLAIMS).await;
    assert_eq!(state.calls("CreateVolume"), CLAIMS as u64, "never twice");
}

#[tokio::test]
async fn pvc_deleted_first_deletes_the_volume_and_the_pv() {
    let (cluster, driver, _sidecar) = start_single_node(&[], &[]).await;
    cluster.claim_with_fast_class(NS, "data").await;
    let pv = cluster.wait_bound(NS, "data").await;
    driver.wait_volumes(1).await;

    cluster.delete_pvc_and_wait(NS, "data").await;
    cluster
        .wait_pv_gone(pv.metadata.name.as_deref().unwrap())
        .await;
    let state = driver.wait_volumes(0).await;
    assert_eq!(state.calls("DeleteVolume"), 1, "DeleteVolume exactly once");
}

/// A driver that refuses CreateVolume and DeleteVolume without `password=s3cr3t-value`, the
/// Secret `data-creds` holding it, and the class `secret` whose templates name that Secret.
async fn driver_requiring_a_secret(cluster: &Cluster) -> Driver {
    let driver = Driver::start(
        cluster.dir.path(),
        "node-1",
        &["--require-secret=password=s3cr3t-value"],
    )
    .await;
    let creds = secret(NS, "data-creds", "password", "s3cr3t-value");
    cluster.create(&cluster.secrets(NS), &creds).await;
    cluster.add_class(&templated_secret_class("secret")).await;
    driver
}

#[tokio::test]
async fn secrets_from_templates_reach_the_driver_and_are_recorded_for_deletion() {
    let cluster = Cluster::start().await;
    let driver = driver_requiring_a_secret(&cluster).await;
    let sidecar = Sidecar::start(&cluster, &driver, &[]).await;
    cluster.claim_of_class(NS, "data", "secret", "1Gi").await;
    let pv = cluster.wait_bound(NS, "data").await;
    let ann = pv.metadata.annotations.clone().unwrap_or_default();
    assert_eq!(
        ann["volume.kubernetes.io/provisioner-deletion-secret-name"],
        "data-creds"
    );
    assert_eq!(
        ann["volume.kubernetes.io/provisioner-deletion-secret-namespace"],
        NS
    );
    let state = driver.wait_volumes(1).await;
    assert_eq!(state.volumes[0].secret_keys, vec!["password".to_string()]);

    // Deletion sends the same secret (the driver refuses DeleteVolume without it).
    cluster.delete_pvc_and_wait(NS, "data").await;
    driver.wait_volumes(0).await;
    assert!(
        !sidecar.log().contains("s3cr3t-value"),
        "a secret value reached the sidecar's log"
    );
}

#[tokio::test]
async fn extra_create_metadata_passes_claim_and_pv_names_to_the_driver() {
    let (cluster, driver, _sidecar) = start_single_node(&[], &["--extra-create-metadata"]).await;
    cluster
        .add_class(&storage_class("fast", &[("tier", "gold")]))
        .await;
    let pvc = cluster.claim_of_class(NS, "data", "fast", "1Gi").await;
    let pv = cluster.wait_bound(NS, "data").await;
    let state = driver.wait_volumes(1).await;
    let pv_name = format!("pvc-{}", uid(&pvc));
    assert_eq!(pv.metadata.name.as_deref(), Some(pv_name.as_str()));
    let want = BTreeMap::from([
        ("tier".to_string(), "gold".to_string()),
        (
            "csi.storage.k8s.io/pvc/name".to_string(),
            "data".to_string(),
        ),
        (
            "csi.storage.k8s.io/pvc/namespace".to_string(),
            NS.to_string(),
        ),
        ("csi.storage.k8s.io/pv/name".to_string(), pv_name),
    ]);
    assert_eq!(state.volumes[0].parameters, want);
}

#[tokio::test]
async fn fs_type_defaults_deprecated_key_and_mount_options_reach_the_pv() {
    let (cluster, driver, _sidecar) = start_single_node(&[], &["--default-fstype=ext4"]).await;
    let mut plain = storage_class("plain", &[]);
    plain.mount_options = Some(vec!["noatime".into(), "nodiratime".into()]);
    cluster.add_class(&plain).await;
    // The deprecated `fsType` key is honoured and, as upstream, not stripped from the parameters.
    cluster
        .add_class(&storage_class("legacy", &[("fsType", "ext3")]))
        .await;
    cluster.claim_of_class(NS, "a", "plain", "1Gi").await;
    let b = cluster.claim_of_class(NS, "b", "legacy", "1Gi").await;

    let a_pv = cluster.wait_bound(NS, "a").await;
    let a_spec = a_pv.spec.unwrap();
    assert_eq!(a_spec.csi.unwrap().fs_type.as_deref(), Some("ext4"));
    assert_eq!(
        a_spec.mount_options,
        Some(vec!["noatime".to_string(), "nodiratime".to_string()])
    );
    let b_pv = cluster.wait_bound(NS, "b").await;
    let b_spec = b_pv.spec.unwrap();
    assert_eq!(b_spec.csi.unwrap().fs_type.as_deref(), Some("ext3"));
    assert_eq!(b_spec.mount_options, None);

    let state = driver.wait_volumes(2).await;
    let b_volume = state
        .volume_by_name(&format!("pvc-{}", uid(&b)))
        .expect("volume of b");
    assert_eq!(
        b_volume.parameters,
        BTreeMap::from([("fsType".to_string(), "ext3".to_string())])
    );
}

#[tokio::test]
async fn block_claim_gets_a_block_pv_without_fs_type() {
    let (cluster, driver, _sidecar) = start_single_node(&[], &[]).await;
    cluster
        .add_class(&storage_class(
            "fast",
            &[("csi.storage.k8s.io/fstype", "xfs")],
        ))
        .await;
    let mut raw = claim(NS, "raw", "fast", "2Gi");
    raw.spec.as_mut().unwrap().volume_mode = Some("Block".into());
    let raw = cluster.create(&cluster.pvcs(NS), &raw).await;

    let pv = cluster.wait_bound(NS, "raw").await;
    let spec = pv.spec.unwrap();
    assert_eq!(spec.volume_mode.as_deref(), Some("Block"));
    let csi = spec.csi.unwrap();
    assert_eq!(csi.fs_type, None, "a block PV carries no fsType");
    let state = driver.wait_volumes(1).await;
    let volume = &state.volumes[0];
    assert_eq!(volume.name, format!("pvc-{}", uid(&raw)));
    assert_eq!(volume.id, csi.volume_handle);
    assert_eq!(volume.capacity_bytes, 2 << 30);
}

#[tokio::test]
async fn a_restarted_sidecar_does_not_provision_bound_claims_again() {
    let (cluster, driver, mut sidecar) = start_single_node(&[], &[]).await;
    cluster.claim_with_fast_class(NS, "first").await;
    cluster.wait_bound(NS, "first").await;

    sidecar.restart().await;
    // A claim created after the restart is provisioned: the new process is at work.
    cluster.claim_of_class(NS, "second", "fast", "1Gi").await;
    cluster.wait_bound(NS, "second").await;
    let state = driver.wait_volumes(2).await;
    assert_eq!(
        state.calls("CreateVolume"),
        2,
        "the bound claim was provisioned again"
    );
}

// === API server outages ===

#[tokio::test]
async fn after_a_watch_outage_with_compacted_history_the_sidecar_relists_and_catches_up() {
    watch_outage_with_compacted_history(true).await;
}

/// The same against an API server without streaming lists: the re-read is a paged LIST.
#[tokio::test]
async fn after_a_watch_outage_without_streaming_lists_the_sidecar_lists_again_and_catches_up() {
    watch_outage_with_compacted_history(false).await;
}

async fn watch_outage_with_compacted_history(watch_list: bool) {
    let cluster = Cluster::start_with(kube_sim::SimConfig {
        watch_list,
        ..Default::default()
    })
    .await;
    let driver = Driver::start(cluster.dir.path(), "node-1", &[]).await;
    let _sidecar = Sidecar::start(&cluster, &driver, &[]).await;
    cluster.claim_with_fast_class(NS, "before").await;
    let before_pv = cluster.wait_bound(NS, "before").await;
    driver.wait_volumes(1).await;

    // The API server ends every watch and refuses new ones for a while...
    let faults = cluster.sim().faults();
    let refused = faults.add(kube_sim::FaultRule {
        verb: Some("watch".into()),
        status: Some(500),
        ..Default::default()
    });
    cluster.sim().drop_watches();
    wait_for(
        "the sidecar's re-watches to be refused",
        DEADLINE,
        || async { (faults.hits(refused) >= 3).then_some(()) },
    )
    .await;
    let claim_lists = || {
        cluster
            .sim()
            .counters()
            .count(Some("list"), Some("persistentvolumeclaims"), None)
    };
    let lists_before = claim_lists();
    // ...meanwhile one claim is created and another deleted, and the history of those changes is
    // compacted away: resuming the watches from where they stopped is answered 410 Gone.
    cluster.claim_of_class(NS, "during", "fast", "1Gi").await;
    cluster.delete_pvc_and_wait(NS, "before").await;
    cluster.sim().compact();
    faults.remove(refused);

    // The sidecar lists again and acts on both changes it never saw as watch events.
    cluster.wait_bound(NS, "during").await;
    cluster
        .wait_pv_gone(before_pv.metadata.name.as_deref().expect("PV name"))
        .await;
    let state = driver.wait_volumes(1).await;
    assert_eq!(
        state.calls("CreateVolume"),
        2,
        "each claim provisioned once"
    );
    assert_eq!(
        state.calls("DeleteVolume"),
        1,
        "the released volume deleted once"
    );
    // With streaming lists the re-read is a watch (answered 200 like a resumed one): the catch-up
    // above is the proof. Without them it is a LIST, counted here.
    if !watch_list {
        assert!(
            claim_lists() > lists_before,
            "the claims were listed again after the outage"
        );
    }
}

// === Drop-in RBAC ===

#[tokio::test]
async fn with_upstreams_cluster_role_claims_are_written_with_update_instead_of_patch() {
    let cluster = Cluster::start().await;
    // Upstream's ClusterRole grants get/list/watch/update on PVCs, not patch.
    let faults = cluster.sim().faults();
    // And no Role for Leases: the intents go on the claims.
    faults.add(
        kube_sim::FaultRule::error(403)
            .verb("list")
            .resource("leases"),
    );
    let no_patch = faults.add(
        kube_sim::FaultRule::error(403)
            .verb("patch")
            .resource("persistentvolumeclaims"),
    );
    let driver = Driver::start(cluster.dir.path(), "node-1", &[]).await;
    let sidecar = Sidecar::start(&cluster, &driver, &[]).await;
    let history = ClaimHistory::start(&cluster, "first");
    cluster.claim_with_fast_class(NS, "first").await;
    cluster.wait_bound(NS, "first").await;
    cluster.claim_of_class(NS, "second", "fast", "1Gi").await;
    cluster.wait_bound(NS, "second").await;

    // The intent was recorded before CreateVolume and removed after, by PUTs.
    history
        .wait("intent recorded, then removed", |versions| {
            versions.iter().any(has_intent) && versions.last().is_some_and(|p| !has_intent(p))
        })
        .await;
    wait_claim(&cluster, "second", "intent removed", |p| {
        (!has_intent(p)).then_some(())
    })
    .await;
    let counters = cluster.sim().counters();
    assert!(
        counters.get("update", "persistentvolumeclaims", 200) >= 4,
        "intent written and removed for both claims with update"
    );
    // One refused PATCH taught the sidecar; it said so once.
    assert_eq!(faults.hits(no_patch), 1);
    assert_eq!(
        sidecar.log_lines_with(&["refuses to PATCH persistentvolumeclaims"]),
        1
    );
    let state = driver.wait_volumes(2).await;
    assert_eq!(state.calls("CreateVolume"), 2);

    cluster.delete_pvc_and_wait(NS, "first").await;
    driver.wait_volumes(1).await;
}
