//! Storage capacity at scale (issue 42): `nodes` nodes (one mock driver standing for all of them),
//! `classes` WaitForFirstConsumer classes, so nodes x classes CSIStorageCapacity objects; a churn
//! of capacity changes on random nodes; a node added mid-run. The sidecar runs in controller mode
//! with `--enable-capacity` at default flags (its capacity client at QPS 1 / burst 5) and is
//! measured from outside, the same way for any binary: objects by a watch, writes by kube-sim's
//! counters, GetCapacity calls by the mock's, the queue depth from its `/metrics`, CPU and RSS
//! from /proc.

mod churn;
mod objects;
mod scrape;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::storage::v1::CSIStorageCapacity;
use kube::api::PostParams;
use kube::{Api, Client};
use serde::Serialize;
use serde_json::{Value, json};

use self::churn::Churn;
use self::objects::{Key, LABEL_DRIVER, Objects};
use super::{Bin, Env, Qps, mib, names};
use crate::cluster::{self, CONCURRENCY, DRIVER, NS, Requests, TOPOLOGY_KEY, WRITE_VERBS};
use crate::procs::{Driver, KubeSim};
use crate::report::{Phase, Run, num};
use crate::wait::wait_until;

/// What one capacity run does.
#[derive(Debug, Clone)]
pub struct CapacityParams {
    pub nodes: usize,
    pub classes: usize,
    /// Capacity changes a minute on random nodes (0: none).
    pub churn_per_min: u32,
    /// From the sidecar's start to the end of the run.
    pub duration: Duration,
    /// When a node is added, from the sidecar's start; none at or past `duration`.
    pub add_node_at: Duration,
    /// `--capacity-poll-interval`, as given to the sidecar (Go syntax, e.g. `1m`).
    pub poll_interval: String,
    /// The same, parsed.
    pub poll: Duration,
    /// Every object created before the sidecar starts, as a previous instance of the same
    /// Deployment left them (current values, our owner): the sidecar starts in steady state.
    pub seed_objects: bool,
    /// Time between two samples.
    pub sample_every: Duration,
}

/// The sidecar's Pod (env `POD_NAME`), owned by a ReplicaSet: upstream's default
/// `--capacity-ownerref-level=1` makes that ReplicaSet the objects' owner.
const POD: &str = "csi-provisioner-bench-0";
const REPLICA_SET: &str = "csi-provisioner-bench";
const DEPLOYMENT: &str = "csi-provisioner";
const RESOURCE: &str = "csistoragecapacities";

#[derive(Debug, Clone, Serialize)]
struct Sample {
    t_s: f64,
    /// Objects of our driver, and the (class, node) keys they cover.
    objects: usize,
    keys: usize,
    queue_depth: Option<f64>,
    /// Ours only: `csi_provisioner_capacity_queue_oldest_seconds`.
    queue_oldest_s: Option<f64>,
    rss_mib: Option<f64>,
    cpu_s: Option<f64>,
    /// CSIStorageCapacity writes by the sidecar since its start.
    writes: u64,
    /// Churn changes made so far.
    changes: u64,
}

pub async fn capacity(env: &Env, bin: &Bin<'_>, p: &CapacityParams) -> Run {
    let mut run = Run {
        binary: bin.label.into(),
        ..Default::default()
    };
    if let Err(e) = inner(env, bin, p, &mut run).await {
        run.fail(format!("{e:#}"));
    }
    run
}

fn capacity_writes(r: &Requests) -> u64 {
    r.0.iter()
        .filter(|((verb, resource), _)| {
            resource == RESOURCE && WRITE_VERBS.contains(&verb.as_str())
        })
        .map(|(_, n)| n)
        .sum()
}

/// The sidecar's CSIStorageCapacity writes answered with an error (a conflict, a validation).
async fn refused_writes(client: &Client) -> Result<u64> {
    let req = http::Request::get("/sim/counters")
        .body(Vec::new())
        .context("counters request")?;
    let doc: Value = serde_json::from_str(&client.request_text(req).await?)?;
    Ok(doc["byAgent"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|row| {
            row["agent"].as_str() != Some(cluster::BENCH_AGENT)
                && row["resource"] == RESOURCE
                && WRITE_VERBS.contains(&row["verb"].as_str().unwrap_or(""))
                && row["code"].as_u64().is_some_and(|c| c >= 400)
        })
        .map(|row| row["count"].as_u64().unwrap_or(0))
        .sum())
}

fn free_address() -> Result<SocketAddr> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").context("pick a free port")?;
    Ok(l.local_addr()?)
}

