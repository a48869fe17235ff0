//! Rough throughput of the simulator: N claims provisioned (PV pre-bound to each claim, as
//! the sidecar does), bound by the controllers, then released.
//! `cargo run -p kube-sim --release --example load -- 1000`

use std::time::Instant;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube_sim::{Sim, SimConfig};
use serde_json::json;

fn obj<T: serde::de::DeserializeOwned>(v: serde_json::Value) -> anyhow::Result<T> {
    Ok(serde_json::from_value(v)?)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(500);
    let sim = Sim::start(SimConfig::default()).await?;
    let c = sim.client();
    let pp = PostParams::default();
    let scs: Api<StorageClass> = Api::all(c.clone());
    scs.create(
        &pp,
        &obj(json!({"metadata": {"name": "fast"}, "provisioner": "d.example.com"}))?,
    )
    .await?;
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(c.clone(), "default");
    let pvs: Api<PersistentVolume> = Api::all(c.clone());

    let t = Instant::now();
    let claims: Vec<PersistentVolumeClaim> = futures::stream::iter(0..n)
        .map(|i| {
            let pvcs = pvcs.clone();
            async move {
                let p: PersistentVolumeClaim = obj(json!({"metadata": {"name": format!("c{i}")}, "spec": {"storageClassName": "fast",
                    "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}))?;
                Ok::<_, anyhow::Error>(pvcs.create(&PostParams::default(), &p).await?)
            }
        })
        .buffer_unordered(32)
        .try_collect()
        .await?;
    println!("created {n} claims in {:?}", t.elapsed());

    let t = Instant::now();
    futures::stream::iter(claims)
        .map(|claim| {
            let pvs = pvs.clone();
            async move {
                let name = claim.metadata.name.clone().unwrap_or_default();
                let v: PersistentVolume = obj(json!({"metadata": {"name": format!("pv-{name}"), "annotations": {"pv.kubernetes.io/provisioned-by": "d.example.com"}},
                    "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"], "storageClassName": "fast", "persistentVolumeReclaimPolicy": "Delete",
                             "csi": {"driver": "d.example.com", "volumeHandle": name},
                             "claimRef": {"kind": "PersistentVolumeClaim", "namespace": "default", "name": name, "uid": claim.metadata.uid, "apiVersion": "v1"}}}))?;
                Ok::<_, anyhow::Error>(pvs.create(&PostParams::default(), &v).await?)
            }
        })
        .buffer_unordered(32)
        .try_collect::<Vec<_>>()
        .await?;
    loop {
        let bound = pvcs
            .list(&ListParams::default())
            .await?
            .items
            .iter()
            .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound"))
            .count();
        if bound == n {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    println!(
        "created {n} volumes and all claims bound in {:?}",
        t.elapsed()
    );

    let t = Instant::now();
    pvcs.delete_collection(&DeleteParams::default(), &ListParams::default())
        .await?;
    loop {
        let released = pvs
            .list(&ListParams::default())
            .await?
            .items
            .iter()
            .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Released"))
            .count();
        if released == n {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    println!(
        "deleted {n} claims and all volumes released in {:?}",
        t.elapsed()
    );
    let counters = sim.counters();
    println!(
        "client requests: {} (writes {}); resourceVersion {}",
        counters.total(),
        counters.writes(),
        sim.resource_version()
    );
    sim.shutdown().await;
    Ok(())
}
