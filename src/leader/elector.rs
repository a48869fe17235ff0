//! The election loop: reads and writes the Lease, moves the [`Leadership`] window (the guard
//! `runtime` holds), reports.
//!
//! Timing (client-go's): a standby tries every retry period; a leader renews every retry period
//! and, when renewals fail, keeps trying until its window (renew deadline from the start of its
//! last successful write) closes, then exits with status 1 as upstream. Each attempt is cut off
//! at the end of the window, so a hung request cannot keep a leader that can no longer renew.
//! Requests go through a client of their own (own token bucket), as upstream's separate
//! clientset: a saturated worker rate limit cannot cost the lease.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use kube::Api;
use kube::api::{ObjectMeta, PostParams};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep_until, timeout};
use tracing::{debug, error, info, warn};

use super::decide::{self, Elector, LeaseDecision, Timings};
use crate::config::{KubeOptions, LeaderElectionOptions};
use crate::http::Health;
use crate::k8s::events::{EventSource, EventSpec, Recorder, reference_to};
use crate::retry::describe;
use crate::runtime::Leadership;

/// Where the service account's namespace is mounted in a pod.
const SERVICE_ACCOUNT_NAMESPACE: &str = "/var/run/secrets/kubernetes.io/serviceaccount/namespace";
/// Event reason of "became leader" / "stopped leading" (client-go's).
const REASON: &str = "LeaderElection";
/// How often the health of the renewal loop is re-evaluated for `/healthz/leader-election`.
const HEALTH_INTERVAL: Duration = Duration::from_secs(1);

type NameLabel = Vec<(String, String)>;

/// client-go's leader-election metrics, as upstream exposes them (label `name` is empty there,
/// since csi-lib-utils never names its elector; kept so dashboards match).
#[derive(Clone, Debug, Default)]
pub(crate) struct LeaderMetrics {
    master: Family<NameLabel, Gauge>,
    slowpath: Family<NameLabel, Counter>,
}

impl LeaderMetrics {
    /// Registers the families (only with `--leader-election`, as upstream shows them).
    pub(crate) fn register(registry: &mut Registry) -> Self {
        let metrics = Self::default();
        registry.register(
            "leader_election_master_status",
            "[ALPHA] Gauge of if the reporting system is master of the relevant lease, 0 indicates backup, 1 indicates master. 'name' is the string used to identify the lease. Please make sure to group by name.",
            metrics.master.clone(),
        );
        registry.register(
            "leader_election_slowpath",
            "[ALPHA] Total number of slow path exercised in renewing leader leases. 'name' is the string used to identify the lease. Please make sure to group by name.",
            metrics.slowpath.clone(),
        );
        metrics.set_leading(false);
        metrics
    }

    fn label() -> NameLabel {
        vec![("name".to_owned(), String::new())]
    }

    fn set_leading(&self, leading: bool) {
        self.master
            .get_or_create(&Self::label())
            .set(i64::from(leading));
    }
}

/// Leader election could not start.
#[derive(Debug, thiserror::Error)]
pub(crate) enum StartError {
    /// The election's own client could not be built.
    #[error("creating the leader-election client: {0}")]
    Client(#[from] crate::k8s::client::ClientError),
    /// No identity.
    #[error(
        "cannot determine the leader-election identity: the host name is empty (set the pod's hostname or HOSTNAME)"
    )]
    NoIdentity,
}

/// A running election. Dropping it leaves the loop running; call [`LeaderElection::release`].
pub(crate) struct LeaderElection {
    leadership: Leadership,
    leading: watch::Receiver<bool>,
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
    renew_deadline: Duration,
}

