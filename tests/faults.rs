//! The fault suite: break things around the sidecar at random (reproducibly, from a seed printed
//! with every failure), then check at quiescence that nothing was lost (`mock_csi_driver::invariants`:
//! every volume has exactly one PV and every PV its volume, every bound claim its PV, the
//! deletion-protection finalizer on every Delete PV, nothing stuck Terminating, events bounded).
//!
//! CI runs a short round of each scenario. `FAULT_ROUNDS=N` runs N rounds, `FAULT_SEED=S` replays
//! one run.

mod common;

use std::time::Duration;

use common::*;
use k8s_openapi::api::core::v1::{Event, PersistentVolumeClaim};
use kube::api::{DeleteParams, ListParams};
use kube_sim::FaultRule;
use mock_csi_driver::FaultRule as DriverFault;
use mock_csi_driver::invariants::{self, World};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const NS: &str = "default";
/// Quiescence after a run of faults may take a few retry periods.
const SETTLE: Duration = Duration::from_secs(120);

/// The run's seed: `FAULT_SEED`, else a fresh one; printed so a failure can be replayed.
fn seed(scenario: &str) -> u64 {
    let seed = std::env::var("FAULT_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| rand::rng().random());
    println!("{scenario}: FAULT_SEED={seed}");
    seed
}

fn rounds(short: usize) -> usize {
    std::env::var("FAULT_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(short)
}

fn json_items<T: serde::Serialize>(items: Vec<T>) -> Vec<serde_json::Value> {
    items
        .into_iter()
        .map(|i| serde_json::to_value(i).expect("object as JSON"))
        .collect()
}

/// Waits until every claim that still exists is Bound and nothing is Terminating, then checks the
/// invariants; panics with the seed and every violation.
async fn settle_and_check(cluster: &Cluster, drivers: &[&Driver], seed: u64) {
    let settled = tokio::time::timeout(SETTLE, async {
        loop {
            let pvcs = cluster.pvcs(NS).list(&ListParams::default()).await;
            let pvs = cluster.pvs().list(&ListParams::default()).await;
            if let (Ok(pvcs), Ok(pvs)) = (pvcs, pvs) {
                let claims_done = pvcs.items.iter().all(|c| {
                    c.metadata.deletion_timestamp.is_none()
                        && c.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound")
                });
                let pvs_done = pvs.items.iter().all(|p| {
                    p.metadata.deletion_timestamp.is_none()
                        && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound")
                });
                let mut volumes = 0;
                for driver in drivers {
                    volumes += driver.state().await.volumes.len();
                }
                if claims_done && pvs_done && volumes == pvs.items.len() {
                    return;
                }
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await;
    let mut volumes = Vec::new();
    let mut concurrent = Vec::new();
    for driver in drivers {
        let state = driver.state().await;
        concurrent.extend(state.concurrent_creates);
        volumes.extend(state.volumes);
    }
    let pvs = json_items(
        cluster
            .pvs()
            .list(&ListParams::default())
            .await
            .unwrap()
            .items,
    );
    let pvcs = json_items(
        cluster
            .pvcs(NS)
            .list(&ListParams::default())
            .await
            .unwrap()
            .items,
    );
    let pods = json_items(
        cluster
            .pods(NS)
            .list(&ListParams::default())
            .await
            .unwrap()
            .items,
    );
    let events = json_items(
        kube::Api::<Event>::all(cluster.client.clone())
            .list(&ListParams::default())
            .await
            .unwrap()
            .items,
    );
    let violations = invariants::check(&World {
        driver: DRIVER,
        volumes: &volumes,
        pvs: &pvs,
        pvcs: &pvcs,
        pods: &pods,
        events: &events,
        max_events_per_object: 20,
        concurrent_creates: &concurrent,
    });
    let report: Vec<String> = violations.iter().map(ToString::to_string).collect();
    assert!(
        settled.is_ok() && report.is_empty(),
        "FAULT_SEED={seed}: {} after {:?}; violations: {report:#?}",
        if settled.is_ok() {
            "settled"
        } else {
            "did not settle"
        },
        SETTLE
    );
}

async fn delete_claim(cluster: &Cluster, name: &str) {
    // The test's own requests meet the injected API faults too: retry them until they land.
    for _ in 0..50 {
        match cluster
            .pvcs(NS)
            .delete(name, &DeleteParams::default())
            .await
        {
            Err(kube::Error::Api(s)) if s.code >= 500 || s.code == 429 || s.code == 409 => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            _ => return,
        }
    }
}

async fn create_claim(cluster: &Cluster, name: &str) {
    let claim = claim(NS, name, "fast", "1Gi");
    for _ in 0..50 {
        match cluster.pvcs(NS).create(&Default::default(), &claim).await {
            Err(kube::Error::Api(s)) if s.code >= 500 || s.code == 429 => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) if !matches!(&e, kube::Error::Api(s) if s.code == 409) => {
                panic!("creating claim {name}: {e}")
            }
            _ => return,
        }
    }
}

/// Random claim traffic for one round: new claims, deleted bound claims, and PVs deleted before
/// their claims (KEP-2644).
async fn traffic(cluster: &Cluster, rng: &mut StdRng, round: usize) {
    for i in 0..rng.random_range(3..8) {
        create_claim(cluster, &format!("r{round}-{i}")).await;
    }
    let claims: Vec<PersistentVolumeClaim> = cluster
        .pvcs(NS)
        .list(&ListParams::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default();
    for claim in claims {
        let name = claim.metadata.name.clone().unwrap_or_default();
        match rng.random_range(0..10) {
            // The claim goes, whatever stage it is at.
            0..=1 => delete_claim(cluster, &name).await,
            // The PV goes first, then its claim.
            2 => {
                if let Some(pv) = claim.spec.and_then(|s| s.volume_name) {
                    for _ in 0..50 {
                        match cluster.pvs().delete(&pv, &DeleteParams::default()).await {
                            Err(kube::Error::Api(s)) if s.code >= 500 || s.code == 429 => {
                                tokio::time::sleep(Duration::from_millis(100)).await;
                            }
                            _ => break,
                        }
                    }
                }
                delete_claim(cluster, &name).await;
            }
            _ => {}
        }
    }
}

#[tokio::test]
async fn sidecar_killed_at_random_moments_loses_nothing() {
    let seed = seed("sidecar kills");
    let mut rng = StdRng::seed_from_u64(seed);
    let cluster = Cluster::start().await;
    // Slow calls widen the windows a kill can land in.
    let driver = Driver::start(
        cluster.dir.path(),
        "node-1",
        &[
            "--latency=CreateVolume=150ms",
            "--latency=DeleteVolume=100ms",
        ],
    )
    .await;
    cluster.add_class(&storage_class("fast", &[])).await;
    let mut sidecar = Sidecar::start(&cluster, &driver, &[]).await;
    for round in 0..rounds(3) {
        traffic(&cluster, &mut rng, round).await;
        tokio::time::sleep(Duration::from_millis(rng.random_range(0..800))).await;
        sidecar.kill().await;
        // Work that arrives while no sidecar runs.
        if rng.random_bool(0.5) {
            delete_claim(&cluster, &format!("r{round}-0")).await;
        }
        sidecar.restart().await;
    }
    settle_and_check(&cluster, &[&driver], seed).await;
}

#[tokio::test]
async fn driver_crashes_timeouts_and_errors_lose_nothing() {
    let seed = seed("driver faults");
    let mut rng = StdRng::seed_from_u64(seed);
    let cluster = Cluster::start().await;
    let mut driver = Driver::start(cluster.dir.path(), "node-1", &[]).await;
    cluster.add_class(&storage_class("fast", &[])).await;
    let _sidecar = Sidecar::start(&cluster, &driver, &["--timeout=1s"]).await;
    for round in 0..rounds(3) {
        // Set through the control socket, so a restarted driver comes back without them.
        let control = driver.control().await;
        control
            .set_fault(
                "CreateVolume",
                DriverFault::rate(tonic::Code::Unavailable, 0.2),
            )
            .await
            .unwrap();
        control
            .set_fault("DeleteVolume", DriverFault::rate(tonic::Code::Aborted, 0.1))
            .await
            .unwrap();
        if rng.random_bool(0.5) {
            // Slower than the sidecar's --timeout: it times out while the volume is made.
            control
                .set_latency("CreateVolume", Duration::from_millis(1500))
                .await
                .unwrap();
        }
        traffic(&cluster, &mut rng, round).await;
        tokio::time::sleep(Duration::from_millis(rng.random_range(200..1000))).await;
        // The driver dies after persisting its next volume and before answering (or is killed if
        // no volume comes), then comes back from its state file.
        control.set_crash_after_create(Some(1)).await.unwrap();
        tokio::time::sleep(Duration::from_millis(rng.random_range(200..1000))).await;
        driver.restart().await;
    }
    settle_and_check(&cluster, &[&driver], seed).await;
}

#[tokio::test]
async fn api_server_errors_conflicts_and_lost_watches_lose_nothing() {
    let seed = seed("API faults");
    let mut rng = StdRng::seed_from_u64(seed);
    let cluster = Cluster::start().await;
    let driver = Driver::start(cluster.dir.path(), "node-1", &[]).await;
    cluster.add_class(&storage_class("fast", &[])).await;
    let _sidecar = Sidecar::start(&cluster, &driver, &[]).await;
    let faults = cluster.sim.faults();
    for round in 0..rounds(3) {
        let mut ids = vec![
            faults.add(FaultRule::error(503).retry_after(1).rate(0.2)),
            faults.add(FaultRule::error(500).rate(0.05)),
            faults.add(
                FaultRule::error(409)
                    .verb("patch")
                    .resource("persistentvolumes")
                    .rate(0.3),
            ),
            faults.add(
                FaultRule::error(409)
                    .verb("patch")
                    .resource("persistentvolumeclaims")
                    .rate(0.3),
            ),
        ];
        if rng.random_bool(0.3) {
            ids.push(faults.add(FaultRule::error(429).retry_after(1).rate(0.3)));
        }
        traffic(&cluster, &mut rng, round).await;
        tokio::time::sleep(Duration::from_millis(rng.random_range(200..1000))).await;
        // Watches end; sometimes their history is gone too (the sidecar must relist on 410).
        if rng.random_bool(0.5) {
            cluster.sim.compact();
        }
        cluster.sim.drop_watches();
        tokio::time::sleep(Duration::from_millis(rng.random_range(200..1000))).await;
        for id in ids {
            faults.remove(id);
        }
    }
    settle_and_check(&cluster, &[&driver], seed).await;
}
