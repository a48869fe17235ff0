//! `csi_sidecar_operations_seconds`: the duration of every CSI call, labelled as upstream's csi-lib-utils does.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::metrics::OneLabel;

/// Metric name exactly as upstream exposes it (subsystem `csi_sidecar`, name `operations_seconds`).
pub const OPERATIONS_SECONDS: &str = "csi_sidecar_operations_seconds";

const HELP: &str =
    "[ALPHA] Container Storage Interface operation duration with gRPC error code status total";

/// Upstream's bucket boundaries, in seconds.
pub const BUCKETS: [f64; 13] = [
    0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0, 25.0, 50.0, 120.0, 300.0, 600.0,
];

/// Label value for a failure that carries no gRPC status at all.
pub const NON_GRPC: &str = "unknown-non-grpc";

/// The labels of one series, in alphabetical order so the exposition reads like Go's client,
/// which sorts labels: `driver_name`, `grpc_status_code`, `method_name`, and `migrated` only for
/// a driver that took over an in-tree plugin (as upstream's `WithMigration`).
type OperationLabels = Vec<(&'static str, String)>;

type Histograms = Family<OperationLabels, Histogram, fn() -> Histogram>;

fn new_histogram() -> Histogram {
    Histogram::new(BUCKETS)
}

/// `csi_provisioner_csi_calls_in_flight` (ours): CSI calls sent and not answered yet, per method.
pub const IN_FLIGHT: &str = "csi_provisioner_csi_calls_in_flight";

/// A clone-able handle on the operations histogram. Clones share the family and the driver name.
#[derive(Clone, Debug)]
pub struct OperationMetrics {
    histograms: Histograms,
    /// By `method_name`.
    in_flight: Family<OneLabel, Gauge>,
    // Unknown until GetPluginInfo answers; calls before that (Probe) are labelled "", as upstream.
    driver_name: Arc<RwLock<String>>,
    /// The driver took over an in-tree plugin: series carry `migrated`.
    migratable: Arc<std::sync::atomic::AtomicBool>,
}

impl Default for OperationMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl OperationMetrics {
    /// A handle not attached to any registry (observations are kept but never exposed).
    pub fn new() -> Self {
        Self {
            histograms: Family::new_with_constructor(new_histogram as fn() -> Histogram),
            in_flight: Family::default(),
            driver_name: Arc::default(),
            migratable: Arc::default(),
        }
    }

    /// Creates the histogram and registers it in `registry` under its upstream name.
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self::new();
        registry.register(OPERATIONS_SECONDS, HELP, metrics.histograms.clone());
        registry.register(
            IN_FLIGHT,
            "CSI calls sent to the driver and not answered yet, by method (a CreateVolume or DeleteVolume stuck in the driver shows here).",
            metrics.in_flight.clone(),
        );
        metrics
    }

    /// Counts a call of `method` as in flight until the returned guard drops.
    pub fn start(&self, method: &str) -> InFlight {
        let gauge = self
            .in_flight
            .get_or_create(&[("method_name", method.to_owned())]);
        gauge.inc();
        InFlight(gauge.clone())
    }

    /// Sets the `driver_name` label for later observations (called once the driver told its name).
    pub fn set_driver_name(&self, name: &str) {
        let mut guard = crate::sync::write(&self.driver_name);
        name.clone_into(&mut guard);
        self.migratable.store(
            crate::migration::Plugin::of_driver(name).is_some(),
            std::sync::atomic::Ordering::Relaxed,
        );
    }

    /// The current `driver_name` label value.
    pub fn driver_name(&self) -> String {
        crate::sync::read(&self.driver_name).clone()
    }

    /// Records one finished call. `method` is the full gRPC path (`/csi.v1.Controller/CreateVolume`);
    /// `migrated`: the call was for a migrated in-tree volume (labelled for a migratable driver).
    pub fn observe(&self, method: &str, outcome: Outcome, elapsed: Duration, migrated: bool) {
        let mut labels: OperationLabels = vec![
            ("driver_name", self.driver_name()),
            ("grpc_status_code", outcome.label().to_owned()),
            ("method_name", method.to_owned()),
        ];
        if self.migratable.load(std::sync::atomic::Ordering::Relaxed) {
            labels.push(("migrated", migrated.to_string()));
        }
        self.histograms
            .get_or_create(&labels)
            .observe(elapsed.as_secs_f64());
    }
}

/// A CSI call in flight; dropping it (answered, failed or cancelled) takes it off the gauge.
#[derive(Debug)]
pub struct InFlight(Gauge);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// How a call ended, for the `grpc_status_code` label.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// A gRPC status code (`Ok` for success).
    Code(tonic::Code),
    /// The failure carried no gRPC status.
    NonGrpc,
}

impl Outcome {
    /// The label value: the code name as Go's `codes.Code.String()` prints it, or `unknown-non-grpc`.
    pub fn label(self) -> &'static str {
        match self {
            Outcome::Code(code) => go_code_name(code),
            Outcome::NonGrpc => NON_GRPC,
        }
    }
}

/// gRPC code names spelled as grpc-go prints them (note `Canceled` with one `l`), so dashboards and
/// alerts written for upstream keep matching.
pub fn go_code_name(code: tonic::Code) -> &'static str {
    use tonic::Code;
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "Canceled",
        Code::Unknown => "Unknown",
        Code::InvalidArgument => "InvalidArgument",
        Code::DeadlineExceeded => "DeadlineExceeded",
        Code::NotFound => "NotFound",
        Code::AlreadyExists => "AlreadyExists",
        Code::PermissionDenied => "PermissionDenied",
        Code::ResourceExhausted => "ResourceExhausted",
        Code::FailedPrecondition => "FailedPrecondition",
        Code::Aborted => "Aborted",
        Code::OutOfRange => "OutOfRange",
        Code::Unimplemented => "Unimplemented",
        Code::Internal => "Internal",
        Code::Unavailable => "Unavailable",
        Code::DataLoss => "DataLoss",
        Code::Unauthenticated => "Unauthenticated",
    }
}

#[cfg(test)]
#[path = "metrics_tests.rs"]
mod tests;
