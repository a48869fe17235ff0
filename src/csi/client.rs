//! CSI calls over a gRPC channel: the `--timeout` deadline, redacted debug logs and the operations
//! metric on every call, behind the narrow [`CsiController`] trait the controllers depend on.
//!
//! [`OperationMetrics`] is `csi_sidecar_operations_seconds`: the duration of every CSI call,
//! labelled as upstream's csi-lib-utils does.

use std::error::Error as _;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use tokio::time::Instant;
use tonic::transport::Channel;
use tonic::{Code, Status};
use tracing::debug;

use super::redact::{Redact, redacted};
use super::v1;
use super::v1::controller_client::ControllerClient;
use super::v1::identity_client::IdentityClient;
use super::v1::node_client::NodeClient;
use crate::metrics::OneLabel;

/// Result of one CSI call. Failures are always a gRPC [`Status`], even transport failures
/// (code `Unavailable`) and our own deadline (code `DeadlineExceeded`), so callers classify one type.
pub type CsiResult<T> = Result<T, Status>;

/// Boxed future of a CSI call, so [`CsiController`] stays object safe.
pub type CsiFuture<'a, T> = Pin<Box<dyn Future<Output = CsiResult<T>> + Send + 'a>>;

/// Full gRPC method names, as they appear in the `method_name` metric label and in logs.
pub mod method {
    /// `Identity.Probe`.
    pub const PROBE: &str = "/csi.v1.Identity/Probe";
    /// `Identity.GetPluginInfo`.
    pub const GET_PLUGIN_INFO: &str = "/csi.v1.Identity/GetPluginInfo";
    /// `Identity.GetPluginCapabilities`.
    pub const GET_PLUGIN_CAPABILITIES: &str = "/csi.v1.Identity/GetPluginCapabilities";
    /// `Controller.CreateVolume`.
    pub const CREATE_VOLUME: &str = "/csi.v1.Controller/CreateVolume";
    /// `Controller.DeleteVolume`.
    pub const DELETE_VOLUME: &str = "/csi.v1.Controller/DeleteVolume";
    /// `Controller.GetCapacity`.
    pub const GET_CAPACITY: &str = "/csi.v1.Controller/GetCapacity";
    /// `Controller.ListVolumes`.
    pub const LIST_VOLUMES: &str = "/csi.v1.Controller/ListVolumes";
    /// `Controller.ControllerGetCapabilities`.
    pub const CONTROLLER_GET_CAPABILITIES: &str = "/csi.v1.Controller/ControllerGetCapabilities";
    /// `Node.NodeGetInfo`.
    pub const NODE_GET_INFO: &str = "/csi.v1.Node/NodeGetInfo";
}

/// The Controller-service calls the provisioner makes, implemented by [`GrpcCsi`] (the end-to-end
/// tests run it against the mock driver on a real socket). Object safe: hold it as
/// `Arc<dyn CsiController>`, so a test double can stand in for the driver.
pub trait CsiController: Send + Sync {
    /// `CreateVolume`; `migrated`: for an in-tree volume our driver took over (the `migrated`
    /// label of its observation, as upstream marks the call).
    fn create_volume(
        &self,
        request: v1::CreateVolumeRequest,
        migrated: bool,
    ) -> CsiFuture<'_, v1::CreateVolumeResponse>;
    /// `DeleteVolume`; `migrated` as for `create_volume`.
    fn delete_volume(
        &self,
        request: v1::DeleteVolumeRequest,
        migrated: bool,
    ) -> CsiFuture<'_, v1::DeleteVolumeResponse>;
    /// `GetCapacity`.
    fn get_capacity(
        &self,
        request: v1::GetCapacityRequest,
    ) -> CsiFuture<'_, v1::GetCapacityResponse>;
    /// `ListVolumes`.
    fn list_volumes(
        &self,
        request: v1::ListVolumesRequest,
    ) -> CsiFuture<'_, v1::ListVolumesResponse>;
    /// `ControllerGetCapabilities`.
    fn controller_get_capabilities(&self) -> CsiFuture<'_, v1::ControllerGetCapabilitiesResponse>;
}

