//! The provisioning shell against the API simulator and a fake CSI controller: the resolver
//! executes the clean-up decision (`intents::cleanup`) of a claim record and nothing else.

use std::sync::Mutex as StdMutex;

use kube::api::{DeleteParams, PostParams};
use kube::runtime::reflector::store::Writer;
use kube_sim::{Sim, SimConfig};

use super::*;
use crate::csi::{CsiController, CsiFuture, DriverInfo, v1};
use crate::k8s::events::{EventSource, Recorder};
use crate::metrics::Metrics;
use crate::metrics::node_gone::NodeGoneMetrics;
use crate::names;
use crate::provision::controller::intents::claim_record::ClaimRecords;
use crate::provision::controller::intents::{IntentLog, Pending};
use crate::runtime::{Stores, VolumeLocks};

/// Records every call; CreateVolume answers with `created_id`.
struct FakeCsi {
    calls: StdMutex<Vec<String>>,
    created_with: StdMutex<Vec<v1::CreateVolumeRequest>>,
    created_id: String,
}

impl CsiController for FakeCsi {
    fn create_volume(
        &self,
        request: v1::CreateVolumeRequest,
        _migrated: bool,
    ) -> CsiFuture<'_, v1::CreateVolumeResponse> {
        crate::sync::lock(&self.calls).push(format!("CreateVolume {}", request.name));
        crate::sync::lock(&self.created_with).push(request);
        let volume = v1::Volume {
            volume_id: self.created_id.clone(),
            ..v1::Volume::default()
        };
        Box::pin(async move {
            Ok(v1::CreateVolumeResponse {
                volume: Some(volume),
            })
        })
    }
    fn delete_volume(
        &self,
        request: v1::DeleteVolumeRequest,
        _migrated: bool,
    ) -> CsiFuture<'_, v1::DeleteVolumeResponse> {
        crate::sync::lock(&self.calls).push(format!("DeleteVolume {}", request.volume_id));
        Box::pin(async { Ok(v1::DeleteVolumeResponse {}) })
    }
    fn get_capacity(&self, _: v1::GetCapacityRequest) -> CsiFuture<'_, v1::GetCapacityResponse> {
        Box::pin(async { Err(tonic::Status::unimplemented("not in this test")) })
    }
    fn list_volumes(&self, _: v1::ListVolumesRequest) -> CsiFuture<'_, v1::ListVolumesResponse> {
        Box::pin(async { Err(tonic::Status::unimplemented("not in this test")) })
    }
    fn controller_get_capabilities(&self) -> CsiFuture<'_, v1::ControllerGetCapabilitiesResponse> {
        Box::pin(async { Err(tonic::Status::unimplemented("not in this test")) })
    }
}

/// A driver whose CreateVolume answers `created_id`.
fn fake_csi(created_id: &str) -> Arc<FakeCsi> {
    Arc::new(FakeCsi {
        calls: StdMutex::default(),
        created_with: StdMutex::default(),
        created_id: created_id.to_owned(),
    })
}

const DRIVER: &str = crate::testing::DRIVER;

/// The shell with `claims` in its claim cache, and their class `standard` (reclaim Delete).
fn shell_with(sim: &Sim, csi: Arc<FakeCsi>, claims: Vec<PersistentVolumeClaim>) -> Provisioner {
    shell_with_classes(
        sim,
        csi,
        claims,
        vec![crate::testing::sc("standard").build()],
    )
}

