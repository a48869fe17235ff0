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
use k8s_openapi::api::core::v1::{Event, PersistentVolume, PersistentVolumeClaim};
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
    let mut delete_calls = Vec::new();
    for driver in drivers {
        let state = driver.state().await;
        concurrent.extend(state.concurrent_creates);
        delete_calls.extend(state.delete_calls);
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
    let (volume_claims, claim_removals) = cluster.sim().claim_history();
    let violations = invariants::check(&World {
        driver: DRIVER,
        volumes: &volumes,
        pvs: &pvs,
        pvcs: &pvcs,
        pods: &pods,
        events: &events,
        max_events_per_object: 20,
        concurrent_creates: &concurrent,
        delete_calls: &delete_calls,
        volume_claims: &volume_claims,
        claim_removals: &claim_removals,
        volume_policies: &cluster.sim().volume_policies(),
        reported_kept: &Default::default(),
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
    let faults = cluster.sim().faults();
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
        if rng.random_bool(0.3) {
            // Slow responses: a quarter of requests take half a second.
            ids.push(faults.add(FaultRule::latency(Duration::from_millis(500)).rate(0.25)));
        }
        traffic(&cluster, &mut rng, round).await;
        tokio::time::sleep(Duration::from_millis(rng.random_range(200..1000))).await;
        // Watches end; sometimes their history is gone too (the sidecar must relist on 410).
        if rng.random_bool(0.5) {
            cluster.sim().compact();
        }
        cluster.sim().drop_watches();
        tokio::time::sleep(Duration::from_millis(rng.random_range(200..1000))).await;
        if rng.random_bool(0.3) {
            // The API server stops answering for a while (FAULT_PAUSE_SECS, 30 in the long
            // form), then comes back: the sidecar recovers without a restart.
            let pause: u64 = std::env::var("FAULT_PAUSE_SECS")
                .ok()
                .and_then(|s| s.parse().ok())
                .unwrap_or(3);
            cluster.sim().pause();
            tokio::time::sleep(Duration::from_secs(pause)).await;
            cluster.sim().resume();
        }
        for id in ids {
            faults.remove(id);
        }
    }
    settle_and_check(&cluster, &[&driver], seed).await;
}

/// Leader-election flags with short timings, so take-overs happen within a round.
const ELECTION: [&str; 5] = [
    "--leader-election",
    "--leader-election-namespace=default",
    "--leader-election-lease-duration=3s",
    "--leader-election-renew-deadline=2s",
    "--leader-election-retry-period=300ms",
];

#[tokio::test]
async fn leaders_killed_or_unable_to_renew_mid_operation_do_nothing_twice() {
    let seed = seed("leader faults");
    let mut rng = StdRng::seed_from_u64(seed);
    let cluster = Cluster::start().await;
    // One backend behind both replicas, as in a real Deployment; slow calls keep work in flight.
    let driver = Driver::start(
        cluster.dir.path(),
        "node-1",
        &[
            "--latency=CreateVolume=200ms",
            "--latency=DeleteVolume=100ms",
        ],
    )
    .await;
    cluster.add_class(&storage_class("fast", &[])).await;
    let mut replicas = Vec::new();
    for id in ["replica-a", "replica-b"] {
        replicas.push(
            Sidecar::start_named(
                &cluster,
                &driver,
                &format!("sidecar-{id}"),
                &ELECTION,
                &[("HOSTNAME", id)],
            )
            .await,
        );
    }
    let faults = cluster.sim().faults();
    for round in 0..rounds(3) {
        traffic(&cluster, &mut rng, round).await;
        tokio::time::sleep(Duration::from_millis(rng.random_range(100..600))).await;
        if rng.random_bool(0.5) {
            // Whoever leads (or both, if one is mid-take-over) dies mid-operation.
            let victim = rng.random_range(0..replicas.len());
            replicas[victim].kill().await;
            tokio::time::sleep(Duration::from_millis(rng.random_range(0..2000))).await;
            replicas[victim].restart().await;
        } else {
            // Renewals fail for longer than the renew deadline: the leader must stop acting
            // before the standby, by its own clock, may start.
            let id = faults.add(FaultRule::error(500).verb("update").resource("leases"));
            tokio::time::sleep(Duration::from_millis(rng.random_range(500..3500))).await;
            faults.remove(id);
        }
        // A replica that lost its lease exits by design (as upstream's does) and its pod is
        // restarted by the kubelet: do the same, or a round where both lose it leaves nobody.
        for replica in &mut replicas {
            if !replica.is_running() {
                replica.restart().await;
            }
        }
    }
    settle_and_check(&cluster, &[&driver], seed).await;
}

/// Registers `node` and starts its driver (state file kept across restarts) and node-mode sidecar.
async fn node_member(cluster: &Cluster, node: &str) -> (Driver, Sidecar) {
    cluster.add_node(node).await;
    let driver = Driver::start(cluster.dir.path(), node, &["--topology"]).await;
    let sidecar = Sidecar::start_named(
        cluster,
        &driver,
        &format!("sidecar-{node}"),
        &[
            "--node-deployment",
            "--feature-gates=Topology=true",
            "--node-deployment-base-delay=100ms",
            "--node-deployment-max-delay=1s",
            "--deleted-node-grace-period=60s",
        ],
        &[("NODE_NAME", node)],
    )
    .await;
    (driver, sidecar)
}

#[tokio::test]
async fn node_mode_nodes_removed_and_readded_under_the_same_name_lose_nothing() {
    let seed = seed("node churn");
    let mut rng = StdRng::seed_from_u64(seed);
    let cluster = Cluster::start().await;
    cluster.add_class(&delayed_class("local")).await;
    let nodes = ["node-a", "node-b", "node-c"];
    let mut members = Vec::new();
    for node in nodes {
        members.push(node_member(&cluster, node).await);
    }
    let mut live: Vec<String> = Vec::new();
    for round in 0..rounds(3) {
        // New claims, each used by a pod on a random node.
        for i in 0..rng.random_range(2..5) {
            let name = format!("r{round}-{i}");
            let node = nodes[rng.random_range(0..nodes.len())];
            cluster.claim_of_class(NS, &name, "local", "1Gi").await;
            cluster
                .schedule(NS, &format!("pod-{name}"), &name, node)
                .await;
            live.push(name);
        }
        // Some go again, pod first (a claim in use is protected).
        let mut kept = Vec::new();
        for name in live.drain(..) {
            if rng.random_bool(0.3) {
                let _ = cluster
                    .pods(NS)
                    .delete(&format!("pod-{name}"), &DeleteParams::default())
                    .await;
                delete_claim(&cluster, &name).await;
            } else {
                kept.push(name);
            }
        }
        live = kept;
        tokio::time::sleep(Duration::from_millis(rng.random_range(0..500))).await;
        // A node leaves (sidecar and driver down, Node and CSINode deleted) while claims are in
        // flight, and comes back under the same name: a new Node UID, the same disks.
        let i = rng.random_range(0..members.len());
        let node = nodes[i];
        members[i].1.kill().await;
        members[i].0.kill().await;
        cluster.delete_node(node).await;
        tokio::time::sleep(Duration::from_millis(rng.random_range(200..1500))).await;
        cluster.add_node(node).await;
        members[i].0.restart().await;
        members[i].1.restart().await;
    }
    let drivers: Vec<&Driver> = members.iter().map(|(d, _)| d).collect();
    settle_and_check(&cluster, &drivers, seed).await;
}

/// RSS of a running process in KiB (`VmRSS`).
fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
        })
        .unwrap_or(0)
}

