//! Composition root: clients, driver handshake, controllers, HTTP server, graceful shutdown.
//!
//! Start-up follows upstream's order (kube client, CSI connection, Probe until ready, plugin info and
//! capabilities, NodeGetInfo in node mode, then caches and controllers), so logs read the same. On
//! SIGTERM/SIGINT the controllers stop taking work and let in-flight CSI calls finish or time out.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context as _;
use k8s_openapi::api::core::v1::{Node, ObjectReference, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::{CSINode, StorageClass, VolumeAttachment};
use kube::runtime::watcher;
use kube::{Api, Client};
use tokio::sync::watch;
use tracing::{info, warn};

use crate::config::Config;
use crate::csi::{
    self, ConnectOptions, CsiController, DriverInfo, Endpoint, GrpcCsi, HandshakeOptions,
    OperationMetrics,
};
use crate::http::{self, Health};
use crate::k8s::cache::{
    AttachmentIndex, CacheClosed, Watched, WatchedLean, watch_lean, watch_shared,
};
use crate::k8s::events::{EventQueueMetrics, EventSource, EventSpec, Recorder};
use crate::metrics::Metrics;
use crate::metrics::node_gone::NodeGoneMetrics;
use crate::runtime::queue::WorkQueueMetrics;
use crate::runtime::{Context, Shutdown, Stores, VolumeLocks};
use gauges::count;

mod gauges;

/// Installs SIGTERM/SIGINT handlers; the first signal requests a graceful shutdown.
fn install_signal_handlers() -> anyhow::Result<Shutdown> {
    use tokio::signal::unix::{SignalKind, signal};
    let (tx, rx) = watch::channel(false);
    let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    tokio::spawn(async move {
        let name = tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
        };
        info!("{name} received: finishing in-flight operations, then exiting");
        let _ = tx.send(true);
        // A second signal means the operator does not want to wait.
        tokio::select! {
            _ = term.recv() => {},
            _ = int.recv() => {},
        }
        warn!("second signal: exiting now");
        std::process::exit(1);
    });
    Ok(Shutdown::new(rx))
}

/// Upstream's provisioner identity: `<unix-millis>-<rand 0..9999>-<driver>[-<node>]`.
fn provisioner_identity(driver: &str, node: Option<&str>) -> String {
    let millis = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    let salt = rand::random_range(0..10_000);
    match node {
        Some(node) => format!("{millis}-{salt}-{driver}-{node}"),
        None => format!("{millis}-{salt}-{driver}"),
    }
}

/// Waits until every store has seen its initial list, so no decision is taken on a half-filled cache
/// (e.g. "no PV exists for this claim" before the PV list arrived).
/// Waits until every cache had its first list: `Ok(false)` when shutdown was requested first (a
/// clean exit, not an error).
async fn wait_ready(stores: &Stores, shutdown: &Shutdown) -> anyhow::Result<bool> {
    let all = async {
        stores.pvcs.wait_until_ready().await?;
        stores.pvs.wait_until_ready().await?;
        stores
            .classes
            .wait_until_ready()
            .await
            .map_err(|_| CacheClosed)?;
        if let Some(nodes) = &stores.nodes {
            nodes.wait_until_ready().await.map_err(|_| CacheClosed)?;
        }
        if let Some(csinodes) = &stores.csinodes {
            csinodes.wait_until_ready().await.map_err(|_| CacheClosed)?;
        }
        if let Some(attachments) = &stores.attachments {
            attachments.wait_until_ready().await;
        }
        Ok::<_, CacheClosed>(())
    };
    let mut logged = tokio::time::interval(Duration::from_secs(10));
    logged.tick().await;
    tokio::pin!(all);
    loop {
        tokio::select! {
            r = &mut all => return r.map(|()| true).context("a watch stopped before its first list completed"),
            _ = logged.tick() => info!("waiting for the first list of PVCs, PVs and StorageClasses from the API server"),
            _ = shutdown.clone().requested() => {
                info!("shutdown requested while waiting for caches; exiting");
                return Ok(false);
            }
        }
    }
}