fn from_json<T: serde::de::DeserializeOwned>(v: Value) -> Result<T> {
    Ok(serde_json::from_value(v)?)
}

/// Deployment -> ReplicaSet -> Pod; the owner reference the sidecar will set on its objects.
async fn create_owner(client: &Client) -> Result<Value> {
    let pp = PostParams::default();
    let d = Api::<Deployment>::namespaced(client.clone(), NS)
        .create(
            &pp,
            &from_json(json!({
                "metadata": {"name": DEPLOYMENT, "namespace": NS},
                "spec": {"selector": {"matchLabels": {"app": DEPLOYMENT}},
                         "template": {"metadata": {"labels": {"app": DEPLOYMENT}},
                                      "spec": {"containers": [{"name": "csi-provisioner", "image": "bench"}]}}}
            }))?,
        )
        .await
        .context("create the sidecar's Deployment")?;
    let controller = |kind: &str, name: &str, uid: Option<String>| json!({"apiVersion": "apps/v1", "kind": kind, "name": name, "uid": uid, "controller": true});
    let rs = Api::<ReplicaSet>::namespaced(client.clone(), NS)
        .create(
            &pp,
            &from_json(json!({
                "metadata": {"name": REPLICA_SET, "namespace": NS,
                             "ownerReferences": [controller("Deployment", DEPLOYMENT, d.metadata.uid)]},
                "spec": {"selector": {"matchLabels": {"app": DEPLOYMENT}}}
            }))?,
        )
        .await
        .context("create the sidecar's ReplicaSet")?;
    let owner = controller("ReplicaSet", REPLICA_SET, rs.metadata.uid);
    Api::<Pod>::namespaced(client.clone(), NS)
        .create(
            &pp,
            &from_json(json!({
                "metadata": {"name": POD, "namespace": NS, "ownerReferences": [owner.clone()]},
                "spec": {"containers": [{"name": "csi-provisioner", "image": "bench"}]}
            }))?,
        )
        .await
        .context("create the sidecar's Pod")?;
    Ok(owner)
}

/// Nodes with our driver in their CSINode and the topology label, `CONCURRENCY` at a time.
async fn create_nodes(client: &Client, nodes: &[String]) -> Result<()> {
    futures::stream::iter(nodes)
        .map(|n| cluster::create_node(client, n, true))
        .buffer_unordered(CONCURRENCY)
        .try_collect::<Vec<()>>()
        .await?;
    Ok(())
}

/// One object per (class, node) as a previous instance left them: its labels, our owner, the
/// driver's current free bytes.
async fn seed(
    client: &Client,
    keys: &[Key],
    owner: &Value,
    free: &HashMap<String, i64>,
) -> Result<()> {
    let api: Api<CSIStorageCapacity> = Api::namespaced(client.clone(), NS);
    futures::stream::iter(keys.iter().enumerate())
        .map(|(i, (class, node))| {
            let api = api.clone();
            let object = json!({
                "apiVersion": "storage.k8s.io/v1", "kind": "CSIStorageCapacity",
                "metadata": {"name": format!("csisc-seed-{i}"), "namespace": NS,
                             "labels": {LABEL_DRIVER: DRIVER,
                                        "csi.storage.k8s.io/managed-by": "external-provisioner"},
                             "ownerReferences": [owner]},
                "storageClassName": class,
                "nodeTopology": {"matchLabels": {TOPOLOGY_KEY: node}},
                "capacity": free.get(node).copied().unwrap_or(0).to_string(),
            });
            async move {
                api.create(&PostParams::default(), &from_json(object)?)
                    .await
                    .context("seed a CSIStorageCapacity")?;
                Ok::<_, anyhow::Error>(())
            }
        })
        .buffer_unordered(CONCURRENCY)
        .try_collect::<Vec<()>>()
        .await?;
    Ok(())
}

fn keys(classes: &[String], nodes: &[String]) -> Vec<Key> {
    nodes
        .iter()
        .flat_map(|n| classes.iter().map(move |c| (c.clone(), n.clone())))
        .collect()
}

/// When the last of `keys` first appeared, or how many had by the end.
enum Reached {
    At(Instant),
    Partly(usize),
}

fn reached(objects: &Objects, keys: &[Key]) -> Reached {
    let seen = objects.first_seen(keys);
    match seen.iter().copied().collect::<Option<Vec<Instant>>>() {
        Some(all) => Reached::At(all.into_iter().max().unwrap_or_else(Instant::now)),
        None => Reached::Partly(seen.iter().flatten().count()),
    }
}

fn secs(d: Duration) -> String {
    format!("{} s", num(d.as_secs_f64()))
}