#[tokio::test]
async fn soak_waves_of_claims_with_a_failing_driver_and_api_server_end_exact() {
    let seed = seed("soak");
    let mut rng = StdRng::seed_from_u64(seed);
    // Long form: FAULT_SOAK_CLAIMS=5000 (in waves of a tenth).
    let total: usize = std::env::var("FAULT_SOAK_CLAIMS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(120);
    let wave = (total / 10).max(40);
    let cluster = Cluster::start().await;
    // Room for every claim the long form keeps (half of 5,000, 1 GiB each).
    let driver = Driver::start(cluster.dir.path(), "node-1", &["--capacity-total=100Ti"]).await;
    cluster.add_class(&storage_class("fast", &[])).await;
    let sidecar = Sidecar::start(&cluster, &driver, &[]).await;
    sidecar.wait_started().await;
    let control = driver.control().await;
    for method in ["CreateVolume", "DeleteVolume"] {
        control
            .set_fault(method, DriverFault::rate(tonic::Code::Unavailable, 0.1))
            .await
            .unwrap();
    }
    let faults = cluster.sim().faults();
    let api_fault = faults.add(FaultRule::error(503).retry_after(1).rate(0.05));
    let mut rss = Vec::new();
    let mut made = 0;
    let mut n = 0;
    let mut survivors: Vec<String> = Vec::new();
    while made < total {
        let size = wave.min(total - made);
        let names: Vec<String> = (0..size).map(|i| format!("soak-{n}-{i}")).collect();
        for name in &names {
            create_claim(&cluster, name).await;
        }
        made += size;
        // Half of this wave goes again at once, some before they are even bound; the rest of the
        // previous wave goes now, so the number of objects stays level and RSS must too.
        let (gone, kept): (Vec<String>, Vec<String>) =
            names.into_iter().partition(|_| rng.random_bool(0.5));
        for name in gone.iter().chain(&survivors) {
            delete_claim(&cluster, name).await;
        }
        survivors = kept;
        let deadline = tokio::time::Instant::now() + SETTLE;
        loop {
            let claims = cluster.pvcs(NS).list(&ListParams::default()).await;
            let pvs = cluster.pvs().list(&ListParams::default()).await;
            let volumes = driver.state().await.volumes;
            if let (Ok(claims), Ok(pvs)) = (claims, pvs) {
                let pending: Vec<String> = claims
                    .items
                    .iter()
                    .filter(|c| {
                        c.metadata.deletion_timestamp.is_some()
                            || c.status.as_ref().and_then(|s| s.phase.as_deref()) != Some("Bound")
                    })
                    .map(|c| {
                        format!(
                            "{} (phase {:?}, deleting {}, finalizers {:?})",
                            c.metadata.name.as_deref().unwrap_or_default(),
                            c.status.as_ref().and_then(|s| s.phase.as_deref()),
                            c.metadata.deletion_timestamp.is_some(),
                            c.metadata.finalizers
                        )
                    })
                    .collect();
                let n = claims.items.len();
                if pending.is_empty() && pvs.items.len() == n && volumes.len() == n {
                    break;
                }
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "FAULT_SEED={seed}: wave {n} did not settle within {SETTLE:?}: {} claims, {} PVs, {} volumes; not settled: {pending:#?}",
                    claims.items.len(),
                    pvs.items.len(),
                    volumes.len()
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        rss.push(rss_kib(sidecar.pid().expect("sidecar running")));
        n += 1;
    }
    faults.remove(api_fault);
    control.clear_faults().await.unwrap();
    println!("soak: {total} claims in {n} waves, sidecar RSS per wave (KiB): {rss:?}");
    // Flat: the second wave is the first with the same number of objects (the first holds only
    // half as many); the last holds no more than it plus room for allocator noise.
    let (base, last) = (
        rss[1.min(rss.len() - 1)],
        *rss.last().expect("one wave at least"),
    );
    assert!(
        last <= base + base / 4 + 4 * 1024,
        "FAULT_SEED={seed}: RSS grew across waves: {rss:?} KiB"
    );
    settle_and_check(&cluster, &[&driver], seed).await;
}

/// A claim of our driver named `name` in class `class` (None: no class at all).
fn odd_claim(
    name: &str,
    class: Option<&str>,
    annotations: &[(&str, String)],
) -> PersistentVolumeClaim {
    let mut c = claim(NS, name, class.unwrap_or(""), "1Gi");
    if class.is_none() {
        c.spec.as_mut().unwrap().storage_class_name = None;
    }
    let mut all = std::collections::BTreeMap::from([(
        "volume.kubernetes.io/storage-provisioner".to_owned(),
        DRIVER.to_owned(),
    )]);
    all.extend(
        annotations
            .iter()
            .map(|(k, v)| ((*k).to_owned(), v.clone())),
    );
    c.metadata.annotations = Some(all);
    c
}

#[tokio::test]
async fn hostile_objects_and_driver_answers_get_a_clear_event_and_leak_nothing() {
    use mock_csi_driver::Misbehaviour;
    let seed = seed("hostile input");
    let cluster = Cluster::start().await;
    let driver = Driver::start(cluster.dir.path(), "node-1", &[]).await;
    let secret_value = "TOPSECRET-value-4711";
    cluster
        .create(
            &cluster.secrets(NS),
            &secret(NS, "creds", "password", secret_value),
        )
        .await;
    cluster
        .add_class(&storage_class(
            "fast",
            &[
                ("csi.storage.k8s.io/provisioner-secret-name", "creds"),
                (
                    "csi.storage.k8s.io/provisioner-secret-namespace",
                    "${pvc.namespace}",
                ),
            ],
        ))
        .await;
    let sidecar = Sidecar::start(&cluster, &driver, &[]).await;
    let control = driver.control().await;

    // Objects the API allows but nobody expects.
    let long_name = format!("c{}", "x".repeat(252));
    let odd = [
        odd_claim("no-class", None, &[]),
        odd_claim(
            "huge-annotation",
            Some("fast"),
            &[("example.com/blob", "y".repeat(200_000))],
        ),
        odd_claim(
            "unicode",
            Some("fast"),
            &[("example.com/note", "数据卷 ✓ \u{202e}reversed".into())],
        ),
        odd_claim(&long_name, Some("fast"), &[]),
    ];
    for c in &odd {
        cluster.create(&cluster.pvcs(NS), c).await;
    }
    // A PV of our driver without a claim reference (an admin's, waiting to be claimed by hand;
    // its class exists nowhere, so nothing binds it): it is left exactly as it is.
    let unclaimed: PersistentVolume = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": "unclaimed"},
        "spec": {
            "capacity": {"storage": "1Gi"},
            "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Delete",
            "storageClassName": "by-hand",
            "csi": {"driver": DRIVER, "volumeHandle": "unclaimed-handle"},
        },
    }))
    .unwrap();
    cluster.create(&cluster.pvs(), &unclaimed).await;
    cluster
        .wait_claim_event(
            NS,
            "no-class",
            "ProvisioningFailed",
            "the claim names no StorageClass",
        )
        .await;
    for name in ["huge-annotation", "unicode", long_name.as_str()] {
        cluster.wait_bound(NS, name).await;
    }

    // Answers no PV can hold: the volume goes again, the event says why, a fixed driver is used.
    for (misbehaviour, claim_name, needle) in [
        (
            Misbehaviour::HugeVolumeContext,
            "huge-context",
            "a volume context of",
        ),
        (
            Misbehaviour::ControlCharVolumeId,
            "control-chars",
            "a volume id with control characters",
        ),
    ] {
        control.set_misbehaviour(misbehaviour, true).await.unwrap();
        cluster
            .create(&cluster.pvcs(NS), &odd_claim(claim_name, Some("fast"), &[]))
            .await;
        let message = cluster
            .wait_claim_event(NS, claim_name, "ProvisioningFailed", needle)
            .await;
        assert!(
            message.contains("the volume was deleted again"),
            "{message}"
        );
        control.set_misbehaviour(misbehaviour, false).await.unwrap();
        cluster.wait_bound(NS, claim_name).await;
    }
    let log = sidecar.log();
    assert!(
        !log.contains(secret_value),
        "a secret value reached the log"
    );
    assert!(
        !log.lines()
            .any(|l| l.starts_with("FAKE LOG LINE") || l.contains('\u{1b}')),
        "a driver's volume id forged a log line"
    );
    assert!(
        log.lines().all(|l| l.len() < 64 * 1024),
        "a 10 MB answer was logged in full"
    );
    let events = kube::Api::<Event>::all(cluster.client.clone())
        .list(&ListParams::default())
        .await
        .unwrap();
    assert!(
        events.items.iter().all(|e| !e
            .message
            .as_deref()
            .unwrap_or_default()
            .contains(secret_value)),
        "a secret value reached an event"
    );
    // The unclaimed PV was neither deleted nor given the finalizer (it is not bound), and its
    // volume was never asked to go; once the admin deletes it, it goes.
    let kept = cluster.pvs().get("unclaimed").await.unwrap();
    assert!(kept.metadata.deletion_timestamp.is_none());
    assert!(
        !kept
            .metadata
            .finalizers
            .unwrap_or_default()
            .iter()
            .any(|f| f == "external-provisioner.volume.kubernetes.io/finalizer"),
        "the deletion-protection finalizer on a PV that was never bound"
    );
    assert!(
        !driver
            .state()
            .await
            .delete_calls
            .iter()
            .any(|(id, _)| id == "unclaimed-handle"),
        "DeleteVolume for a PV that was never bound"
    );
    cluster
        .pvs()
        .delete("unclaimed", &DeleteParams::default())
        .await
        .unwrap();
    cluster.wait_pv_gone("unclaimed").await;
    // The claim without a class cannot settle: it goes, then everything must match.
    delete_claim(&cluster, "no-class").await;
    settle_and_check(&cluster, &[&driver], seed).await;
}