/// Runs the sidecar until shutdown.
pub async fn run(config: Config) -> anyhow::Result<()> {
    let shutdown = install_signal_handlers()?;
    let config = Arc::new(config);

    let mut metrics = Metrics::new();
    // client-go creates its queues' series when the controllers are built, before leader
    // election: every replica shows them at 0 from the first scrape.
    let work_queues = WorkQueueMetrics::register(&mut metrics.registrar());
    let claims_queue = work_queues.queue(crate::runtime::queue::CLAIMS);
    let volumes_queue = work_queues.queue(crate::runtime::queue::VOLUMES);
    let capacity_queue = config
        .capacity
        .enabled
        .then(|| work_queues.queue(crate::runtime::queue::CSISTORAGECAPACITY));
    let operations = OperationMetrics::register(metrics.registry_mut());
    // csi_sidecar_operations_seconds is ALPHA in component-base.
    metrics.count_registered(crate::metrics::meta::Stability::Alpha, 1);
    let node_metrics = NodeGoneMetrics::register(metrics.registry_mut());
    let leader_metrics = config.leader_election.is_some().then(|| {
        // The two client-go leader-election families are ALPHA.
        metrics.count_registered(crate::metrics::meta::Stability::Alpha, 2);
        crate::leader::LeaderMetrics::register(metrics.registry_mut())
    });
    let event_metrics = EventQueueMetrics::register(metrics.registry_mut());
    let capacity_metrics = crate::capacity::metrics::CapacityMetrics::register_if(
        config.capacity.enabled,
        config.capacity.poll_interval,
        metrics.registry_mut(),
    );
    let audit_metrics = config
        .operator
        .audit_interval
        .is_some()
        .then(|| crate::audit::periodic::AuditMetrics::register(metrics.registry_mut()));
    let unused_gauge = config
        .operator
        .track_unused_claims
        .then(|| crate::unused::controller::UnusedGauge::register(metrics.registry_mut()));
    let metrics = Arc::new(metrics);
    let health = Health::default();
    if let Some(options) = &config.http {
        // Bound before the driver handshake, as upstream: the endpoint answers while we wait.
        let server = http::bind(options, metrics.clone(), health.clone()).await?;
        if options.enable_pprof {
            info!(endpoint = %options.address, "Starting profiling");
        }
        tokio::spawn(server.run(shutdown.clone().requested()));
    }

    let clients = crate::k8s::client::build_clients(&config.kube)
        .await
        .context("building the Kubernetes client")?;
    let client = clients.workers.clone();

    let endpoint = Endpoint::parse(&config.csi.address)?;
    let channel = csi::connect(endpoint, ConnectOptions::new(shutdown.receiver())).await?;
    let mut handshake = HandshakeOptions::new(config.csi.timeout, shutdown.receiver());
    handshake.node_deployment = config.node_deployment.is_some();
    handshake.metrics = operations.clone();
    let driver = csi::handshake(channel.clone(), handshake).await?;
    driver.require_provisioning()?;
    info!(driver = %driver.name, version = %driver.vendor_version, "CSI driver ready");
    // Leader election starts now, so standbys fill their caches while they wait.
    let election = match (&config.leader_election, leader_metrics) {
        (Some(options), Some(le_metrics)) => Some(
            crate::leader::LeaderElection::start(
                options,
                &config.kube,
                &driver.name,
                config.node_deployment.is_some(),
                health.clone(),
                le_metrics,
            )
            .await?,
        ),
        _ => None,
    };
    let leadership = election
        .as_ref()
        .map_or_else(crate::runtime::Leadership::always, |e| e.leadership());
    let csi: Arc<dyn CsiController> = Arc::new(crate::runtime::GuardedCsi {
        inner: Arc::new(GrpcCsi::new(channel, config.csi.timeout, operations)),
        leadership: leadership.clone(),
    });

    let gates = &config.feature_gates;
    let served = crate::k8s::served::storage_kinds(&client).await;
    let off = crate::k8s::served::features_off(
        gates.volume_attributes_class,
        config.capacity.enabled,
        &served,
    );
    if !off.is_empty() {
        warn!("features off on this API server: {}", off.join("; "));
    }
    let volume_attributes_class = gates.volume_attributes_class && served.volume_attributes_class;
    // From here on capacity tracking is off where it cannot work: the RBAC self-check does not
    // ask for its permissions and the controller is not started.
    let config = match config.capacity.enabled && !served.storage_capacity {
        true => {
            let mut adjusted = (*config).clone();
            adjusted.capacity.enabled = false;
            Arc::new(adjusted)
        }
        false => config,
    };
    let node_name = config
        .node_deployment
        .as_ref()
        .map(|n| n.node_name.as_str());
    let identity = provisioner_identity(&driver.name, node_name);
    let hostname = crate::host::os_hostname();
    // Events take only the rate budget the workers leave (k8s::events::Recorder::queued).
    let events = Recorder::queued(
        clients.background.clone(),
        EventSource::provisioner_lib(&driver.name, &hostname, &crate::k8s::events::random_uuid()),
        clients.bucket.clone(),
        event_metrics,
    );

    // Every way out, an error included, gives the lease up (it may have been won meanwhile)
    // rather than leave it to expire.
    let result: anyhow::Result<()> = async {
        spawn_rbac_self_check(
            &config,
            &driver,
            clients.background.clone(),
            health.clone(),
            events.clone(),
            metrics.operator.rbac_missing.clone(),
        );
        let capacity =
            crate::capacity::controller::prepare(&config, &driver, capacity_metrics).await?;

        let mut watches = start_watches(&client, &config, &driver).await;
        let stores = watches.stores.clone();
        if !wait_ready(&stores, &shutdown).await? {
            return Ok(());
        }
        tokio::spawn(crate::runtime::heap::trim_periodically(shutdown.clone()));
        // Only now: it reads the CSINode cache, and waiting for that cache beside the wait above
        // would not do (a kube-runtime store wakes only the last of its readiness waiters).
        if let Some(labeller) = watches.labeller.take() {
            drop(labeller.spawn());
        }
        if let Some(standby) = &election {
            info!("caches filled; waiting for leadership");
            if !standby.lead(shutdown.clone().requested()).await {
                return Ok(());
            }
        }
        info!("caches filled; starting controllers");

        let ctx = Arc::new(Context {
            config: config.clone(),
            client,
            csi,
            driver: Arc::new(driver),
            identity,
            volume_attributes_class,
            events,
            metrics,
            node_metrics,
            stores,
            volume_locks: VolumeLocks::default(),
            leadership,
        });

        {
            let stores = ctx.stores.clone();
            let backlog = ctx.metrics.backlog.clone();
            let operator = ctx.metrics.operator.clone();
            let driver = ctx.driver.name.clone();
            let node = node_name.map(str::to_owned);
            ctx.metrics.on_scrape(move || {
                let counts = count(
                    &stores.pvcs.state(),
                    &stores.pvs.state(),
                    &driver,
                    node.as_deref(),
                    jiff::Timestamp::now(),
                );
                backlog.claims_with_intent.set(
                    counts.claims_with_intent
                        + backlog
                            .ledger_intents
                            .load(std::sync::atomic::Ordering::Relaxed),
                );
                backlog
                    .volumes_awaiting_deletion
                    .set(counts.volumes_awaiting_deletion);
                operator.claims_pending.set(counts.pending);
                operator.set_stuck("Released", counts.released_stuck);
                operator.set_stuck("Terminating", counts.terminating_stuck);
                if let Some(gauge) = &unused_gauge {
                    gauge.refresh(&stores.pvcs.state(), &driver);
                }
            });
        }

        let provision = crate::provision::controller::run(
            ctx.clone(),
            watches.pvcs.subscribe(),
            watches.pvs.subscribe(),
            watches.classes.subscribe(),
            claims_queue,
            shutdown.clone(),
        );
        let reclaim = crate::reclaim::controller::run(
            ctx.clone(),
            watches.pvs.subscribe(),
            watches.pvcs.subscribe(),
            volumes_queue,
            shutdown.clone(),
        );
        let gone = crate::gone_nodes::controller::run(ctx.clone(), shutdown.clone());
        let capacity_pvs = capacity.as_ref().map(|_| watches.pvs.subscribe());
        let capacity = async {
            if let (Some(capacity), Some(pvs), Some(queue)) =
                (capacity, capacity_pvs, capacity_queue)
            {
                capacity
                    .run(ctx.clone(), pvs, queue, shutdown.clone())
                    .await;
            }
        };
        let sweep = async {
            // In node mode too (as upstream), one instance per round (see the module).
            let every = ctx.config.source_protection.snapshot_orphan_sweep_interval;
            if let Some(every) = every {
                crate::provision::snapshot_sweep::run(ctx.clone(), every, shutdown.clone()).await;
            }
        };
        let unused_claims = config
            .operator
            .track_unused_claims
            .then(|| watches.pvcs.subscribe());
        let unused = async {
            if let Some(claims) = unused_claims {
                // On the worker pool, next to the connection reading the Pod watch: 100,000 Pods
                // streamed to the main thread cost one cross-thread wake-up each (7x the CPU).
                let task = crate::unused::controller::run(ctx.clone(), claims, shutdown.clone());
                on_workers("unused-claim tracking", task).await;
            }
        };
        let audit = async {
            if let (Some(every), Some(m)) = (ctx.config.operator.audit_interval, audit_metrics) {
                crate::audit::periodic::run(ctx.clone(), every, m, shutdown.clone()).await;
            }
        };
        tokio::join!(provision, reclaim, gone, capacity, sweep, audit, unused);
        info!("controllers stopped; exiting");
        Ok(())
    }
    .await;
    if let Some(election) = election {
        // Only now: nothing is in flight any more, so a standby may take over at once.
        election.release().await;
    }
    result
}