/// CSI over a tonic [`Channel`]. Cheap to clone; clones share the connection.
#[derive(Clone, Debug)]
pub struct GrpcCsi {
    channel: Channel,
    timeout: Duration,
    metrics: OperationMetrics,
}

impl GrpcCsi {
    /// `timeout` is `--timeout`: every call gets it as its gRPC deadline and is cut off after it.
    pub fn new(channel: Channel, timeout: Duration, metrics: OperationMetrics) -> Self {
        Self {
            channel,
            timeout,
            metrics,
        }
    }

    /// `Identity.Probe`.
    pub async fn probe(&self) -> CsiResult<v1::ProbeResponse> {
        self.unary(
            method::PROBE,
            v1::ProbeRequest {},
            |channel, request| async move { IdentityClient::new(channel).probe(request).await },
            false,
        )
        .await
    }

    /// `Identity.GetPluginInfo`.
    pub async fn get_plugin_info(&self) -> CsiResult<v1::GetPluginInfoResponse> {
        self.unary(
            method::GET_PLUGIN_INFO,
            v1::GetPluginInfoRequest {},
            |channel, request| async move {
                IdentityClient::new(channel).get_plugin_info(request).await
            },
            false,
        )
        .await
    }

    /// `Identity.GetPluginCapabilities`.
    pub async fn get_plugin_capabilities(&self) -> CsiResult<v1::GetPluginCapabilitiesResponse> {
        self.unary(
            method::GET_PLUGIN_CAPABILITIES,
            v1::GetPluginCapabilitiesRequest {},
            |channel, request| async move {
                IdentityClient::new(channel)
                    .get_plugin_capabilities(request)
                    .await
            },
            false,
        )
        .await
    }

    /// `Node.NodeGetInfo`.
    pub async fn node_get_info(&self) -> CsiResult<v1::NodeGetInfoResponse> {
        self.unary(
            method::NODE_GET_INFO,
            v1::NodeGetInfoRequest {},
            |channel, request| async move { NodeClient::new(channel).node_get_info(request).await },
            false,
        )
        .await
    }

    /// One unary call with everything every call needs: deadline, logs, metric. `migrated`: the
    /// call is for a migrated in-tree volume (only CreateVolume and DeleteVolume can be).
    async fn unary<Req, Resp, Call, Fut>(
        &self,
        method: &'static str,
        request: Req,
        call: Call,
        migrated: bool,
    ) -> CsiResult<Resp>
    where
        Req: Redact + Send,
        Resp: Redact + Send,
        Call: FnOnce(Channel, tonic::Request<Req>) -> Fut + Send,
        Fut: Future<Output = Result<tonic::Response<Resp>, Status>> + Send,
    {
        debug!(method, "GRPC call: {method}");
        debug!(method, "GRPC request: {}", redacted(&request));

        let mut request = tonic::Request::new(request);
        // Sent as grpc-timeout so the driver knows the deadline, as grpc-go does with a context deadline.
        request.set_timeout(self.timeout);
        let started = Instant::now();
        let _in_flight = self.metrics.start(method);
        // Our own bound as well: the header alone does not stop a call whose connection hangs.
        let result =
            match tokio::time::timeout(self.timeout, call(self.channel.clone(), request)).await {
                Ok(result) => result.map(tonic::Response::into_inner),
                Err(_elapsed) => Err(deadline_exceeded(method, self.timeout)),
            };
        let elapsed = started.elapsed();
        let result = result.map_err(|status| normalize(method, status, elapsed, self.timeout));

        let code = result.as_ref().map_or_else(Status::code, |_| Code::Ok);
        self.metrics
            .observe(method, Outcome::Code(code), elapsed, migrated);

        match &result {
            Ok(response) => debug!(method, ?elapsed, "GRPC response: {}", redacted(response)),
            Err(status) => debug!(
                method,
                ?elapsed,
                code = ?status.code(),
                "GRPC error: {}",
                status.message()
            ),
        }
        result
    }
}