impl LeaderElection {
    /// Starts contending for the Lease of `driver` at once (standbys fill their caches meanwhile).
    pub(crate) async fn start(
        options: &LeaderElectionOptions,
        kube: &KubeOptions,
        driver: &str,
        node_deployment: bool,
        health: Health,
        metrics: LeaderMetrics,
    ) -> Result<Self, StartError> {
        // Its own client and token bucket, as upstream's separate clientset.
        let client = crate::k8s::client::build_client(kube).await?;
        let raw_identity = host_name();
        let identity = decide::sanitize_name(&raw_identity);
        if identity.is_empty() {
            return Err(StartError::NoIdentity);
        }
        let namespace = lease_namespace(options);
        let name = decide::lease_name(driver);
        if node_deployment {
            warn!(
                lease = %format!("{namespace}/{name}"),
                "--leader-election with --node-deployment: all instances of the DaemonSet contend for one Lease and only the leader's node provisions (as upstream); drop --leader-election to let every node act for itself"
            );
        }
        let timings = Timings {
            lease_duration: options.lease_duration,
            renew_deadline: options.renew_deadline,
            retry_period: options.retry_period,
        };
        let events = Recorder::new(
            client.clone(),
            EventSource {
                component: format!("{}/{raw_identity}", decide::lock_name(driver)),
                host: None,
            },
        );
        let (until_tx, until_rx) = watch::channel(None);
        let (leading_tx, leading_rx) = watch::channel(false);
        let (stop_tx, stop_rx) = watch::channel(false);
        let elector = Arc::new(Mutex::new(Elector::new(identity, timings)));
        spawn_health_watch(elector.clone(), health, format!("{namespace}/{name}"));
        let shell = Shell {
            api: Api::namespaced(client, &namespace),
            describe: format!("{namespace}/{name}"),
            name,
            labels: options.labels.clone(),
            elector,
            cached: None,
            until: until_tx,
            leading: leading_tx,
            metrics,
            events,
            reported_leader: String::new(),
        };
        let task = tokio::spawn(shell.run(stop_rx));
        Ok(Self {
            leadership: Leadership::from_receiver(until_rx),
            leading: leading_rx,
            stop: stop_tx,
            task,
            renew_deadline: timings.renew_deadline,
        })
    }

    /// The guard for operations.
    pub(crate) fn leadership(&self) -> Leadership {
        self.leadership.clone()
    }

    /// Waits until this replica leads (`true`), or until `shutdown` completes first (`false`).
    pub(crate) async fn lead(&self, shutdown: impl Future<Output = ()>) -> bool {
        let mut leading = self.leading.clone();
        tokio::select! {
            led = leading.wait_for(|leading| *leading) => led.is_ok(),
            () = shutdown => false,
        }
    }

    /// Stops contending and gives the lease up when we hold it (upstream's
    /// `ReleaseOnCancel`), so that a standby takes over within a retry period instead of a lease
    /// duration. Call once the controllers have stopped.
    pub(crate) async fn release(self) {
        let _ = self.stop.send(true);
        // The release itself is bounded by the renew deadline, as client-go's.
        let _ = timeout(self.renew_deadline + Duration::from_secs(1), self.task).await;
    }
}

/// The outcome of one attempt.
enum LeaseAttempt {
    /// We hold the lease; the write was sent at this instant.
    Wrote(Instant),
    /// Someone else holds a valid lease.
    Held(String),
    /// The API server did not answer as needed (logged).
    Failed,
}

struct Shell {
    api: Api<Lease>,
    name: String,
    /// `namespace/name`, as client-go's `Describe`.
    describe: String,
    labels: BTreeMap<String, String>,
    elector: Arc<Mutex<Elector>>,
    /// The Lease as last read or written (its resourceVersion makes our writes conditional).
    cached: Option<Lease>,
    until: watch::Sender<Option<Instant>>,
    leading: watch::Sender<bool>,
    metrics: LeaderMetrics,
    events: Recorder,
    reported_leader: String,
}