/// The shell with `claims` and `classes` in its caches.
fn shell_with_classes(
    sim: &Sim,
    csi: Arc<FakeCsi>,
    claims: Vec<PersistentVolumeClaim>,
    classes: Vec<StorageClass>,
) -> Provisioner {
    let mut class_store = Writer::default();
    for class in classes {
        class_store.apply_watcher_event(&kube::runtime::watcher::Event::Apply(class));
    }
    let args = crate::cli::Args::try_parse_go_style(["csi-provisioner"]).unwrap();
    let config = crate::config::Config::from_args(args, |_| None).unwrap();
    let mut metrics = Metrics::new();
    let node_metrics = NodeGoneMetrics::register(metrics.registry_mut());
    let client = sim.client();
    // The claim-record store's mirror as the watch leaves it once it delivered `claims`.
    let records = Arc::new(ClaimRecords::new(client.clone(), DRIVER));
    for claim in &claims {
        records.observe(claim);
    }
    let ctx = Arc::new(Context {
        config: Arc::new(config),
        client: client.clone(),
        csi,
        driver: Arc::new(DriverInfo {
            name: DRIVER.to_owned(),
            plugin: crate::csi::probe::PluginCapabilities {
                controller_service: true,
                ..Default::default()
            },
            controller: crate::csi::probe::ControllerCapabilities {
                create_delete_volume: true,
                ..Default::default()
            },
            ..DriverInfo::default()
        }),
        identity: "identity".to_owned(),
        volume_attributes_class: false,
        events: Recorder::new(client, EventSource::provisioner_lib(DRIVER, "host", "id")),
        metrics: Arc::new(metrics),
        node_metrics,
        stores: Stores {
            pvcs: crate::k8s::cache::Cache::of(claims.into_iter().map(Lean::new)),
            pvs: crate::k8s::cache::Cache::of([]),
            classes: class_store.as_reader(),
            nodes: None,
            csinodes: None,
            attachments: None,
        },
        volume_locks: VolumeLocks::default(),
        leadership: crate::runtime::Leadership::always(),
    });
    Provisioner {
        memory: Mutex::new(ClaimMemory::new(
            Backoff::new(Duration::from_secs(1), Duration::from_secs(60)),
            InfeasibleHold::new(crate::retry::INFEASIBLE_HOLD_BACK),
            Some(Competition::new(
                Duration::from_secs(1),
                Duration::from_secs(8),
            )),
        )),
        topology: super::topology_of(&ctx, &settings_of(&ctx)),
        intents: IntentLog::new(None, records),
        settings: settings_of(&ctx),
        ctx,
    }
}

/// A claim of our driver carrying the intent for volume `pvc-1` (and `volume_id` when recorded),
/// then deleted: the API server keeps it, Terminating, until the intent goes.
async fn deleted_claim_with_intent(sim: &Sim, volume_id: Option<&str>) -> PersistentVolumeClaim {
    let mut claim = crate::testing::pvc("default", "data")
        .provisioner(DRIVER)
        .class("standard")
        .finalizer(names::FINALIZER_PROVISIONING_INTENT)
        .build();
    let request = v1::CreateVolumeRequest {
        name: "pvc-1".to_owned(),
        ..Default::default()
    };
    let mut entry = intents::ledger::Entry::new(&claim, &request, None, false);
    entry.id = volume_id.map(str::to_owned);
    let annotations = claim.metadata.annotations.get_or_insert_default();
    for (key, value) in intents::claim_record::intent_annotations(&entry) {
        annotations.extend(value.map(|v| (key.to_owned(), v)));
    }
    created_and_deleted(sim, claim).await
}

/// Creates `claim` (held by its intent finalizer) and deletes it: a claim deleted mid-flight, as
/// the resolver finds it.
async fn created_and_deleted(sim: &Sim, mut claim: PersistentVolumeClaim) -> PersistentVolumeClaim {
    claim.metadata.uid = None;
    claim.metadata.resource_version = None;
    claim.status = None;
    let api: Api<PersistentVolumeClaim> = Api::namespaced(sim.client(), "default");
    api.create(&PostParams::default(), &claim).await.unwrap();
    api.delete("data", &DeleteParams::default()).await.unwrap();
    api.get("data").await.unwrap()
}

/// Resolves the record of `claim` (deleted) and checks that its volume was kept and reported: no
/// call reaches the driver, the record goes, and the kept-volumes counter reads 1.
async fn assert_kept_and_reported(sim: &Sim, claim: PersistentVolumeClaim, case: &str) {
    let csi = fake_csi("vol-7");
    let state = shell_with(sim, csi.clone(), vec![claim]);
    let pending = observed(&state);
    assert!(
        intents::resolve::resolve_one(&state, &pending, &mut Default::default())
            .await
            .is_ok()
    );
    let calls = crate::sync::lock(&csi.calls).clone();
    assert!(
        calls.is_empty(),
        "no call reaches the driver ({case}): {calls:?}"
    );
    assert!(
        claim_gone(sim).await,
        "the record goes, the volume stays ({case})"
    );
    assert_eq!(
        state.ctx.metrics.operator.intent_volumes_kept.get(),
        1,
        "{case}"
    );
}

/// The claim record of the claim the shell was given, as the store's mirror has it.
fn observed(state: &Provisioner) -> Pending {
    let mut pending = state.intents.pending();
    assert_eq!(pending.len(), 1, "one record");
    pending.remove(0)
}

async fn claim_gone(sim: &Sim) -> bool {
    let api: Api<PersistentVolumeClaim> = Api::namespaced(sim.client(), "default");
    api.get_opt("data").await.unwrap().is_none()
}

