//! Metrics registry with the upstream metric names and labels.
//!
//! [`Metrics`] owns the one `prometheus_client` registry. It registers the provisioning and
//! deletion families of upstream's vendored provisioner library; other modules register their
//! own families (e.g. `csi_sidecar_operations_seconds`) through [`Metrics::registry_mut`], or
//! through [`Metrics::registrar`] when upstream gives them a stability level (the work queues'),
//! at start-up, before the registry is shared with the HTTP server.
//!
//! prometheus-client appends `_total` to counter names itself, so counters are registered without
//! it; the exposed names are checked in the tests below. Scrapes are answered in Prometheus text
//! 0.0.4 unless OpenMetrics is asked for ([`exposition`]).

use std::sync::OnceLock;
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

pub(crate) mod exposition;
pub(crate) mod meta;
pub(crate) mod node_gone;
pub(crate) mod process;

use exposition::{Format, render};
use meta::{MetaMetrics, Registrar, Stability};
use process::ProcessCollector;

/// Prometheus client_golang's `DefBuckets`, which upstream's duration histograms use.
pub(crate) const DEFAULT_BUCKETS: [f64; 11] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// A label set of `N` labels, names and values, in label order.
pub(crate) type Labels<const N: usize> = [(&'static str, String); N];

/// The label set of a family with one label.
pub(crate) type OneLabel = Labels<1>;

type DurationFamily<L> = Family<L, Histogram, fn() -> Histogram>;

fn default_histogram() -> Histogram {
    Histogram::new(DEFAULT_BUCKETS)
}

/// The outcome families of one of upstream's controllers: `<name>_total` (successes),
/// `<name>_failed_total` (failed attempts) and `<name>_duration_seconds` (latency of successes).
#[derive(Debug, Clone)]
pub(crate) struct OutcomeMetrics<const N: usize> {
    total: Family<Labels<N>, Counter>,
    failed: Family<Labels<N>, Counter>,
    duration: DurationFamily<Labels<N>>,
}

impl<const N: usize> Default for OutcomeMetrics<N> {
    fn default() -> Self {
        Self {
            total: Family::default(),
            failed: Family::default(),
            duration: Family::new_with_constructor(default_histogram),
        }
    }
}

impl<const N: usize> OutcomeMetrics<N> {
    /// Registers the three families under `name`, with upstream's help strings.
    fn register(&self, registry: &mut Registry, name: &str, [total, failed, duration]: [&str; 3]) {
        registry.register(name, total, self.total.clone());
        registry.register(format!("{name}_failed"), failed, self.failed.clone());
        let duration_name = format!("{name}_duration_seconds");
        registry.register(duration_name, duration, self.duration.clone());
    }

    fn succeeded_with(&self, labels: &Labels<N>, duration: Duration) {
        self.total.get_or_create(labels).inc();
        self.duration
            .get_or_create(labels)
            .observe(duration.as_secs_f64());
    }
}

/// `controller_persistentvolumeclaim_provision_*`, by `class` (the PVC's
/// `spec.storageClassName`) and `source` (its `spec.dataSource.kind`, or empty).
pub(crate) type ProvisionMetrics = OutcomeMetrics<2>;

fn claim_labels(class: &str, source: &str) -> Labels<2> {
    [("class", class.to_owned()), ("source", source.to_owned())]
}

impl ProvisionMetrics {
    /// A volume was provisioned for a claim in `duration` (from the first attempt).
    pub(crate) fn succeeded(&self, class: &str, source: &str, duration: Duration) {
        self.succeeded_with(&claim_labels(class, source), duration);
    }

    /// A provisioning attempt failed (it will be retried).
    pub(crate) fn failed(&self, class: &str, source: &str) {
        self.failed
            .get_or_create(&claim_labels(class, source))
            .inc();
    }
}

/// `controller_persistentvolume_delete_*`, by `class` (the PV's `spec.storageClassName`).
pub(crate) type DeleteMetrics = OutcomeMetrics<1>;

impl DeleteMetrics {
    /// A volume was deleted in `duration`.
    pub(crate) fn succeeded(&self, class: &str, duration: Duration) {
        self.succeeded_with(&[("class", class.to_owned())], duration);
    }

    /// A deletion attempt failed (it will be retried).
    pub(crate) fn failed(&self, class: &str) {
        self.failed
            .get_or_create(&[("class", class.to_owned())])
            .inc();
    }
}

/// Work that is pending right now (ours; upstream has no such gauges): what an operator alerts on
/// when it does not come down. Counted from the caches when scraped ([`Metrics::on_scrape`]).
#[derive(Debug, Clone, Default)]
pub(crate) struct BacklogMetrics {
    /// `csi_provisioner_claims_with_intent`.
    pub(crate) claims_with_intent: Gauge,
    /// `csi_provisioner_volumes_awaiting_deletion`.
    pub(crate) volumes_awaiting_deletion: Gauge,
    /// Entries of the intent ledger, kept current by the ledger; added to
    /// `csi_provisioner_claims_with_intent` when scraped.
    pub(crate) ledger_intents: std::sync::Arc<std::sync::atomic::AtomicI64>,
}

/// How long a PV may stay Released or Terminating before it counts as stuck.
pub(crate) const STUCK_AFTER: std::time::Duration = std::time::Duration::from_secs(10 * 60);

/// Claim-to-Bound buckets, in seconds: from one second to an hour.
const CLAIM_TO_BOUND_BUCKETS: [f64; 12] = [
    0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 900.0, 3600.0,
];

/// What operators alert on and upstream lacks (ours): latency as users see it, work waiting, and
/// volumes that do not move.
#[derive(Debug, Clone)]
pub(crate) struct OperatorMetrics {
    /// `csi_provisioner_claim_to_bound_seconds`: from a claim's creation until it was seen Bound
    /// to the PV this process created, retries included.
    pub claim_to_bound: Histogram,
    /// `csi_provisioner_claims_pending`: claims of the driver not bound yet (counted at scrape).
    pub claims_pending: Gauge,
    /// `csi_provisioner_retries_total`: reconciles that failed and were queued again, by
    /// `controller` (`provisioning` or `deletion`).
    pub retries: Family<OneLabel, Counter>,
    /// `csi_provisioner_volumes_stuck`: PVs of the driver Released or Terminating for longer than
    /// [`STUCK_AFTER`] (counted at scrape), by `state` (`Released` or `Terminating`).
    pub volumes_stuck: Family<OneLabel, Gauge>,
    /// `csi_provisioner_intent_volumes_kept_total`: volumes of abandoned provisionings kept
    /// because whether the user chose to keep them could not be told.
    pub intent_volumes_kept: Counter,
    /// `csi_provisioner_rbac_missing_permissions`: what the start-up RBAC self-check found
    /// missing (`/healthz/rbac` names them), so an alert needs no probe of its own.
    pub rbac_missing: Gauge,
}

impl Default for OperatorMetrics {
    fn default() -> Self {
        Self {
            claim_to_bound: Histogram::new(CLAIM_TO_BOUND_BUCKETS),
            claims_pending: Gauge::default(),
            retries: Family::default(),
            volumes_stuck: Family::default(),
            intent_volumes_kept: Counter::default(),
            rbac_missing: Gauge::default(),
        }
    }
}

impl OperatorMetrics {
    /// One failed reconcile of `controller`, queued again.
    pub(crate) fn retried(&self, controller: &str) {
        let labels = [("controller", controller.to_owned())];
        self.retries.get_or_create(&labels).inc();
    }

    /// Sets the stuck-volume gauge of `state`.
    pub(crate) fn set_stuck(&self, state: &str, count: i64) {
        let labels = [("state", state.to_owned())];
        self.volumes_stuck.get_or_create(&labels).set(count);
    }
}

/// client_golang's `promhttp.InstrumentMetricHandler` families, which upstream serves.
#[derive(Debug, Clone, Default)]
struct HandlerMetrics {
    /// By `code`, the HTTP status.
    requests: Family<OneLabel, Counter>,
    in_flight: Gauge,
}

/// The process's metrics: the registry and the handles of the families registered here.
pub(crate) struct Metrics {
    registry: Registry,
    /// PVC provisioning outcomes.
    pub(crate) provision: ProvisionMetrics,
    /// PV deletion outcomes.
    pub(crate) delete: DeleteMetrics,
    /// Pending work, counted at scrape time.
    pub backlog: BacklogMetrics,
    /// Latency, retries and stuck volumes.
    pub operator: OperatorMetrics,
    /// `registered_metrics_total`: what [`Metrics::registrar`] and [`Metrics::count_registered`] count.
    meta: MetaMetrics,
    handler: HandlerMetrics,
    /// Runs before each scrape (refreshes gauges counted from the caches).
    before_scrape: OnceLock<Box<dyn Fn() + Send + Sync>>,
}

impl Metrics {
    /// A registry with the provisioning and deletion families registered, and those every
    /// upstream scrape shows: meta, process and metrics-handler families (the work queues register
    /// their own, `runtime::queue`).
    pub(crate) fn new() -> Self {
        let mut registry = Registry::default();
        let meta = MetaMetrics::register(&mut registry);
        registry.register_collector(Box::new(ProcessCollector));
        let handler = HandlerMetrics::default();
        registry.register(
            "promhttp_metric_handler_requests",
            "Total number of scrapes by HTTP status code.",
            handler.requests.clone(),
        );
        registry.register(
            "promhttp_metric_handler_requests_in_flight",
            "Current number of scrapes being served.",
            handler.in_flight.clone(),
        );
        // client_golang creates these three codes up front.
        for code in ["200", "500", "503"] {
            let _ = handler.requests.get_or_create(&[("code", code.to_owned())]);
        }
        let provision = ProvisionMetrics::default();
        let delete = DeleteMetrics::default();
        // Help strings are upstream's, byte for byte ("succesfully" included): dashboards and
        // alerts may show them.
        provision.register(
            &mut registry,
            "controller_persistentvolumeclaim_provision",
            [
                "Total number of persistent volumes provisioned succesfully. Broken down by storage class name and source of the claim.",
                "Total number of persistent volume provision failed attempts. Broken down by storage class name and source of the claim.",
                "Latency in seconds to provision persistent volumes. Failed provisioning attempts are ignored. Broken down by storage class name and source of the claim.",
            ],
        );
        delete.register(
            &mut registry,
            "controller_persistentvolume_delete",
            [
                "Total number of persistent volumes deleted succesfully. Broken down by storage class name.",
                "Total number of persistent volume delete failed attempts. Broken down by storage class name.",
                "Latency in seconds to delete persistent volumes. Failed deletion attempts are ignored. Broken down by storage class name.",
            ],
        );
        let backlog = BacklogMetrics::default();
        registry.register(
            "csi_provisioner_claims_with_intent",
            "Volumes a CreateVolume may have created that have no PV yet (in progress, or the volume of a deleted claim not yet deleted again): entries of the intent ledger plus claims carrying the provisioning-intent finalizer.",
            backlog.claims_with_intent.clone(),
        );
        registry.register(
            "csi_provisioner_volumes_awaiting_deletion",
            "PVs of this driver with reclaim policy Delete whose backend volume is still to be deleted: released, failed, or being deleted.",
            backlog.volumes_awaiting_deletion.clone(),
        );
        let operator = OperatorMetrics::default();
        registry.register(
            "csi_provisioner_claim_to_bound_seconds",
            "Seconds from a claim's creation until it was seen Bound to the PV this sidecar created for it, retries included.",
            operator.claim_to_bound.clone(),
        );
        registry.register(
            "csi_provisioner_claims_pending",
            "Claims of this driver that are not bound yet (provisioning backlog).",
            operator.claims_pending.clone(),
        );
        registry.register(
            "csi_provisioner_retries",
            "Reconciles that failed and were queued again with backoff, by controller.",
            operator.retries.clone(),
        );
        registry.register(
            "csi_provisioner_volumes_stuck",
            "PVs of this driver Released or Terminating for longer than 10 minutes.",
            operator.volumes_stuck.clone(),
        );
        registry.register(
            "csi_provisioner_intent_volumes_kept",
            "Volumes of abandoned provisionings kept instead of deleted because whether the user chose to keep them could not be told (a Retain class's volume whose claim and PV are both gone after a restart, or an entry with neither a volume id nor a request to find it by); csi-provisioner audit lists them as volumes without a PV.",
            operator.intent_volumes_kept.clone(),
        );
        registry.register(
            "csi_provisioner_rbac_missing_permissions",
            "Permissions this configuration needs that the start-up RBAC self-check found missing (0 when all are granted or the check could not run); /healthz/rbac lists them.",
            operator.rbac_missing.clone(),
        );
        Self {
            registry,
            provision,
            delete,
            backlog,
            operator,
            meta,
            handler,
            before_scrape: OnceLock::new(),
        }
    }

    /// Sets what runs before every scrape, once the caches it counts from exist (later calls are
    /// ignored: there is one set of caches per process).
    pub(crate) fn on_scrape(&self, refresh: impl Fn() + Send + Sync + 'static) {
        let _ = self.before_scrape.set(Box::new(refresh));
    }

    /// The registry, for other modules to register their families at start-up.
    pub(crate) fn registry_mut(&mut self) -> &mut Registry {
        &mut self.registry
    }

    /// Registers families with a stability level (their help prefixed, counted in
    /// `registered_metrics_total`), for a module owning its families, as `runtime::queue` does.
    pub(crate) fn registrar(&mut self) -> Registrar<'_> {
        Registrar::new(&mut self.registry, &self.meta)
    }

    /// Counts a registration made through [`Metrics::registry_mut`] of a family upstream
    /// registers with component-base's `stability` (its help carries the `[LEVEL] ` prefix).
    pub(crate) fn count_registered(&self, stability: Stability, families: u64) {
        self.meta.count(stability, families);
    }

    /// Every family in `format`, sorted by name.
    pub(crate) fn encode(&self, format: Format) -> Result<String, std::fmt::Error> {
        if let Some(refresh) = self.before_scrape.get() {
            refresh();
        }
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)?;
        Ok(render(&out, format))
    }

    /// One scrape of the metrics endpoint: [`Metrics::encode`], counted in the `promhttp_*`
    /// families as client_golang counts it (in flight while encoding, by status code once done).
    pub(crate) fn scrape(&self, format: Format) -> Result<String, std::fmt::Error> {
        self.handler.in_flight.inc();
        let body = self.encode(format);
        self.handler.in_flight.dec();
        let code = if body.is_ok() { "200" } else { "500" };
        let labels = [("code", code.to_owned())];
        self.handler.requests.get_or_create(&labels).inc();
        body
    }
}

#[cfg(test)]
#[path = "metrics_tests.rs"]
mod tests;