/// Largest CreateVolume or ListVolumes answer read (gRPC's default is 4 MiB).
const MAX_ANSWER_BYTES: usize = 64 << 20;

impl CsiController for GrpcCsi {
    fn create_volume(
        &self,
        request: v1::CreateVolumeRequest,
        migrated: bool,
    ) -> CsiFuture<'_, v1::CreateVolumeResponse> {
        Box::pin(self.unary(
            method::CREATE_VOLUME,
            request,
            |channel, request| async move {
                // Read any sane answer, even one too large to record: rejecting it then deletes
                // the volume; failing to decode it would leave a volume nobody knows the id of.
                ControllerClient::new(channel)
                    .max_decoding_message_size(MAX_ANSWER_BYTES)
                    .create_volume(request)
                    .await
            },
            migrated,
        ))
    }

    fn delete_volume(
        &self,
        request: v1::DeleteVolumeRequest,
        migrated: bool,
    ) -> CsiFuture<'_, v1::DeleteVolumeResponse> {
        Box::pin(self.unary(
            method::DELETE_VOLUME,
            request,
            |channel, request| async move {
                ControllerClient::new(channel).delete_volume(request).await
            },
            migrated,
        ))
    }

    fn get_capacity(
        &self,
        request: v1::GetCapacityRequest,
    ) -> CsiFuture<'_, v1::GetCapacityResponse> {
        Box::pin(
            self.unary(
                method::GET_CAPACITY,
                request,
                |channel, request| async move {
                    ControllerClient::new(channel).get_capacity(request).await
                },
                false,
            ),
        )
    }

    fn list_volumes(
        &self,
        request: v1::ListVolumesRequest,
    ) -> CsiFuture<'_, v1::ListVolumesResponse> {
        Box::pin(self.unary(
            method::LIST_VOLUMES,
            request,
            |channel, request| async move {
                ControllerClient::new(channel)
                    .max_decoding_message_size(MAX_ANSWER_BYTES)
                    .list_volumes(request)
                    .await
            },
            false,
        ))
    }

    fn controller_get_capabilities(&self) -> CsiFuture<'_, v1::ControllerGetCapabilitiesResponse> {
        Box::pin(self.unary(
            method::CONTROLLER_GET_CAPABILITIES,
            v1::ControllerGetCapabilitiesRequest {},
            |channel, request| async move {
                ControllerClient::new(channel)
                    .controller_get_capabilities(request)
                    .await
            },
            false,
        ))
    }
}

/// Our deadline, reported the way grpc-go reports an expired context, so error classification and
/// the metric see what upstream sees.
fn deadline_exceeded(method: &str, timeout: Duration) -> Status {
    Status::deadline_exceeded(format!(
        "{method} did not finish within {timeout:?} (--timeout); the driver may still be working on it"
    ))
}

/// Turns tonic's local failures into the statuses upstream would see:
/// - tonic's own timer (it also enforces the grpc-timeout we set) answers `Cancelled`; any expiry at
///   or after our deadline becomes our `DeadlineExceeded`;
/// - transport failures (socket gone, connection reset) become `Unavailable` with the cause spelled out.
///
/// Statuses the driver sent are returned untouched.
fn normalize(method: &str, status: Status, elapsed: Duration, timeout: Duration) -> Status {
    let expired =
        matches!(status.code(), Code::Cancelled | Code::DeadlineExceeded) && elapsed >= timeout;
    if expired {
        return deadline_exceeded(method, timeout);
    }
    // Only locally generated statuses carry a source error; a driver's status comes off the wire.
    match status.source() {
        Some(cause) => Status::unavailable(format!(
            "{method}: cannot reach the CSI driver: {}",
            super::connect::describe_error(cause)
        )),
        None => status,
    }
}

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
#[path = "client_tests.rs"]
mod tests;