async fn inner(env: &Env, bin: &Bin<'_>, p: &CapacityParams, run: &mut Run) -> Result<()> {
    let dir = env.dir(&format!(
        "capacity-{}-{}-{}{}-{}",
        p.nodes,
        p.classes,
        p.churn_per_min,
        if p.seed_objects { "-seeded" } else { "" },
        bin.label
    ))?;
    let sim = KubeSim::start(&env.kube_sim, &dir).await?;
    let client = cluster::client(&sim.kubeconfig).await?;
    let owner = create_owner(&client).await?;
    let classes = names("capacity", p.classes);
    for c in &classes {
        cluster::create_class(&client, c, "WaitForFirstConsumer").await?;
    }
    // The last node is the one added mid-run; the driver knows its pool from the start, as a
    // driver whose node plugin registered before the CSINode's driver entry was written.
    let node_names = names("node", p.nodes + 1);
    let (initial, added_node) = node_names.split_at(p.nodes);
    create_nodes(&client, initial).await?;
    let mut driver_args = vec!["--topology".to_string()];
    driver_args.extend(
        node_names[1..]
            .iter()
            .map(|n| format!("--topology-node={n}")),
    );
    let driver =
        Driver::start_with(&env.driver, &dir, DRIVER, &node_names[0], &driver_args).await?;
    let initial_keys = keys(&classes, initial);
    let added_keys = keys(&classes, added_node);
    let objects = Objects::start(&client);
    if p.seed_objects {
        let free: HashMap<String, i64> = driver
            .state()
            .await?
            .pools
            .into_iter()
            .map(|pool| (pool.node, pool.available_bytes))
            .collect();
        seed(&client, &initial_keys, &owner, &free).await?;
    }
    let wanted_now = if p.seed_objects {
        initial_keys.len()
    } else {
        0
    };
    wait_until(
        "the bench's CSIStorageCapacity watch",
        env.timeout,
        || async { (objects.synced() && objects.counts().0 >= wanted_now).then_some(()) },
    )
    .await?;

    let get_capacity =
        |d: &mock_csi_driver::StateDump| d.calls.get("GetCapacity").map_or(0, |c| c.total);
    let calls0 = get_capacity(&driver.state().await?);
    let r0 = cluster::requests(&client).await?;
    let metrics_at = free_address()?;
    let flags = [
        "--enable-capacity".to_string(),
        format!("--capacity-poll-interval={}", p.poll_interval),
        format!("--http-endpoint={metrics_at}"),
    ];
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let start = Instant::now();
    let mut prov = env.spawn_provisioner(
        bin,
        &sim,
        &driver,
        Qps::DEFAULT,
        None,
        &flags,
        &[("NAMESPACE", NS), ("POD_NAME", POD)],
        "0",
    )?;
    env.wait_ready(&mut prov).await?;
    let ready = start.elapsed();
    let churn = Churn::start(&driver.socket, initial.to_vec(), p.churn_per_min).await?;

    let mut samples: Vec<Sample> = Vec::new();
    let mut added: Option<Instant> = None;
    let add = tokio::time::sleep_until((start + p.add_node_at).into());
    tokio::pin!(add);
    let mut tick = tokio::time::interval(p.sample_every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_progress = Instant::now();
    loop {
        tokio::select! {
            () = &mut add, if added.is_none() && p.add_node_at < p.duration => {
                added = Some(Instant::now());
                create_nodes(&client, added_node).await?;
                continue;
            }
            _ = tick.tick() => {}
        }
        prov.check_alive()?;
        let text = scrape::scrape(metrics_at).await.ok();
        let gauge = |name: &str, label: Option<(&str, &str)>| {
            text.as_deref().and_then(|t| scrape::value(t, name, label))
        };
        let stats = prov.stats();
        let (count, distinct) = objects.counts();
        let sample = Sample {
            t_s: start.elapsed().as_secs_f64(),
            objects: count,
            keys: distinct,
            queue_depth: gauge("workqueue_depth", Some(("name", "csistoragecapacity"))),
            queue_oldest_s: gauge("csi_provisioner_capacity_queue_oldest_seconds", None),
            rss_mib: stats.map(|s| mib(s.rss_kib)),
            cpu_s: stats.map(|s| s.cpu_s),
            writes: capacity_writes(&cluster::requests(&client).await?.since(&r0)),
            changes: churn.as_ref().map_or(0, |c| {
                c.counts.changes.load(std::sync::atomic::Ordering::Relaxed)
            }),
        };
        if last_progress.elapsed() >= Duration::from_secs(60) {
            last_progress = Instant::now();
            eprintln!(
                "bench: capacity [{}] {:.0} s: {} objects, queue depth {}, {} writes, RSS {} MiB",
                bin.label,
                sample.t_s,
                sample.objects,
                sample.queue_depth.map_or("?".into(), num),
                sample.writes,
                sample.rss_mib.map_or("?".into(), num)
            );
        }
        samples.push(sample);
        if start.elapsed() >= p.duration {
            break;
        }
    }
    let (changes, churn_failures) = churn.as_ref().map_or((0, 0), |c| {
        let load = |a: &std::sync::atomic::AtomicU64| a.load(std::sync::atomic::Ordering::Relaxed);
        (load(&c.counts.changes), load(&c.counts.failures))
    });
    drop(churn);
    let elapsed = start.elapsed();
    let requests = cluster::requests(&client).await?.since(&r0);
    let state = driver.state().await?;
    let calls = get_capacity(&state) - calls0;
    let stats = prov.stats().context("provisioner stats")?;

    let wanted = initial_keys.len();
    run.metric("nodes", "nodes (one mock driver for all)", p.nodes as f64);
    run.metric("classes", "WaitForFirstConsumer classes", p.classes as f64);
    run.metric(
        "objects_wanted",
        "objects wanted, nodes x classes",
        wanted as f64,
    );
    run.metric(
        "churn_per_min",
        "capacity changes a minute (random nodes)",
        f64::from(p.churn_per_min),
    );
    run.metric("changes", "capacity changes made", changes as f64);
    if churn_failures > 0 {
        run.metric(
            "churn_failures",
            "capacity changes the driver refused",
            churn_failures as f64,
        );
    }
    run.metric("ready_s", "time to ready (s)", ready.as_secs_f64());
    match reached(&objects, &initial_keys) {
        _ if p.seed_objects => run.metric_text(
            "all_exist_s",
            "time until every object exists, from the start (s)",
            "seeded before the start",
        ),
        Reached::At(t) => run.metric(
            "all_exist_s",
            "time until every object exists, from the start (s)",
            t.saturating_duration_since(start).as_secs_f64(),
        ),
        Reached::Partly(n) => run.metric_text(
            "all_exist_s",
            "time until every object exists, from the start (s)",
            format!(
                "not within the run: {n} of {wanted} after {}",
                secs(elapsed)
            ),
        ),
    }
    let add_label = format!(
        "a node added at {}: time until its {} objects exist (s)",
        secs(p.add_node_at),
        p.classes
    );
    match (added, reached(&objects, &added_keys)) {
        (None, _) => {}
        (Some(at), Reached::At(t)) => {
            run.metric(
                "added_node_s",
                &add_label,
                t.saturating_duration_since(at).as_secs_f64(),
            );
        }
        (Some(at), Reached::Partly(n)) => run.metric_text(
            "added_node_s",
            &add_label,
            format!(
                "not within the run: {n} of {} after {}",
                p.classes,
                secs(at.elapsed())
            ),
        ),
    }
    let minutes = elapsed.as_secs_f64() / 60.0;
    let writes = capacity_writes(&requests);
    let refused = refused_writes(&client).await?;
    if refused > 0 {
        run.metric(
            "refused_writes",
            "CSIStorageCapacity writes the API server refused (counted above too)",
            refused as f64,
        );
    }
    run.metric(
        "writes_per_min",
        "CSIStorageCapacity writes a minute over the run",
        writes as f64 / minutes,
    );
    // The steady state: the rate from the first sample at which every object existed.
    let all_at = samples.iter().position(|s| s.keys >= wanted);
    if let (Some(i), Some(last)) = (all_at, samples.last())
        && last.t_s - samples[i].t_s >= 30.0
    {
        run.metric(
            "steady_writes_per_min",
            "same, once every object existed",
            (last.writes - samples[i].writes) as f64 * 60.0 / (last.t_s - samples[i].t_s),
        );
    }
    run.metric(
        "getcapacity_per_poll",
        &format!("GetCapacity calls per poll interval ({})", p.poll_interval),
        calls as f64 / (elapsed.as_secs_f64() / p.poll.as_secs_f64().max(1e-3)),
    );
    let depths: Vec<f64> = samples.iter().filter_map(|s| s.queue_depth).collect();
    if depths.is_empty() {
        run.metric_text("queue_max", "queue depth, max", "not served");
    } else {
        let max = depths.iter().copied().fold(0.0, f64::max);
        run.metric("queue_max", "queue depth (`workqueue_depth`), max", max);
        run.metric(
            "queue_max_per_object",
            "same, per object wanted ((nodes + 1) x classes)",
            max / (wanted + added_keys.len()) as f64,
        );
        run.metric(
            "queue_end",
            "queue depth at the end",
            *depths.last().unwrap_or(&0.0),
        );
    }
    let oldest: Vec<f64> = samples.iter().filter_map(|s| s.queue_oldest_s).collect();
    if !oldest.is_empty() {
        run.metric(
            "queue_oldest_max_s",
            "oldest queued item's wait (ours' gauge), max (s)",
            oldest.iter().copied().fold(0.0, f64::max),
        );
        run.metric(
            "queue_oldest_end_s",
            "same, at the end (s)",
            *oldest.last().unwrap_or(&0.0),
        );
    }
    let (count, distinct) = objects.counts();
    run.metric("objects_end", "objects at the end", count as f64);
    run.metric(
        "duplicates_end",
        "duplicate objects at the end",
        (count - distinct) as f64,
    );
    let free: HashMap<&str, i64> = state
        .pools
        .iter()
        .map(|p| (p.node.as_str(), p.available_bytes))
        .collect();
    let stale = objects
        .capacities()
        .iter()
        .flat_map(|((_, node), caps)| caps.iter().map(move |c| (node, c)))
        .filter(|(node, c)| **c != free.get(node.as_str()).copied())
        .count();
    run.metric(
        "stale_end",
        "objects whose capacity differs from the driver's at the end",
        stale as f64,
    );
    run.metric("cpu_s", "provisioner CPU over the run (s)", stats.cpu_s);
    run.metric(
        "peak_rss_mib",
        "provisioner peak RSS (MiB)",
        mib(stats.hwm_kib),
    );
    let half = samples
        .iter()
        .find(|s| s.t_s >= elapsed.as_secs_f64() / 2.0)
        .and_then(|s| s.rss_mib);
    if let Some(half) = half {
        run.metric("rss_half_mib", "provisioner RSS half-way (MiB)", half);
    }
    run.metric(
        "rss_end_mib",
        "provisioner RSS at the end (MiB)",
        mib(stats.rss_kib),
    );
    run.phases
        .push(Phase::new("the run", "per minute", minutes, &requests));
    write_samples(&dir, &samples)?;
    run.samples = samples
        .iter()
        .map(|s| serde_json::to_value(s).unwrap_or_default())
        .collect();
    Ok(())
}

fn write_samples(dir: &std::path::Path, samples: &[Sample]) -> Result<()> {
    let opt = |v: Option<f64>| v.map_or(String::new(), |v| format!("{v}"));
    let mut csv =
        "t_s,objects,keys,queue_depth,queue_oldest_s,rss_mib,cpu_s,writes,changes\n".to_string();
    for s in samples {
        csv.push_str(&format!(
            "{:.1},{},{},{},{},{},{},{},{}\n",
            s.t_s,
            s.objects,
            s.keys,
            opt(s.queue_depth),
            opt(s.queue_oldest_s),
            opt(s.rss_mib),
            opt(s.cpu_s),
            s.writes,
            s.changes
        ));
    }
    std::fs::write(dir.join("samples.csv"), csv).context("write samples.csv")?;
    Ok(())
}

/// A duration as `90`, `90s`, `5m`, `1h30m` or `500ms`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let bad = || format!("{s:?} is not a duration (e.g. 30s, 5m, 1h30m)");
    if let Ok(n) = s.parse::<f64>() {
        return Ok(Duration::from_secs_f64(n));
    }
    let mut total = 0.0;
    let mut rest = s.trim();
    if rest.is_empty() {
        return Err(bad());
    }
    while !rest.is_empty() {
        let split = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(bad)?;
        let (n, tail) = rest.split_at(split);
        let n: f64 = n.parse().map_err(|_| bad())?;
        let unit_len = tail
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(tail.len());
        let (unit, tail) = tail.split_at(unit_len);
        total += n * match unit {
            "h" => 3600.0,
            "m" => 60.0,
            "s" => 1.0,
            "ms" => 0.001,
            _ => return Err(bad()),
        };
        rest = tail;
    }
    Ok(Duration::from_secs_f64(total))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_in_go_and_plain_forms() {
        assert_eq!(parse_duration("90"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert!(parse_duration("5 minutes").is_err());
        assert!(parse_duration("").is_err());
    }

    #[test]
    fn only_capacity_writes_count() {
        let mut r = Requests::default();
        r.0.insert(("create".into(), RESOURCE.into()), 3);
        r.0.insert(("update".into(), RESOURCE.into()), 2);
        r.0.insert(("list".into(), RESOURCE.into()), 7);
        r.0.insert(("create".into(), "persistentvolumes".into()), 5);
        assert_eq!(capacity_writes(&r), 5);
    }
}