/// Starts the RBAC self-check (`k8s::access`) in the background, on the background client (no
/// limiter) so that its dozen requests, sent once, never take the workers' rate budget; its findings go to the log, `/healthz/rbac`
/// and a Warning event on this Pod (`POD_NAME` / `NAMESPACE`, as upstream's capacity owner).
fn spawn_rbac_self_check(
    config: &Config,
    driver: &DriverInfo,
    client: Client,
    health: Health,
    events: Recorder,
    missing_gauge: prometheus_client::metrics::gauge::Gauge,
) {
    use crate::k8s::access;
    let features = access::Features {
        nodes: config.node_deployment.is_some()
            || config.capacity.enabled
            || (config.feature_gates.topology && driver.supports_topology()),
        attachments: driver.controller.publish_unpublish_volume,
        claim_cleanup: config.deleted_node.pvc_cleanup,
        leader_election_namespace: config
            .leader_election
            .as_ref()
            .map(crate::leader::lease_namespace),
        capacity_namespace: config
            .capacity
            .enabled
            .then(|| std::env::var("NAMESPACE").ok())
            .flatten(),
        ledger_namespace: Some(crate::leader::ledger_namespace(config)),
        node_ledgers: config.node_deployment.is_some(),
        pods: config.operator.track_unused_claims,
    };
    tokio::spawn(async move {
        let Some(missing) = access::self_check(&client, &features).await else {
            return;
        };
        let lines: Vec<String> = missing.iter().map(access::Missing::describe).collect();
        health.set_rbac_missing(lines.join("\n"));
        missing_gauge.set(i64::try_from(missing.len()).unwrap_or(i64::MAX));
        let pod = std::env::var("POD_NAME")
            .ok()
            .zip(std::env::var("NAMESPACE").ok());
        if let (false, Some((name, namespace))) = (missing.is_empty(), pod) {
            let object = ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                name: Some(name),
                namespace: Some(namespace),
                ..Default::default()
            };
            let message = format!(
                "{}. Add to the sidecar's RBAC:\n{}",
                lines.join("; "),
                access::rules_to_add(&missing)
            );
            events.emit(object, EventSpec::warning("MissingRBACPermission", message));
        }
    });
}

