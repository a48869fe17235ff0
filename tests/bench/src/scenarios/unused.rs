//! Unused-claim tracking at scale (ours only; upstream has no such flag): `pods` Pods, `claims` of
//! them using a bound claim, the rest using none; the same binary with and without
//! `--track-unused-claims` after a restart: start-up requests, steady and peak RSS, CPU; then with
//! tracking, `k` claim-using Pods deleted: time until their claims are marked, writes per claim.

use std::time::Instant;

use anyhow::{Context, Result};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::api::{ListParams, PostParams};
use kube::{Api, Client};
use serde_json::json;

use super::{Bin, Env, Qps, mib, names, started};
use crate::cluster::{self, CONCURRENCY, DRIVER, NS};
use crate::procs::{Driver, KubeSim};
use crate::report::{Phase, Run};
use crate::wait::wait_until;

const ANNOTATION: &str = "csi-provisioner.rs/unused-since";

pub async fn unused(env: &Env, bin: &Bin<'_>, pods: usize, claims: usize, track: bool) -> Run {
    let mut run = Run {
        binary: if track {
            format!("{} --track-unused-claims", bin.label)
        } else {
            bin.label.into()
        },
        ..Default::default()
    };
    if let Err(e) = inner(env, bin, pods, claims, track, &mut run).await {
        run.fail(format!("{e:#}"));
    }
    run
}

/// `n` Pods without volumes, `pod-free-<i>`.
async fn create_free_pods(client: &Client, n: usize) -> Result<()> {
    let api: Api<Pod> = Api::namespaced(client.clone(), NS);
    futures::stream::iter(0..n)
        .map(|i| {
            let api = api.clone();
            async move {
                let pod: Pod = serde_json::from_value(json!({
                    "metadata": {"name": format!("pod-free-{i}"), "namespace": NS,
                                 "labels": {"app": "bench", "tier": "web"}},
                    "spec": {"nodeName": "node-1",
                             "containers": [{"name": "app", "image": "busybox",
                                             "env": [{"name": "A", "value": "some value"}]}]},
                    "status": {"phase": "Running"}
                }))?;
                api.create(&PostParams::default(), &pod).await?;
                Ok::<_, anyhow::Error>(())
            }
        })
        .buffer_unordered(CONCURRENCY)
        .try_collect::<Vec<()>>()
        .await?;
    Ok(())
}

async fn marked(client: &Client) -> Result<usize> {
    let api: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), NS);
    let list = api.list(&ListParams::default()).await?;
    Ok(list
        .items
        .iter()
        .filter(|c| {
            c.metadata
                .annotations
                .as_ref()
                .is_some_and(|a| a.contains_key(ANNOTATION))
        })
        .count())
}

async fn inner(
    env: &Env,
    bin: &Bin<'_>,
    pods: usize,
    claims: usize,
    track: bool,
    run: &mut Run,
) -> Result<()> {
    let dir = env.dir(&format!("unused-{pods}-{}-{track}", bin.label))?;
    let sim = KubeSim::start(&env.kube_sim, &dir).await?;
    let client = cluster::client(&sim.kubeconfig).await?;
    cluster::create_class(&client, "bench", "Immediate").await?;
    let driver = Driver::start(&env.driver, &dir, DRIVER, "node-1", false).await?;
    let tracker = started(env, &client).await?;
    let mut seed = vec![env.start_provisioner(bin, &sim, &driver, Qps::RAISED, None, "seed")?];
    env.wait_ready(&mut seed[0]).await?;
    let claim_names = names("claim", claims);
    cluster::create_claims(&client, &claim_names, "bench").await?;
    env.wait_bound(&tracker, &claim_names, &mut seed).await?;
    seed[0].kill().await;
    drop(seed);
    let seeding = Instant::now();
    cluster::create_pods(&client, &claim_names, &["node-1".to_string()]).await?;
    create_free_pods(&client, pods.saturating_sub(claims)).await?;
    run.metric("pods", "Pods in the cluster", pods as f64);
    run.metric("claim_pods", "Pods using a claim", claims as f64);
    eprintln!(
        "bench: {pods} Pods created in {:.1} s",
        seeding.elapsed().as_secs_f64()
    );

    let r0 = cluster::requests(&client).await?;
    let start = Instant::now();
    let extra: &[&str] = if track {
        &["--track-unused-claims"]
    } else {
        &[]
    };
    let mut prov =
        env.start_provisioner_with(bin, &sim, &driver, Qps::RAISED, extra, "measured")?;
    env.wait_ready(&mut prov).await?;
    env.wait_quiet(&client).await?;
    let ready = start.elapsed().as_secs_f64();
    let startup = cluster::requests(&client).await?.since(&r0);
    let s = prov.stats().context("provisioner stats")?;
    run.metric("quiet_s", "start until quiet (s)", ready);
    run.metric(
        "startup_requests",
        "start-up API requests (Events apart)",
        startup.non_event() as f64,
    );
    run.metric(
        "startup_writes",
        "start-up writes (Events apart)",
        startup.writes() as f64,
    );
    run.metric("steady_rss_mib", "steady RSS (MiB)", mib(s.rss_kib));
    run.metric("peak_rss_mib", "peak RSS (MiB)", mib(s.hwm_kib));
    run.metric("cpu_s", "CPU until quiet (s)", s.cpu_s);
    run.phases
        .push(Phase::new("start-up", "in total", 1.0, &startup));
    if marked(&client).await? != 0 {
        run.fail("a claim in use was marked unused".to_string());
    }
    if !track {
        return Ok(());
    }
    let k = claims.min(100);
    let gone: Vec<String> = claim_names[..k]
        .iter()
        .map(|c| format!("pod-{c}"))
        .collect();
    let r1 = cluster::requests(&client).await?;
    let cpu1 = s.cpu_s;
    let del = Instant::now();
    cluster::delete_all(&Api::<Pod>::namespaced(client.clone(), NS), &gone).await?;
    wait_until(
        "the claims of deleted Pods to be marked",
        env.timeout,
        || async { (marked(&client).await.ok()? >= k).then_some(()) },
    )
    .await?;
    let marking = del.elapsed().as_secs_f64();
    env.wait_quiet(&client).await?;
    let after = cluster::requests(&client).await?.since(&r1);
    run.metric(
        "mark_s",
        "Pods deleted until all their claims marked (s)",
        marking,
    );
    run.metric(
        "writes_per_transition",
        "claim writes per claim that became unused",
        after.writes() as f64 / k as f64,
    );
    let s = prov.stats().context("provisioner stats")?;
    run.metric("mark_cpu_s", "CPU for the transitions (s)", s.cpu_s - cpu1);
    if marked(&client).await? != k {
        run.fail(format!(
            "{} claims marked, {k} expected",
            marked(&client).await?
        ));
    }
    run.phases
        .push(Phase::new("transitions", "per claim", k as f64, &after));
    Ok(())
}