impl Shell {
    fn elector(&self) -> std::sync::MutexGuard<'_, Elector> {
        crate::sync::lock(&self.elector)
    }

    async fn run(mut self, mut stop: watch::Receiver<bool>) {
        let timings = self.elector().timings();
        info!(lock = %self.describe, "Attempting to acquire leader lease...");
        let mut last = loop {
            let started = Instant::now();
            if let Ok(LeaseAttempt::Wrote(sent)) =
                timeout(attempt_budget(timings), self.try_acquire_or_renew()).await
            {
                break sent;
            }
            // Standbys poll a little faster than the retry period (client-go: up to 2.2 times
            // slower), so that a released lease is taken within one retry period.
            let pause = timings.retry_period.mul_f64(rand::random_range(0.8..=1.0));
            tokio::select! {
                () = sleep_until(started + pause) => {}
                _ = stop.wait_for(|stop| *stop) => return,
            }
        };
        self.open_window(last);
        self.metrics.set_leading(true);
        info!(lock = %self.describe, "Successfully acquired lease");
        debug!("became leader, starting");
        let _ = self.leading.send(true);
        self.record("became leader").await;

        loop {
            let until = self.until.borrow().unwrap_or(last);
            tokio::select! {
                () = sleep_until((last + timings.retry_period).min(until)) => {}
                _ = stop.wait_for(|stop| *stop) => break,
            }
            let started = Instant::now();
            if started >= until {
                self.lost("the renew deadline passed without a successful renewal")
                    .await;
            }
            let budget = until
                .saturating_duration_since(started)
                .min(attempt_budget(timings));
            match timeout(budget, self.try_acquire_or_renew()).await {
                Ok(LeaseAttempt::Wrote(sent)) => {
                    self.open_window(sent);
                    last = sent;
                }
                Ok(LeaseAttempt::Held(holder)) => {
                    self.lost(&format!("the lease is held by {holder}")).await;
                }
                Ok(LeaseAttempt::Failed) | Err(_) => {
                    info!(lock = %self.describe, "Failed to renew lease; retrying until the renew deadline");
                    last = started;
                }
            }
        }
        self.release().await;
    }

    fn open_window(&self, sent: Instant) {
        let window = self.elector().timings().acting_window();
        self.until.send_replace(Some(sent + window));
    }

    /// client-go's `tryAcquireOrRenew`: a conditional update of the Lease we last wrote while it
    /// is valid, else read, decide, write.
    async fn try_acquire_or_renew(&mut self) -> LeaseAttempt {
        let sent = Instant::now();
        let wall = Timestamp::now();
        let fast = self.elector().fast_renewal(sent, wall);
        if let (Some(spec), Some(lease)) = (fast, self.cached.clone()) {
            match self.write(lease, spec.clone()).await {
                Ok(written) => {
                    self.cached = Some(written);
                    self.elector().written(spec, sent);
                    return LeaseAttempt::Wrote(sent);
                }
                Err(e) => {
                    debug!(lock = %self.describe, error = %describe(&e), "Failed to update lease optimistically, falling back to slow path");
                }
            }
        }
        let current = match self.api.get_opt(&self.name).await {
            Ok(current) => current,
            Err(e) => {
                warn!(lock = %self.describe, error = %describe(&e), "Error retrieving lease lock");
                return LeaseAttempt::Failed;
            }
        };
        let now = Instant::now();
        let current_spec = current.as_ref().map(|l| l.spec.clone().unwrap_or_default());
        let decision = {
            let mut elector = self.elector();
            if let Some(spec) = &current_spec {
                elector.observe(spec, now);
            }
            if elector.is_leader() {
                self.metrics
                    .slowpath
                    .get_or_create(&LeaderMetrics::label())
                    .inc();
            }
            elector.decide(current_spec.as_ref(), now, wall)
        };
        self.report_leader();
        let written = match (decision, current) {
            (LeaseDecision::Held { holder }, _) => {
                debug!(lock = %self.describe, %holder, "Lease is held and has not yet expired");
                return LeaseAttempt::Held(holder);
            }
            (LeaseDecision::Create(spec), _) => {
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(self.name.clone()),
                        labels: (!self.labels.is_empty()).then(|| self.labels.clone()),
                        ..ObjectMeta::default()
                    },
                    spec: Some(spec.clone()),
                };
                self.api
                    .create(&PostParams::default(), &lease)
                    .await
                    .map(|l| (l, spec))
            }
            (LeaseDecision::Update(spec), Some(lease)) => {
                self.write(lease, spec.clone()).await.map(|l| (l, spec))
            }
            (LeaseDecision::Update(_), None) => return LeaseAttempt::Failed,
        };
        match written {
            Ok((lease, spec)) => {
                self.cached = Some(lease);
                self.elector().written(spec, sent);
                self.report_leader();
                LeaseAttempt::Wrote(sent)
            }
            Err(e) => {
                warn!(lock = %self.describe, error = %describe(&e), "Failed to update lease");
                LeaseAttempt::Failed
            }
        }
    }

    /// A conditional update (the Lease's resourceVersion) with our labels merged in.
    async fn write(&self, mut lease: Lease, spec: LeaseSpec) -> kube::Result<Lease> {
        lease.spec = Some(spec);
        lease.metadata.labels = decide::merged_labels(lease.metadata.labels.take(), &self.labels);
        lease.metadata.managed_fields = None;
        self.api
            .replace(&self.name, &PostParams::default(), &lease)
            .await
    }

    /// Logs a change of leader (client-go's `OnNewLeader`).
    fn report_leader(&mut self) {
        let holder = self.elector().holder().to_owned();
        if holder != self.reported_leader {
            info!(lock = %self.describe, leader = %holder, "New leader detected");
            self.reported_leader = holder;
        }
    }

    async fn record(&self, what: &str) {
        let Some(lease) = &self.cached else { return };
        let message = format!("{} {what}", self.elector().me());
        // Bounded: this also runs on the way out, when the API server may be unreachable.
        let _ = timeout(
            Duration::from_secs(1),
            self.events
                .publish(&reference_to(lease), EventSpec::normal(REASON, message)),
        )
        .await;
    }

    /// The lease is lost: stop acting at once, then exit as upstream does. Nothing can be issued
    /// any more (the window is closed), and a new process starts as a clean standby.
    async fn lost(&self, why: &str) -> ! {
        self.until.send_replace(None);
        self.metrics.set_leading(false);
        error!(lock = %self.describe, reason = %why, "Stopped leading; exiting so that a fresh process contends as a standby");
        self.record("stopped leading").await;
        std::process::exit(1);
    }

    /// client-go's `release`: clear the holder so a standby takes over at its next try.
    async fn release(&mut self) {
        self.until.send_replace(None);
        self.metrics.set_leading(false);
        let deadline = self.elector().timings().renew_deadline;
        let released = timeout(deadline, async {
            let lease = self.api.get_opt(&self.name).await?;
            let Some(lease) = lease else {
                return Ok(false);
            };
            let spec = lease.spec.clone().unwrap_or_default();
            let Some(spec) = self.elector().release(&spec, Timestamp::now()) else {
                return Ok(false);
            };
            self.cached = Some(self.write(lease, spec).await?);
            Ok::<_, kube::Error>(true)
        })
        .await;
        match released {
            Ok(Ok(true)) => {
                info!(lock = %self.describe, "Released the lease: a standby can take over now");
                self.record("stopped leading").await;
            }
            Ok(Ok(false)) => debug!(lock = %self.describe, "lease not ours; nothing to release"),
            Ok(Err(e)) => {
                error!(lock = %self.describe, error = %describe(&e), "Failed to release lease; a standby takes over once it expires");
            }
            Err(_) => {
                error!(lock = %self.describe, "Failed to release lease within the renew deadline; a standby takes over once it expires");
            }
        }
    }
}