/// The running watches.
struct Watches {
    pvcs: WatchedLean<PersistentVolumeClaim>,
    pvs: WatchedLean<PersistentVolume>,
    classes: Watched<StorageClass>,
    stores: Stores,
    /// Node mode: labels PVs of our driver that others make, once the caches are filled.
    labeller: Option<crate::node_mode::labeller::Labeller>,
}

/// Starts the watches. Node-deployment mode: each instance caches only what it may act on
/// (`node_mode::watches`), so its memory follows its own node, not the cluster.
async fn start_watches(client: &Client, config: &Config, driver: &DriverInfo) -> Watches {
    let wc = watcher::Config::default();
    // Subscribers: PVCs feed the provisioning and reclaim controllers (and unused-claim
    // tracking), PVs both controllers as well (and capacity tracking), classes the provisioning
    // controller.
    let extra = usize::from(config.operator.track_unused_claims);
    let extra_pvs = usize::from(config.capacity.enabled);
    let (pvcs, pvs, nodes, csinodes, labeller) = match &config.node_deployment {
        Some(node) => {
            let scoped = crate::node_mode::watches::start(
                client,
                driver,
                &node.node_name,
                2,
                extra,
                extra_pvs,
            )
            .await;
            (
                scoped.pvcs,
                scoped.pvs,
                Some(scoped.nodes.store),
                Some(scoped.csinodes.store),
                Some(scoped.labeller),
            )
        }
        None => {
            let pvcs = watch_lean(
                Api::<PersistentVolumeClaim>::all(client.clone()),
                wc.clone(),
                "persistentvolumeclaims",
                2 + extra,
            );
            let pvs = watch_lean(
                Api::<PersistentVolume>::all(client.clone()),
                wc.clone(),
                "persistentvolumes",
                2 + extra_pvs,
            );
            // Nodes and CSINodes feed topology (central mode with a topology-aware driver) and
            // the dead-node checks; node mode learns its own topology from NodeGetInfo instead
            // (as upstream).
            let (nodes, csinodes) = if config.feature_gates.topology && driver.supports_topology() {
                let nodes: Watched<Node> =
                    watch_shared(Api::all(client.clone()), wc.clone(), "nodes", 0);
                let csinodes: Watched<CSINode> =
                    watch_shared(Api::all(client.clone()), wc.clone(), "csinodes", 0);
                (Some(nodes.store), Some(csinodes.store))
            } else {
                (None, None)
            };
            (pvcs, pvs, nodes, csinodes, None)
        }
    };
    let classes: Watched<StorageClass> =
        watch_shared(Api::all(client.clone()), wc, "storageclasses", 1);
    let attachments = driver.controller.publish_unpublish_volume.then(|| {
        let index = AttachmentIndex::default();
        index.spawn(Api::<VolumeAttachment>::all(client.clone()));
        index
    });
    let stores = Stores {
        pvcs: pvcs.store.clone(),
        pvs: pvs.store.clone(),
        classes: classes.store.clone(),
        nodes,
        csinodes,
        attachments,
    };
    Watches {
        pvcs,
        pvs,
        classes,
        stores,
        labeller,
    }
}

/// Runs `task` on the worker pool and waits for it; a panic in it is a panic here (the process
/// must not go on without one of its controllers).
async fn on_workers<F>(what: &'static str, task: F)
where
    F: std::future::Future<Output = ()> + Send + 'static,
{
    match tokio::spawn(task).await {
        Ok(()) => {}
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Err(e) => warn!("{what} stopped: {e}"),
    }
}

#[cfg(test)]
#[path = "app_tests.rs"]
mod tests;