#[tokio::test]
async fn a_recorded_volume_id_is_deleted_without_a_replay_and_the_claim_is_released() {
    let sim = Sim::start(SimConfig::bare()).await.unwrap();
    let csi = fake_csi("unused");
    let claim = deleted_claim_with_intent(&sim, Some("vol-1")).await;
    let state = shell_with(&sim, csi.clone(), vec![claim.clone()]);
    let pending = observed(&state);
    assert!(
        intents::resolve::resolve_one(&state, &pending, &mut Default::default())
            .await
            .is_ok()
    );
    assert_eq!(*crate::sync::lock(&csi.calls), ["DeleteVolume vol-1"]);
    assert!(claim_gone(&sim).await, "the intent finalizer is removed");
}

#[tokio::test]
async fn without_an_id_the_create_is_replayed_then_the_answered_volume_deleted() {
    let sim = Sim::start(SimConfig::bare()).await.unwrap();
    let csi = fake_csi("vol-9");
    let claim = deleted_claim_with_intent(&sim, None).await;
    let state = shell_with(&sim, csi.clone(), vec![claim.clone()]);
    let pending = observed(&state);
    assert!(
        intents::resolve::resolve_one(&state, &pending, &mut Default::default())
            .await
            .is_ok()
    );
    assert_eq!(
        *crate::sync::lock(&csi.calls),
        ["CreateVolume pvc-1", "DeleteVolume vol-9"]
    );
    assert!(claim_gone(&sim).await);
}

/// A record of a build that kept neither requests nor policies (volume name and finalizer only):
/// nothing tells what was asked for or whether the user keeps such volumes, so the volume of the
/// deleted claim is kept and reported, whatever its class says, never replayed or deleted.
#[tokio::test]
async fn a_record_without_its_request_keeps_the_volume_and_reports_it() {
    for volume_id in [None, Some("vol-1")] {
        let sim = Sim::start(SimConfig::bare()).await.unwrap();
        let mut claim = crate::testing::pvc("default", "data")
            .provisioner(DRIVER)
            .class("standard")
            .annotation(names::ANN_INTENT_VOLUME_NAME, "pvc-1")
            .finalizer(names::FINALIZER_PROVISIONING_INTENT);
        if let Some(id) = volume_id {
            claim = claim.annotation(names::ANN_INTENT_VOLUME_ID, id);
        }
        let claim = created_and_deleted(&sim, claim.build()).await;
        assert_kept_and_reported(&sim, claim, &format!("volume id {volume_id:?}")).await;
    }
}

/// A record (of a Delete class) whose request does not decode and which names no volume id: the
/// volume cannot be found to delete, so it is kept and reported, never dropped unseen.
#[tokio::test]
async fn a_record_whose_request_cannot_be_read_keeps_the_volume_and_reports_it() {
    let sim = Sim::start(SimConfig::bare()).await.unwrap();
    let claim = crate::testing::pvc("default", "data")
        .provisioner(DRIVER)
        .class("standard")
        .annotation(names::ANN_INTENT_VOLUME_NAME, "pvc-1")
        // Base64 of three zero bytes: no CreateVolumeRequest.
        .annotation(names::ANN_INTENT_REQUEST, "AAAA")
        .finalizer(names::FINALIZER_PROVISIONING_INTENT)
        .build();
    let entry = intents::claim_record::entry_of(&claim).unwrap();
    assert!(!entry.retain, "the record reads as a Delete class's");
    let claim = created_and_deleted(&sim, claim).await;
    assert_kept_and_reported(&sim, claim, "an undecodable request").await;
}

#[tokio::test]
async fn a_volume_whose_pv_exists_is_kept_and_only_the_intent_dropped() {
    let sim = Sim::start(SimConfig::bare()).await.unwrap();
    let csi = fake_csi("unused");
    let claim = deleted_claim_with_intent(&sim, None).await;
    let state = shell_with(&sim, csi.clone(), vec![claim.clone()]);
    let pvs: Api<PersistentVolume> = Api::all(sim.client());
    let mut pv = crate::testing::pv("pvc-1").build();
    pv.metadata.uid = None;
    pv.metadata.resource_version = None;
    pv.status = None;
    pvs.create(&PostParams::default(), &pv).await.unwrap();
    let pending = observed(&state);
    assert!(
        intents::resolve::resolve_one(&state, &pending, &mut Default::default())
            .await
            .is_ok()
    );
    assert!(
        crate::sync::lock(&csi.calls).is_empty(),
        "no call reaches the driver"
    );
    assert!(claim_gone(&sim).await);
}
