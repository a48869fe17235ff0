//! The scenarios. Each run starts its own kube-sim, mock driver(s) and provisioner(s) in a
//! fresh directory, so runs of two binaries see the same conditions.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::{Api, Client};

use crate::cluster::{self, DRIVER, NS, Requests, Tracker};
use crate::procs::{Driver, KubeSim, Proc};
use crate::report::{Phase, Run, percentile};
use crate::wait::wait_until;

mod capacity;
mod restore;
mod unused;
pub use capacity::{CapacityParams, capacity, parse_duration};
pub use restore::restore;
pub use unused::unused;

/// A `--kube-api-qps` / `--kube-api-burst` setting.
#[derive(Debug, Clone, Copy)]
pub struct Qps {
    pub name: &'static str,
    pub qps: u32,
    pub burst: u32,
}

impl Qps {
    pub const DEFAULT: Qps = Qps {
        name: "default",
        qps: 5,
        burst: 10,
    };
    pub const RAISED: Qps = Qps {
        name: "raised",
        qps: 1000,
        burst: 2000,
    };
    pub fn title(&self) -> String {
        format!("QPS {} / burst {}", self.qps, self.burst)
    }
}

/// What every scenario needs.
pub struct Env {
    pub kube_sim: PathBuf,
    pub driver: PathBuf,
    pub work: PathBuf,
    /// Extra flags for every provisioner.
    pub extra_args: Vec<String>,
    /// A provisioner is ready once a log line contains one of these.
    pub ready_log: Vec<String>,
    /// Longest wait for any one condition.
    pub timeout: Duration,
    /// Quiet period that ends start-up, and the idle measurement window.
    pub idle: Duration,
}

/// The binary under test.
pub struct Bin<'a> {
    pub label: &'a str,
    pub path: &'a Path,
}