/// The longest one attempt may take: a hung request must not use up a leader's whole window
/// (client-go's heuristic for its request timeout: half the renew deadline, at least 1s).
fn attempt_budget(timings: Timings) -> Duration {
    (timings.renew_deadline / 2).max(Duration::from_secs(1))
}

/// Feeds `/healthz/leader-election` from the elector's memory, independently of the loop, so a
/// stuck loop shows.
fn spawn_health_watch(elector: Arc<Mutex<Elector>>, health: Health, lease: String) {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(HEALTH_INTERVAL);
        loop {
            tick.tick().await;
            let check = crate::sync::lock(&elector).health(Instant::now());
            match check {
                Ok(()) => health.set_leader_election_healthy(),
                Err(since) => health.set_leader_election_unhealthy(format!(
                    "failed election to renew leadership on lease {lease} (last renewed {}s ago)",
                    since.as_secs()
                )),
            }
        }
    });
}

/// The holder identity before sanitising: the host name, as Go's `os.Hostname()` gives it in a
/// pod (the pod's name). `HOSTNAME`, which container runtimes set to the same value, comes first
/// so that several instances on one machine (tests) can be told apart.
fn host_name() -> String {
    crate::host::env()
        .or_else(crate::host::kernel)
        .unwrap_or_default()
}

/// The Lease's namespace: `--leader-election-namespace`, else `POD_NAMESPACE` (both resolved by
/// `config`), else the service account's, else `default` (csi-lib-utils' `inClusterNamespace`).
pub(crate) fn lease_namespace(options: &LeaderElectionOptions) -> String {
    options.namespace.clone().unwrap_or_else(|| {
        std::fs::read_to_string(SERVICE_ACCOUNT_NAMESPACE)
            .ok()
            .map(|ns| ns.trim().to_owned())
            .filter(|ns| !ns.is_empty())
            .unwrap_or_else(|| "default".to_owned())
    })
}

/// The ledger's namespace: the Lease namespace's rules (`--leader-election-namespace`, else
/// `POD_NAMESPACE`, else the service account's, else `default`), also without leader election.
pub(crate) fn ledger_namespace(config: &crate::config::Config) -> String {
    if let Some(options) = &config.leader_election {
        return lease_namespace(options);
    }
    std::env::var("POD_NAMESPACE")
        .ok()
        .or_else(|| std::fs::read_to_string(SERVICE_ACCOUNT_NAMESPACE).ok())
        .map(|ns| ns.trim().to_owned())
        .filter(|ns| !ns.is_empty())
        .unwrap_or_else(|| "default".to_owned())
}

#[cfg(test)]
#[path = "elector_tests.rs"]
mod tests;
