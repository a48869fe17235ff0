//! Data sources at scale: `n` claims restored at once from one VolumeSnapshot of a source volume
//! (the snapshot taken on the mock driver, its VolumeSnapshot and content written as the snapshot
//! controller would), then deleted: volumes/s and API requests per restored volume.

use std::time::Instant;

use anyhow::{Context, Result};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::api::{ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;

use super::{Bin, Env, Qps, check_no_double, latencies, mib, names, request_metrics, started};
use crate::cluster::{self, DRIVER, NS};
use crate::procs::{Driver, KubeSim};
use crate::report::{Phase, Run, percentile};

pub async fn restore(env: &Env, bin: &Bin<'_>, qps: Qps, n: usize) -> Run {
    let mut run = Run {
        binary: bin.label.into(),
        ..Default::default()
    };
    if let Err(e) = restore_inner(env, bin, qps, n, &mut run).await {
        run.fail(format!("{e:#}"));
    }
    run
}

fn snapshot_api(kind: &str, plural: &str) -> ApiResource {
    ApiResource {
        group: "snapshot.storage.k8s.io".into(),
        version: "v1".into(),
        api_version: "snapshot.storage.k8s.io/v1".into(),
        kind: kind.into(),
        plural: plural.into(),
    }
}

/// Takes a snapshot of `volume_id` and writes a ready VolumeSnapshot `snap` bound to its content.
async fn snapshot(client: &Client, driver: &Driver, volume_id: &str) -> Result<()> {
    use mock_csi_driver::csi::v1::CreateSnapshotRequest;
    use mock_csi_driver::csi::v1::controller_client::ControllerClient;
    let channel = mock_csi_driver::connect(&driver.socket).await?;
    let id = ControllerClient::new(channel)
        .create_snapshot(CreateSnapshotRequest {
            source_volume_id: volume_id.into(),
            name: "bench-snapshot".into(),
            ..Default::default()
        })
        .await
        .context("CreateSnapshot on the mock driver")?
        .into_inner()
        .snapshot
        .context("CreateSnapshot answered no snapshot")?
        .snapshot_id;
    let snapshots: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        NS,
        &snapshot_api("VolumeSnapshot", "volumesnapshots"),
    );
    let contents: Api<DynamicObject> = Api::all_with(
        client.clone(),
        &snapshot_api("VolumeSnapshotContent", "volumesnapshotcontents"),
    );
    let created = snapshots
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshot",
                "metadata": {"name": "snap", "namespace": NS},
                "spec": {"source": {"persistentVolumeClaimName": "source"}},
            }))?,
        )
        .await
        .context("create VolumeSnapshot")?;
    contents
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshotContent",
                "metadata": {"name": "snap-content"},
                "spec": {"driver": DRIVER, "deletionPolicy": "Delete", "source": {"snapshotHandle": id},
                    "volumeSnapshotRef": {"kind": "VolumeSnapshot", "namespace": NS, "name": "snap",
                        "uid": created.metadata.uid}},
            }))?,
        )
        .await
        .context("create VolumeSnapshotContent")?;
    let status = json!({"status": {"snapshotHandle": id, "readyToUse": true}});
    contents
        .patch_status(
            "snap-content",
            &PatchParams::default(),
            &Patch::Merge(&status),
        )
        .await?;
    let status = json!({"status": {"boundVolumeSnapshotContentName": "snap-content",
        "readyToUse": true, "restoreSize": "1Gi"}});
    snapshots
        .patch_status("snap", &PatchParams::default(), &Patch::Merge(&status))
        .await?;
    Ok(())
}

async fn restore_inner(env: &Env, bin: &Bin<'_>, qps: Qps, n: usize, run: &mut Run) -> Result<()> {
    let dir = env.dir(&format!("restore-{n}-{}-{}", qps.name, bin.label))?;
    let sim = KubeSim::start(&env.kube_sim, &dir).await?;
    let client = cluster::client(&sim.kubeconfig).await?;
    cluster::create_class(&client, "bench", "Immediate").await?;
    let driver = Driver::start(&env.driver, &dir, DRIVER, "node-1", false).await?;
    let tracker = started(env, &client).await?;
    let mut provs = vec![env.start_provisioner(bin, &sim, &driver, qps, None, "0")?];
    env.wait_ready(&mut provs[0]).await?;

    let source = vec!["source".to_string()];
    cluster::create_claims(&client, &source, "bench").await?;
    env.wait_bound(&tracker, &source, &mut provs).await?;
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), NS);
    let volume = pvcs
        .get("source")
        .await?
        .spec
        .and_then(|s| s.volume_name)
        .context("the source claim has no volume")?;
    let pv: PersistentVolume = Api::all(client.clone()).get(&volume).await?;
    let handle = pv
        .spec
        .and_then(|s| s.csi)
        .context("the source PV is not CSI")?
        .volume_handle;
    snapshot(&client, &driver, &handle).await?;

    let r0 = cluster::requests(&client).await?;
    let cpu0 = provs[0].stats().map_or(0.0, |s| s.cpu_s);
    let claims = names("restored", n);
    let start = Instant::now();
    let created = cluster::create_claims_from_snapshot(&client, &claims, "bench", "snap").await?;
    env.wait_bound(&tracker, &claims, &mut provs).await?;
    let (lat, all_bound) = latencies(&tracker, &claims, &created, start);
    let r1 = cluster::requests(&client).await?;
    run.metric("claims", "claims restored from one snapshot", n as f64);
    run.metric("all_bound_s", "time until all Bound (s)", all_bound);
    run.metric("volumes_per_s", "volumes/s", n as f64 / all_bound);
    run.metric("p99_s", "claim-to-Bound p99 (s)", percentile(&lat, 99.0));
    check_no_double(std::slice::from_ref(&driver), n + 1, run).await?;
    let provisioned = r1.since(&r0);
    request_metrics(run, &provisioned, n, "provisioned");
    let s = provs[0].stats().context("provisioner stats")?;
    run.metric("cpu_s", "provisioner CPU (s)", s.cpu_s - cpu0);
    run.metric("peak_rss_mib", "provisioner peak RSS (MiB)", mib(s.hwm_kib));
    run.phases.push(Phase::new(
        "provisioning",
        "per restored volume",
        n as f64,
        &provisioned,
    ));
    Ok(())
}