impl Env {
    fn dir(&self, name: &str) -> Result<PathBuf> {
        let d = self.work.join(name);
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).with_context(|| format!("create {}", d.display()))?;
        Ok(d)
    }

    fn start_provisioner(
        &self,
        bin: &Bin<'_>,
        sim: &KubeSim,
        driver: &Driver,
        qps: Qps,
        node: Option<&str>,
        tag: &str,
    ) -> Result<Proc> {
        self.spawn_provisioner(bin, sim, driver, qps, node, &[], &[], tag)
    }

    /// [`Env::start_provisioner`] in controller mode with `extra` flags.
    fn start_provisioner_with(
        &self,
        bin: &Bin<'_>,
        sim: &KubeSim,
        driver: &Driver,
        qps: Qps,
        extra: &[&str],
        tag: &str,
    ) -> Result<Proc> {
        self.spawn_provisioner(bin, sim, driver, qps, None, extra, &[], tag)
    }

    #[allow(clippy::too_many_arguments)]
    fn spawn_provisioner(
        &self,
        bin: &Bin<'_>,
        sim: &KubeSim,
        driver: &Driver,
        qps: Qps,
        node: Option<&str>,
        extra: &[&str],
        extra_env: &[(&str, &str)],
        tag: &str,
    ) -> Result<Proc> {
        let mut args = vec![
            format!("--csi-address={}", driver.socket.display()),
            format!("--kubeconfig={}", sim.kubeconfig.display()),
            format!("--kube-api-qps={}", qps.qps),
            format!("--kube-api-burst={}", qps.burst),
        ];
        let mut env = Vec::new();
        if let Some(n) = node {
            args.push("--node-deployment".into());
            env.push(("NODE_NAME".to_string(), n.to_string()));
        }
        env.extend(
            extra_env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string())),
        );
        args.extend(self.extra_args.iter().cloned());
        args.extend(extra.iter().map(|a| a.to_string()));
        let dir = sim.kubeconfig.parent().unwrap_or(Path::new("."));
        Proc::spawn(
            &format!("provisioner {} {tag}", bin.label),
            bin.path,
            &args,
            &env,
            &dir.join(format!("provisioner-{tag}.log")),
        )
    }

    /// Waits for the ready log line (failing at once if the process exits first).
    async fn wait_ready(&self, p: &mut Proc) -> Result<()> {
        let start = Instant::now();
        loop {
            p.check_alive()?;
            let log = p.log_text();
            if self.ready_log.iter().any(|r| log.contains(r.as_str())) {
                return Ok(());
            }
            if start.elapsed() > self.timeout {
                bail!(
                    "{} did not log any of {:?} within {:?} (see {})",
                    p.name,
                    self.ready_log,
                    self.timeout,
                    p.log.display()
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits until the provisioners' request count (watches aside) has not moved for `idle`.
    async fn wait_quiet(&self, client: &Client) -> Result<Duration> {
        let start = Instant::now();
        let mut last = cluster::requests(client).await?.non_watch();
        let mut since = Instant::now();
        loop {
            tokio::time::sleep(Duration::from_millis(250)).await;
            let now = cluster::requests(client).await?.non_watch();
            if now != last {
                last = now;
                since = Instant::now();
            } else if since.elapsed() >= self.idle {
                return Ok(since - start);
            }
            if start.elapsed() > self.timeout {
                bail!(
                    "the provisioner kept sending requests for {:?}",
                    self.timeout
                );
            }
        }
    }

    /// Waits until all `names` are Bound, checking the provisioners stay up.
    async fn wait_bound(
        &self,
        tracker: &Tracker,
        names: &[String],
        provs: &mut [Proc],
    ) -> Result<()> {
        let start = Instant::now();
        loop {
            let n = tracker.bound_count(names);
            if n == names.len() {
                return Ok(());
            }
            for p in provs.iter_mut() {
                p.check_alive()?;
            }
            if start.elapsed() > self.timeout {
                bail!(
                    "claim never bound: {n} of {} claims Bound after {:?}",
                    names.len(),
                    self.timeout
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits until no PV `keep` accepts is left, then until the drivers hold no volume but
    /// `expected_left`; returns both times from `since`.
    async fn wait_deleted(
        &self,
        tracker: &Tracker,
        drivers: &[Driver],
        keep: impl Fn(&str) -> bool,
        expected_left: usize,
        since: Instant,
    ) -> Result<(f64, f64)> {
        let deadline = self.timeout;
        let pv_gone = wait_until("no PV left", deadline, || async {
            (tracker.pv_count(&keep) == 0).then(Instant::now)
        })
        .await
        .map_err(|_| {
            anyhow::anyhow!(
                "volume leaked: {} PV(s) still exist {deadline:?} after their claims were deleted",
                tracker.pv_count(&keep)
            )
        })?;
        let left = std::cell::Cell::new(0usize);
        let backend_gone = wait_until("no backend volume left", deadline, || async {
            let mut n = 0;
            for d in drivers {
                n += d.volumes().await.ok()?.len();
            }
            left.set(n);
            (n <= expected_left).then(Instant::now)
        })
        .await
        .map_err(|_| {
            anyhow::anyhow!(
                "volume leaked: the driver(s) still hold {} volume(s) {deadline:?} after deletion, {expected_left} expected",
                left.get()
            )
        })?;
        Ok((
            (pv_gone - since).as_secs_f64(),
            (backend_gone - since).as_secs_f64(),
        ))
    }
}

/// Backend volumes over all drivers; fails when one name was created twice or more volumes exist
/// than claims were made.
async fn check_no_double(drivers: &[Driver], claims: usize, run: &mut Run) -> Result<()> {
    let mut names = Vec::new();
    for d in drivers {
        names.extend(d.volumes().await?);
    }
    let unique: HashSet<&String> = names.iter().collect();
    if unique.len() != names.len() {
        run.fail(format!(
            "volume created twice: {} backend volumes under {} names",
            names.len(),
            unique.len()
        ));
    }
    if unique.len() != claims {
        run.fail(format!(
            "{} backend volumes for {claims} bound claims (a claim provisioned twice, or a volume leaked)",
            unique.len()
        ));
    }
    Ok(())
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

fn names(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}-{i}")).collect()
}

/// Claim-to-Bound latencies and the time from `start` until the last claim was Bound.
fn latencies(
    tracker: &Tracker,
    names: &[String],
    created: &std::collections::HashMap<String, Instant>,
    start: Instant,
) -> (Vec<f64>, f64) {
    let bound = tracker.bound_times(names);
    let mut lat = Vec::new();
    let mut last = start;
    for (n, b) in names.iter().zip(bound) {
        if let Some(b) = b {
            last = last.max(b);
            if let Some(c) = created.get(n) {
                lat.push(b.saturating_duration_since(*c).as_secs_f64());
            }
        }
    }
    (lat, (last - start).as_secs_f64())
}

async fn started(env: &Env, client: &Client) -> Result<Tracker> {
    let tracker = Tracker::start(client);
    wait_until("the bench's watches to sync", env.timeout, || async {
        tracker.synced().then_some(())
    })
    .await?;
    Ok(tracker)
}

/// The driver and the class provisioner of a burst.
#[derive(Clone, Copy)]
struct Flavour {
    name: &'static str,
    driver: &'static str,
    provisioner: &'static str,
}

const CSI: Flavour = Flavour {
    name: "burst",
    driver: DRIVER,
    provisioner: DRIVER,
};

/// CSI migration: an in-tree class, a driver of the plugin's CSI name (Portworx: no topology
/// and no handle format to fake, so only the translation itself is measured).
const MIGRATED: Flavour = Flavour {
    name: "migrated",
    driver: "pxd.portworx.com",
    provisioner: "kubernetes.io/portworx-volume",
};

/// Burst: `n` claims of an Immediate class at once, then all deleted.
pub async fn burst(env: &Env, bin: &Bin<'_>, qps: Qps, n: usize) -> Run {
    burst_of(env, bin, qps, n, CSI).await
}

/// [`burst`] with an in-tree class under CSI migration.
pub async fn migrated(env: &Env, bin: &Bin<'_>, qps: Qps, n: usize) -> Run {
    burst_of(env, bin, qps, n, MIGRATED).await
}

async fn burst_of(env: &Env, bin: &Bin<'_>, qps: Qps, n: usize, flavour: Flavour) -> Run {
    let mut run = Run {
        binary: bin.label.into(),
        ..Default::default()
    };
    if let Err(e) = burst_inner(env, bin, qps, n, flavour, &mut run).await {
        run.fail(format!("{e:#}"));
    }
    run
}

async fn burst_inner(
    env: &Env,
    bin: &Bin<'_>,
    qps: Qps,
    n: usize,
    flavour: Flavour,
    run: &mut Run,
) -> Result<()> {
    let dir = env.dir(&format!("{}-{n}-{}-{}", flavour.name, qps.name, bin.label))?;
    let sim = KubeSim::start(&env.kube_sim, &dir).await?;
    let client = cluster::client(&sim.kubeconfig).await?;
    cluster::create_class_of(&client, "bench", "Immediate", flavour.provisioner).await?;
    let driver = Driver::start(&env.driver, &dir, flavour.driver, "node-1", false).await?;
    let tracker = started(env, &client).await?;
    let mut provs = vec![env.start_provisioner(bin, &sim, &driver, qps, None, "0")?];
    env.wait_ready(&mut provs[0]).await?;
    let r0 = cluster::requests(&client).await?;
    let cpu0 = provs[0].stats().map_or(0.0, |s| s.cpu_s);

    let claims = names("claim", n);
    let start = Instant::now();
    let created = cluster::create_claims(&client, &claims, "bench").await?;
    env.wait_bound(&tracker, &claims, &mut provs).await?;
    let (lat, all_bound) = latencies(&tracker, &claims, &created, start);
    let r1 = cluster::requests(&client).await?;
    run.metric("claims", "claims", n as f64);
    run.metric("all_bound_s", "time until all Bound (s)", all_bound);
    run.metric("volumes_per_s", "volumes/s", n as f64 / all_bound);
    run.metric("p50_s", "claim-to-Bound p50 (s)", percentile(&lat, 50.0));
    run.metric("p95_s", "claim-to-Bound p95 (s)", percentile(&lat, 95.0));
    run.metric("p99_s", "claim-to-Bound p99 (s)", percentile(&lat, 99.0));
    let provisioned = r1.since(&r0);
    check_no_double(std::slice::from_ref(&driver), n, run).await?;
    // The bench's PV watch is a stream of its own, which may trail its claim watch.
    let _ = wait_until("a PV per bound claim", env.timeout, || async {
        (tracker.pv_count(|_| true) >= n).then_some(())
    })
    .await;
    let pvs = tracker.pv_count(|_| true);
    if pvs != n {
        run.fail(format!("{pvs} PVs for {n} bound claims"));
    }

    let del_start = Instant::now();
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), NS);
    cluster::delete_all(&pvcs, &claims).await?;
    let (no_pv, no_backend) = env
        .wait_deleted(
            &tracker,
            std::slice::from_ref(&driver),
            |_| true,
            0,
            del_start,
        )
        .await?;
    let r2 = cluster::requests(&client).await?;
    run.metric("no_pv_s", "deleted: time until no PV (s)", no_pv);
    run.metric(
        "no_backend_s",
        "deleted: time until no backend volume (s)",
        no_backend,
    );
    let deleted = r2.since(&r1);
    request_metrics(run, &provisioned, n, "provisioned");
    request_metrics(run, &deleted, n, "deleted");
    let p = &provs[0];
    let s = p.stats().context("provisioner stats")?;
    run.metric("cpu_s", "provisioner CPU (s)", s.cpu_s - cpu0);
    run.metric("peak_rss_mib", "provisioner peak RSS (MiB)", mib(s.hwm_kib));
    run.phases.push(Phase::new(
        "provisioning",
        "per provisioned volume",
        n as f64,
        &provisioned,
    ));
    run.phases.push(Phase::new(
        "deletion",
        "per deleted volume",
        n as f64,
        &deleted,
    ));
    events_delivered(env, &client, &claims, run).await
}

/// After the claims are gone: waits until every claim has its `Provisioning` and
/// `ProvisioningSucceeded` Events, or no Event was sent for `--idle` (what was dropped stays
/// dropped), and reports how many claims got each and how long after deletion that took.
async fn events_delivered(
    env: &Env,
    client: &Client,
    claims: &[String],
    run: &mut Run,
) -> Result<()> {
    let wanted: HashSet<String> = claims.iter().cloned().collect();
    let start = Instant::now();
    let mut sent = cluster::requests(client).await?.events();
    let mut quiet_since = Instant::now();
    let (started, succeeded, last_seen) = loop {
        let (started, succeeded) = cluster::claims_with_events(client, &wanted).await?;
        if started >= wanted.len() && succeeded >= wanted.len() {
            break (started, succeeded, start.elapsed());
        }
        let now = cluster::requests(client).await?.events();
        if now != sent {
            sent = now;
            quiet_since = Instant::now();
        } else if quiet_since.elapsed() >= env.idle || start.elapsed() >= env.timeout {
            break (started, succeeded, quiet_since.duration_since(start));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    run.metric(
        "claims_with_provisioning_event",
        "claims with their Provisioning Event by the end",
        started as f64,
    );
    run.metric(
        "claims_with_succeeded_event",
        "claims with their ProvisioningSucceeded Event by the end",
        succeeded as f64,
    );
    run.metric(
        "events_done_s",
        "Events: last one seen, after the last PV was gone (s)",
        last_seen.as_secs_f64(),
    );
    Ok(())
}

fn request_metrics(run: &mut Run, r: &Requests, n: usize, what: &str) {
    let n = n.max(1) as f64;
    run.metric(
        &format!("req_per_{what}"),
        &format!("API requests per {what} volume (Events apart)"),
        r.non_event() as f64 / n,
    );
    run.metric(
        &format!("writes_per_{what}"),
        &format!("API writes per {what} volume (Events apart)"),
        r.writes() as f64 / n,
    );
    run.metric(
        &format!("events_per_{what}"),
        &format!("Event requests per {what} volume"),
        r.events() as f64 / n,
    );
}

/// Restart at scale: `n` claims provisioned (at the raised QPS), then the provisioner killed
/// and started again at `qps`.
pub async fn restart(env: &Env, bin: &Bin<'_>, qps: Qps, n: usize) -> Run {
    let mut run = Run {
        binary: bin.label.into(),
        ..Default::default()
    };
    if let Err(e) = restart_inner(env, bin, qps, n, &mut run).await {
        run.fail(format!("{e:#}"));
    }
    run
}

async fn restart_inner(env: &Env, bin: &Bin<'_>, qps: Qps, n: usize, run: &mut Run) -> Result<()> {
    let dir = env.dir(&format!("restart-{n}-{}-{}", qps.name, bin.label))?;
    let sim = KubeSim::start(&env.kube_sim, &dir).await?;
    let client = cluster::client(&sim.kubeconfig).await?;
    cluster::create_class(&client, "bench", "Immediate").await?;
    let driver = Driver::start(&env.driver, &dir, DRIVER, "node-1", false).await?;
    let tracker = started(env, &client).await?;
    let mut first = vec![env.start_provisioner(bin, &sim, &driver, Qps::RAISED, None, "seed")?];
    env.wait_ready(&mut first[0]).await?;
    let claims = names("claim", n);
    cluster::create_claims(&client, &claims, "bench").await?;
    env.wait_bound(&tracker, &claims, &mut first).await?;
    check_no_double(std::slice::from_ref(&driver), n, run).await?;
    first[0].kill().await;
    drop(first);

    let r0 = cluster::requests(&client).await?;
    let start = Instant::now();
    let mut provs = vec![env.start_provisioner(bin, &sim, &driver, qps, None, "restarted")?];
    env.wait_ready(&mut provs[0]).await?;
    let ready = start.elapsed().as_secs_f64();
    env.wait_quiet(&client).await?;
    let startup = cluster::requests(&client).await?.since(&r0);
    let s = provs[0].stats().context("provisioner stats")?;
    run.metric("bound_claims", "bound claims with PVs", n as f64);
    run.metric("ready_s", "time to ready (s)", ready);
    run.metric(
        "startup_requests",
        "start-up API requests (Events apart)",
        startup.non_event() as f64,
    );
    run.metric(
        "startup_writes",
        "start-up API writes (Events apart)",
        startup.writes() as f64,
    );
    run.metric(
        "startup_events",
        "start-up Event requests",
        startup.events() as f64,
    );
    run.metric("steady_rss_mib", "steady RSS (MiB)", mib(s.rss_kib));
    run.metric("peak_rss_mib", "peak RSS (MiB)", mib(s.hwm_kib));
    run.metric("cpu_s", "CPU until quiet (s)", s.cpu_s);

    // A new claim after the restart still gets its volume, and its deletion leaves nothing.
    let probe = vec!["probe".to_string()];
    let created = cluster::create_claims(&client, &probe, "bench").await?;
    env.wait_bound(&tracker, &probe, &mut provs).await?;
    let (lat, _) = latencies(&tracker, &probe, &created, start);
    run.metric(
        "probe_bound_s",
        "a new claim after the restart: time to Bound (s)",
        lat.first().copied().unwrap_or(f64::NAN),
    );
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), NS);
    let del = Instant::now();
    cluster::delete_all(&pvcs, &probe).await?;
    wait_until("the probe's PV to go", env.timeout, || async {
        (tracker.pv_count(|_| true) == n).then_some(())
    })
    .await?;
    env.wait_deleted(&tracker, std::slice::from_ref(&driver), |_| false, n, del)
        .await?;
    check_no_double(std::slice::from_ref(&driver), n, run).await?;
    run.phases
        .push(Phase::new("start-up", "in total", 1.0, &startup));
    Ok(())
}

/// Node mode: `nodes` nodes with a driver and a `--node-deployment` provisioner each, `claims`
/// WaitForFirstConsumer claims used by pods spread over them, and `seeded` bound pairs on a node
/// without the driver.
pub async fn node(
    env: &Env,
    bin: &Bin<'_>,
    qps: Qps,
    nodes: usize,
    claims: usize,
    seeded: usize,
) -> Run {
    let mut run = Run {
        binary: bin.label.into(),
        ..Default::default()
    };
    if let Err(e) = node_inner(env, bin, qps, nodes, claims, seeded, &mut run).await {
        run.fail(format!("{e:#}"));
    }
    run
}

async fn node_inner(
    env: &Env,
    bin: &Bin<'_>,
    qps: Qps,
    nodes: usize,
    n: usize,
    seeded: usize,
    run: &mut Run,
) -> Result<()> {
    let dir = env.dir(&format!(
        "node-{nodes}-{n}-{seeded}-{}-{}",
        qps.name, bin.label
    ))?;
    let sim = KubeSim::start(&env.kube_sim, &dir).await?;
    let client = cluster::client(&sim.kubeconfig).await?;
    cluster::create_class(&client, "bench", "WaitForFirstConsumer").await?;
    let node_names = names("node", nodes);
    for name in &node_names {
        cluster::create_node(&client, name, true).await?;
    }
    if seeded > 0 {
        cluster::create_node(&client, "node-other", false).await?;
        cluster::seed_bound_pairs(&client, seeded, "bench", Some("node-other")).await?;
    }
    let tracker = started(env, &client).await?;
    let seeds: Vec<String> = names("seed", seeded);
    wait_until("the seeded claims to be Bound", env.timeout, || async {
        (tracker.bound_count(&seeds) == seeded).then_some(())
    })
    .await?;
    let before_start = cluster::requests(&client).await?;
    let mut drivers = Vec::new();
    let mut provs = Vec::new();
    for name in &node_names {
        let d = Driver::start(&env.driver, &dir, DRIVER, name, true).await?;
        provs.push(env.start_provisioner(bin, &sim, &d, qps, Some(name), name)?);
        drivers.push(d);
    }
    for p in provs.iter_mut() {
        env.wait_ready(p).await?;
    }
    env.wait_quiet(&client).await?;
    let r0 = cluster::requests(&client).await?;
    let startup = r0.since(&before_start);
    let per_node = nodes.max(1) as f64;
    run.metric(
        "startup_requests_per_instance",
        "start-up API requests per instance (Events apart)",
        startup.non_event() as f64 / per_node,
    );
    run.metric(
        "startup_writes_per_instance",
        "start-up API writes per instance (Events apart)",
        startup.writes() as f64 / per_node,
    );
    let cpu0: f64 = provs
        .iter()
        .filter_map(|p| p.stats())
        .map(|s| s.cpu_s)
        .sum();

    let claims = names("claim", n);
    run.metric("nodes", "nodes (one provisioner each)", nodes as f64);
    run.metric("claims", "WaitForFirstConsumer claims", n as f64);
    run.metric(
        "seeded",
        "bound PV/PVC pairs on another node",
        seeded as f64,
    );
    let start = Instant::now();
    let created = cluster::create_claims(&client, &claims, "bench").await?;
    cluster::create_pods(&client, &claims, &node_names).await?;
    env.wait_bound(&tracker, &claims, &mut provs).await?;
    let (lat, all_bound) = latencies(&tracker, &claims, &created, start);
    let r1 = cluster::requests(&client).await?;
    if n > 0 {
        run.metric("all_bound_s", "time until all Bound (s)", all_bound);
        run.metric("volumes_per_s", "volumes/s", n as f64 / all_bound);
        run.metric("p50_s", "claim-to-Bound p50 (s)", percentile(&lat, 50.0));
        run.metric("p99_s", "claim-to-Bound p99 (s)", percentile(&lat, 99.0));
    }
    check_no_double(&drivers, n, run).await?;
    let provisioned = r1.since(&r0);

    // Idle: what the instances ask for when nothing happens.
    env.wait_quiet(&client).await?;
    let i0 = cluster::requests(&client).await?;
    let idle_start = Instant::now();
    tokio::time::sleep(env.idle).await;
    let idle = cluster::requests(&client).await?.since(&i0);
    let idle_min = idle_start.elapsed().as_secs_f64() / 60.0;
    let stats: Vec<_> = provs.iter().filter_map(|p| p.stats()).collect();
    if stats.len() != provs.len() {
        bail!("a provisioner exited while idle");
    }
    let rss: Vec<f64> = stats.iter().map(|s| mib(s.rss_kib)).collect();
    run.metric(
        "total_rss_mib",
        "total RSS, all instances (MiB)",
        rss.iter().sum(),
    );
    run.metric(
        "mean_rss_mib",
        "RSS per instance, mean (MiB)",
        rss.iter().sum::<f64>() / rss.len().max(1) as f64,
    );
    run.metric(
        "max_rss_mib",
        "RSS per instance, largest (MiB)",
        rss.iter().copied().fold(0.0, f64::max),
    );
    run.metric(
        "max_hwm_mib",
        "peak RSS per instance, largest (MiB)",
        stats.iter().map(|s| mib(s.hwm_kib)).fold(0.0, f64::max),
    );
    run.metric(
        "idle_req_per_instance_min",
        "idle: API requests per instance per minute (watches included)",
        (idle.non_event() + idle.events()) as f64 / nodes.max(1) as f64 / idle_min,
    );

    let del_start = Instant::now();
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let pod_names: Vec<String> = claims.iter().map(|c| format!("pod-{c}")).collect();
    cluster::delete_all(&pods, &pod_names).await?;
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), NS);
    cluster::delete_all(&pvcs, &claims).await?;
    let (no_pv, no_backend) = env
        .wait_deleted(
            &tracker,
            &drivers,
            |name| !name.starts_with("pv-seed-"),
            0,
            del_start,
        )
        .await?;
    let r2 = cluster::requests(&client).await?;
    let deleted = r2.since(&r1).since(&idle);
    if n > 0 {
        run.metric("no_pv_s", "deleted: time until no PV (s)", no_pv);
        run.metric(
            "no_backend_s",
            "deleted: time until no backend volume (s)",
            no_backend,
        );
        request_metrics(run, &provisioned, n, "provisioned");
        request_metrics(run, &deleted, n, "deleted");
    }
    let cpu: f64 = provs
        .iter()
        .filter_map(|p| p.stats())
        .map(|s| s.cpu_s)
        .sum();
    run.metric("cpu_s", "CPU, all instances (s)", cpu - cpu0);
    if n > 0 {
        run.phases.push(Phase::new(
            "provisioning",
            "per provisioned volume",
            n as f64,
            &provisioned,
        ));
        run.phases.push(Phase::new(
            "deletion",
            "per deleted volume",
            n as f64,
            &deleted,
        ));
    }
    run.phases
        .push(Phase::new("start-up", "per instance", per_node, &startup));
    run.phases.push(Phase::new(
        "idle",
        "per instance per minute",
        nodes as f64 * idle_min,
        &idle,
    ));
    Ok(())
}
