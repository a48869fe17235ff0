//! The CSI connection against an in-test gRPC driver on a temporary Unix socket: waiting for a late
//! socket, Probe readiness, deadlines, reconnect after a driver restart, secret redaction in logs,
//! the provisioning capability check and the operations metric.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use csi_provisioner::csi::v1::{
    self,
    controller_server::{Controller, ControllerServer},
    identity_server::{Identity, IdentityServer},
    node_server::{Node, NodeServer},
};
use csi_provisioner::csi::{
    ConnectOptions, CsiController, Endpoint, GrpcCsi, HandshakeError, HandshakeOptions,
    OperationMetrics, connect, handshake,
};
use prometheus_client::registry::Registry;
use tokio::net::UnixListener;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::transport::{Channel, Server};
use tonic::{Code, Request, Response, Status};

const DRIVER_NAME: &str = "test.csi.example.com";
/// Upper bound for anything we wait on; generous because CI machines are slow and shared.
const PATIENCE: Duration = Duration::from_secs(20);

// === The in-test driver ===

/// What the test driver answers; shared with the test so it can steer and inspect.
struct Knobs {
    /// How many Probe calls answer ready=false before the driver is ready.
    not_ready_probes: AtomicUsize,
    probe_calls: AtomicUsize,
    /// Probe answers this error instead (a broken driver).
    probe_error: Mutex<Option<(Code, String)>>,
    plugin_services: Mutex<Vec<v1::plugin_capability::service::Type>>,
    controller_rpcs: Mutex<Vec<v1::controller_service_capability::rpc::Type>>,
    controller_capability_calls: AtomicUsize,
    /// CreateVolume never answers.
    create_hangs: AtomicBool,
    /// CreateVolume answers this error.
    create_error: Mutex<Option<(Code, String)>>,
    /// Secrets the driver received, to prove they were really sent.
    received_secrets: Mutex<Vec<HashMap<String, String>>>,
}

impl Default for Knobs {
    fn default() -> Self {
        use v1::controller_service_capability::rpc::Type as Rpc;
        use v1::plugin_capability::service::Type as Service;
        Self {
            not_ready_probes: AtomicUsize::new(0),
            probe_calls: AtomicUsize::new(0),
            probe_error: Mutex::new(None),
            plugin_services: Mutex::new(vec![
                Service::ControllerService,
                Service::VolumeAccessibilityConstraints,
            ]),
            controller_rpcs: Mutex::new(vec![Rpc::CreateDeleteVolume, Rpc::GetCapacity]),
            controller_capability_calls: AtomicUsize::new(0),
            create_hangs: AtomicBool::new(false),
            create_error: Mutex::new(None),
            received_secrets: Mutex::new(Vec::new()),
        }
    }
}

#[derive(Clone)]
struct Driver(Arc<Knobs>);

fn unimplemented<T>(method: &str) -> Result<Response<T>, Status> {
    Err(Status::unimplemented(format!(
        "{method} is not implemented by the test driver"
    )))
}

/// Writes a tonic service impl whose listed methods answer Unimplemented. The attribute is applied
/// after expansion, so async-trait sees every method.
macro_rules! service_impl {
    ($trait:ident { $($custom:item)* } unimplemented { $($name:ident($req:ident) -> $resp:ident),* $(,)? }) => {
        #[tonic::async_trait]
        impl $trait for Driver {
            $($custom)*
            $(async fn $name(&self, _: Request<v1::$req>) -> Result<Response<v1::$resp>, Status> {
                unimplemented(stringify!($name))
            })*
        }
    };
}

service_impl!(Identity {
    async fn get_plugin_info(&self, _: Request<v1::GetPluginInfoRequest>) -> Result<Response<v1::GetPluginInfoResponse>, Status> {
        Ok(Response::new(v1::GetPluginInfoResponse {
            name: DRIVER_NAME.into(),
            vendor_version: "v1.2.3".into(),
            manifest: HashMap::from([("commit".into(), "abc".into())]),
        }))
    }

    async fn get_plugin_capabilities(&self, _: Request<v1::GetPluginCapabilitiesRequest>) -> Result<Response<v1::GetPluginCapabilitiesResponse>, Status> {
        let capabilities = self.0.plugin_services.lock().unwrap().iter().map(|t| v1::PluginCapability {
            r#type: Some(v1::plugin_capability::Type::Service(v1::plugin_capability::Service { r#type: *t as i32 })),
        }).collect();
        Ok(Response::new(v1::GetPluginCapabilitiesResponse { capabilities }))
    }

    async fn probe(&self, _: Request<v1::ProbeRequest>) -> Result<Response<v1::ProbeResponse>, Status> {
        self.0.probe_calls.fetch_add(1, Ordering::SeqCst);
        if let Some((code, message)) = self.0.probe_error.lock().unwrap().clone() {
            return Err(Status::new(code, message));
        }
        let not_ready = self.0.not_ready_probes.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok();
        Ok(Response::new(v1::ProbeResponse { ready: Some(!not_ready) }))
    }
} unimplemented {});

service_impl!(Controller {
    async fn create_volume(&self, request: Request<v1::CreateVolumeRequest>) -> Result<Response<v1::CreateVolumeResponse>, Status> {
        let request = request.into_inner();
        self.0.received_secrets.lock().unwrap().push(request.secrets.clone());
        if self.0.create_hangs.load(Ordering::SeqCst) {
            std::future::pending::<()>().await;
        }
        if let Some((code, message)) = self.0.create_error.lock().unwrap().clone() {
            return Err(Status::new(code, message));
        }
        Ok(Response::new(v1::CreateVolumeResponse {
            volume: Some(v1::Volume { volume_id: format!("vol-{}", request.name), capacity_bytes: 1 << 30, ..Default::default() }),
        }))
    }

    async fn delete_volume(&self, request: Request<v1::DeleteVolumeRequest>) -> Result<Response<v1::DeleteVolumeResponse>, Status> {
        self.0.received_secrets.lock().unwrap().push(request.into_inner().secrets);
        Ok(Response::new(v1::DeleteVolumeResponse {}))
    }

    async fn controller_get_capabilities(&self, _: Request<v1::ControllerGetCapabilitiesRequest>) -> Result<Response<v1::ControllerGetCapabilitiesResponse>, Status> {
        self.0.controller_capability_calls.fetch_add(1, Ordering::SeqCst);
        let capabilities = self.0.controller_rpcs.lock().unwrap().iter().map(|t| v1::ControllerServiceCapability {
            r#type: Some(v1::controller_service_capability::Type::Rpc(v1::controller_service_capability::Rpc { r#type: *t as i32 })),
        }).collect();
        Ok(Response::new(v1::ControllerGetCapabilitiesResponse { capabilities }))
    }
} unimplemented {
    controller_publish_volume(ControllerPublishVolumeRequest) -> ControllerPublishVolumeResponse,
    controller_unpublish_volume(ControllerUnpublishVolumeRequest) -> ControllerUnpublishVolumeResponse,
    validate_volume_capabilities(ValidateVolumeCapabilitiesRequest) -> ValidateVolumeCapabilitiesResponse,
    list_volumes(ListVolumesRequest) -> ListVolumesResponse,
    get_capacity(GetCapacityRequest) -> GetCapacityResponse,
    create_snapshot(CreateSnapshotRequest) -> CreateSnapshotResponse,
    delete_snapshot(DeleteSnapshotRequest) -> DeleteSnapshotResponse,
    list_snapshots(ListSnapshotsRequest) -> ListSnapshotsResponse,
    get_snapshot(GetSnapshotRequest) -> GetSnapshotResponse,
    controller_expand_volume(ControllerExpandVolumeRequest) -> ControllerExpandVolumeResponse,
    controller_get_volume(ControllerGetVolumeRequest) -> ControllerGetVolumeResponse,
    controller_modify_volume(ControllerModifyVolumeRequest) -> ControllerModifyVolumeResponse,
});

service_impl!(Node {
    async fn node_get_info(&self, _: Request<v1::NodeGetInfoRequest>) -> Result<Response<v1::NodeGetInfoResponse>, Status> {
        Ok(Response::new(v1::NodeGetInfoResponse {
            node_id: "node-1".into(),
            max_volumes_per_node: 16,
            accessible_topology: Some(v1::Topology { segments: HashMap::from([("topology.example.com/zone".into(), "zone-a".into())]) }),
        }))
    }
} unimplemented {
    node_stage_volume(NodeStageVolumeRequest) -> NodeStageVolumeResponse,
    node_unstage_volume(NodeUnstageVolumeRequest) -> NodeUnstageVolumeResponse,
    node_publish_volume(NodePublishVolumeRequest) -> NodePublishVolumeResponse,
    node_unpublish_volume(NodeUnpublishVolumeRequest) -> NodeUnpublishVolumeResponse,
    node_get_volume_stats(NodeGetVolumeStatsRequest) -> NodeGetVolumeStatsResponse,
    node_expand_volume(NodeExpandVolumeRequest) -> NodeExpandVolumeResponse,
    node_get_capabilities(NodeGetCapabilitiesRequest) -> NodeGetCapabilitiesResponse,
});

/// A driver process stand-in: serves on `path` until stopped.
struct RunningDriver {
    stop: oneshot::Sender<()>,
    task: JoinHandle<Result<(), tonic::transport::Error>>,
}

fn serve(path: &Path, knobs: &Arc<Knobs>) -> RunningDriver {
    // A restarted driver re-creates its socket, as real drivers do.
    let _ = std::fs::remove_file(path);
    let incoming = UnixListenerStream::new(UnixListener::bind(path).unwrap());
    let driver = Driver(knobs.clone());
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(
        Server::builder()
            .add_service(IdentityServer::new(driver.clone()))
            .add_service(ControllerServer::new(driver.clone()))
            .add_service(NodeServer::new(driver))
            .serve_with_incoming_shutdown(incoming, async {
                let _ = stopped.await;
            }),
    );
    RunningDriver { stop, task }
}

impl RunningDriver {
    /// Stops serving, closes its connections and removes the socket, like a driver that exits.
    async fn stop(self, path: &Path) {
        let _ = self.stop.send(());
        tokio::time::timeout(PATIENCE, self.task)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        std::fs::remove_file(path).unwrap();
    }
}

// === Helpers ===

struct Setup {
    _dir: tempfile::TempDir,
    socket: PathBuf,
    knobs: Arc<Knobs>,
    _stop: watch::Sender<bool>,
    shutdown: watch::Receiver<bool>,
}

fn setup() -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("csi.sock");
    let (stop, shutdown) = watch::channel(false);
    Setup {
        _dir: dir,
        socket,
        knobs: Arc::new(Knobs::default()),
        _stop: stop,
        shutdown,
    }
}

impl Setup {
    async fn connect(&self) -> Channel {
        let endpoint = Endpoint::parse(&format!("unix://{}", self.socket.display())).unwrap();
        tokio::time::timeout(
            PATIENCE,
            connect(endpoint, ConnectOptions::new(self.shutdown.clone())),
        )
        .await
        .expect("connect did not finish")
        .unwrap()
    }

    fn handshake_options(&self, metrics: OperationMetrics) -> HandshakeOptions {
        HandshakeOptions {
            metrics,
            probe_interval: Duration::from_millis(10),
            ..HandshakeOptions::new(Duration::from_secs(5), self.shutdown.clone())
        }
    }
}

/// Captures every log line (all targets, trace level) of the current thread. Tests using it run on
/// the current-thread runtime, so spawned tasks log here too.
#[derive(Clone, Default)]
struct LogCapture(Arc<Mutex<Vec<u8>>>);

impl LogCapture {
    fn install(&self) -> tracing::subscriber::DefaultGuard {
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::TRACE)
            .with_ansi(false)
            .with_writer(self.clone())
            .finish();
        tracing::subscriber::set_default(subscriber)
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }

    async fn wait_for(&self, needle: &str) {
        let deadline = tokio::time::Instant::now() + PATIENCE;
        while !self.text().contains(needle) {
            assert!(
                tokio::time::Instant::now() < deadline,
                "no log line with {needle:?} in:\n{}",
                self.text()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

impl Write for LogCapture {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for LogCapture {
    type Writer = LogCapture;

    fn make_writer(&'a self) -> Self::Writer {
        self.clone()
    }
}

fn create_request(name: &str, secret: &str) -> v1::CreateVolumeRequest {
    v1::CreateVolumeRequest {
        name: name.into(),
        parameters: HashMap::from([("type".into(), "fast".into())]),
        secrets: HashMap::from([("backend-password".into(), secret.into())]),
        ..Default::default()
    }
}

fn exposition(registry: &Registry) -> String {
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, registry).unwrap();
    text
}

// === Tests ===

#[tokio::test]
async fn waits_for_a_socket_that_appears_late_and_says_so() {
    let logs = LogCapture::default();
    let _guard = logs.install();
    let s = setup();
    let endpoint = Endpoint::parse(s.socket.to_str().unwrap()).unwrap();
    let waiting = tokio::spawn(connect(endpoint, ConnectOptions::new(s.shutdown.clone())));

    let expected = format!(
        "waiting for CSI driver socket {}: No such file or directory",
        s.socket.display()
    );
    logs.wait_for(&expected).await;
    assert!(
        !waiting.is_finished(),
        "connect must keep waiting while the socket is missing"
    );

    let _driver = serve(&s.socket, &s.knobs);
    let channel = tokio::time::timeout(PATIENCE, waiting)
        .await
        .expect("connect kept waiting")
        .unwrap()
        .unwrap();
    let csi = GrpcCsi::new(channel, Duration::from_secs(5), OperationMetrics::new());
    assert_eq!(csi.probe().await.unwrap().ready, Some(true));
}

#[tokio::test]
async fn handshake_probes_until_ready_then_reads_the_driver() {
    let logs = LogCapture::default();
    let _guard = logs.install();
    let s = setup();
    s.knobs.not_ready_probes.store(3, Ordering::SeqCst);
    let _driver = serve(&s.socket, &s.knobs);

    let info = handshake(
        s.connect().await,
        s.handshake_options(OperationMetrics::new()),
    )
    .await
    .unwrap();

    assert_eq!(
        s.knobs.probe_calls.load(Ordering::SeqCst),
        4,
        "three not-ready answers, then ready"
    );
    assert!(
        logs.text()
            .contains("waiting for CSI driver to become ready: Probe answered ready=false")
    );
    assert_eq!(info.name, DRIVER_NAME);
    assert_eq!(info.vendor_version, "v1.2.3");
    assert_eq!(info.manifest["commit"], "abc");
    assert!(info.plugin.controller_service && info.supports_topology());
    assert!(info.controller.create_delete_volume && info.controller.get_capacity);
    assert!(!info.controller.clone_volume);
    assert_eq!(
        info.node, None,
        "NodeGetInfo is for node-deployment mode only"
    );
    info.require_provisioning().unwrap();
}

#[tokio::test]
async fn node_deployment_handshake_reads_node_get_info() {
    let s = setup();
    let _driver = serve(&s.socket, &s.knobs);
    let options = HandshakeOptions {
        node_deployment: true,
        ..s.handshake_options(OperationMetrics::new())
    };

    let node = handshake(s.connect().await, options)
        .await
        .unwrap()
        .node
        .expect("node info");

    assert_eq!(node.node_id, "node-1");
    assert_eq!(node.max_volumes_per_node, 16);
    assert_eq!(
        node.accessible_topology["topology.example.com/zone"],
        "zone-a"
    );
}

#[tokio::test]
async fn a_probe_error_other_than_not_ready_stops_start_up() {
    let s = setup();
    *s.knobs.probe_error.lock().unwrap() =
        Some((Code::FailedPrecondition, "backend unreachable".into()));
    let _driver = serve(&s.socket, &s.knobs);

    let err = handshake(
        s.connect().await,
        s.handshake_options(OperationMetrics::new()),
    )
    .await
    .unwrap_err();

    assert!(
        matches!(
            err,
            HandshakeError::Probe {
                code: Code::FailedPrecondition,
                ..
            }
        ),
        "{err:?}"
    );
    let text = err.to_string();
    assert!(
        text.contains("Probe failed with FailedPrecondition: backend unreachable"),
        "{text}"
    );
    assert_eq!(
        s.knobs.probe_calls.load(Ordering::SeqCst),
        1,
        "a broken driver is not retried"
    );
}

#[tokio::test]
async fn handshake_refuses_a_driver_that_cannot_create_volumes() {
    use v1::controller_service_capability::rpc::Type as Rpc;
    let s = setup();
    *s.knobs.controller_rpcs.lock().unwrap() = vec![Rpc::ListVolumes, Rpc::PublishUnpublishVolume];
    let _driver = serve(&s.socket, &s.knobs);

    let info = handshake(
        s.connect().await,
        s.handshake_options(OperationMetrics::new()),
    )
    .await
    .unwrap();
    let err = info.require_provisioning().unwrap_err().to_string();

    assert!(
        err.starts_with("CSI driver does not support dynamic provisioning: controller CREATE_DELETE_VOLUME capability is not reported"),
        "{err}"
    );
}

#[tokio::test]
async fn handshake_refuses_a_node_only_plugin_without_calling_its_controller() {
    let s = setup();
    s.knobs.plugin_services.lock().unwrap().clear();
    let _driver = serve(&s.socket, &s.knobs);

    let info = handshake(
        s.connect().await,
        s.handshake_options(OperationMetrics::new()),
    )
    .await
    .unwrap();
    let err = info.require_provisioning().unwrap_err().to_string();

    assert!(
        err.contains("plugin CONTROLLER_SERVICE capability is not reported"),
        "{err}"
    );
    assert!(
        err.contains("--csi-address"),
        "the message says what to fix: {err}"
    );
    assert_eq!(
        s.knobs.controller_capability_calls.load(Ordering::SeqCst),
        0
    );
}

#[tokio::test]
async fn a_slow_call_ends_with_deadline_exceeded() {
    let s = setup();
    s.knobs.create_hangs.store(true, Ordering::SeqCst);
    let _driver = serve(&s.socket, &s.knobs);
    let mut registry = Registry::default();
    let metrics = OperationMetrics::register(&mut registry);
    let csi = GrpcCsi::new(s.connect().await, Duration::from_millis(200), metrics);

    let status = tokio::time::timeout(
        PATIENCE,
        csi.create_volume(create_request("slow", "x"), false),
    )
    .await
    .expect("the call must end at its deadline")
    .unwrap_err();

    assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");
    assert!(
        status
            .message()
            .contains("/csi.v1.Controller/CreateVolume did not finish within 200ms"),
        "{status:?}"
    );
    assert!(exposition(&registry).contains(
        r#"csi_sidecar_operations_seconds_count{driver_name="",grpc_status_code="DeadlineExceeded",method_name="/csi.v1.Controller/CreateVolume"} 1"#
    ));
}

#[tokio::test]
async fn calls_reach_the_driver_again_after_it_restarts() {
    let s = setup();
    let driver = serve(&s.socket, &s.knobs);
    let csi = GrpcCsi::new(
        s.connect().await,
        Duration::from_secs(5),
        OperationMetrics::new(),
    );
    csi.create_volume(create_request("before", "x"), false)
        .await
        .unwrap();

    driver.stop(&s.socket).await;
    let status = csi
        .create_volume(create_request("while-down", "x"), false)
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert!(
        status.message().contains("cannot reach the CSI driver"),
        "{status:?}"
    );

    let _restarted = serve(&s.socket, &s.knobs);
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let volume = loop {
        match csi.create_volume(create_request("after", "x"), false).await {
            Ok(response) => break response.volume.unwrap(),
            Err(status) if tokio::time::Instant::now() < deadline => {
                assert_eq!(status.code(), Code::Unavailable, "{status:?}");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(status) => panic!("the channel never reconnected: {status:?}"),
        }
    };
    assert_eq!(volume.volume_id, "vol-after");
}

#[tokio::test]
async fn secrets_never_reach_the_logs() {
    const SECRET: &str = "pa55-Wh1sper-7731";
    let logs = LogCapture::default();
    let _guard = logs.install();
    let s = setup();
    let _driver = serve(&s.socket, &s.knobs);
    let csi = GrpcCsi::new(
        s.connect().await,
        Duration::from_secs(5),
        OperationMetrics::new(),
    );

    csi.create_volume(create_request("pvc-secret", SECRET), false)
        .await
        .unwrap();
    csi.delete_volume(
        v1::DeleteVolumeRequest {
            volume_id: "vol-pvc-secret".into(),
            secrets: HashMap::from([("backend-password".into(), SECRET.into())]),
        },
        false,
    )
    .await
    .unwrap();
    *s.knobs.create_error.lock().unwrap() = Some((Code::InvalidArgument, "bad parameter".into()));
    csi.create_volume(create_request("pvc-rejected", SECRET), false)
        .await
        .unwrap_err();

    let received = s.knobs.received_secrets.lock().unwrap().clone();
    assert_eq!(received.len(), 3);
    assert!(
        received.iter().all(|s| s["backend-password"] == SECRET),
        "the driver got the real secret"
    );
    let text = logs.text();
    assert!(
        text.contains("GRPC request: CreateVolumeRequest"),
        "requests are logged:\n{text}"
    );
    assert!(
        text.contains("GRPC request: DeleteVolumeRequest"),
        "requests are logged:\n{text}"
    );
    assert!(
        text.contains("pvc-secret") && text.contains("***stripped***"),
        "{text}"
    );
    assert!(
        !text.contains(SECRET),
        "a secret value reached the log:\n{text}"
    );
    assert!(
        !text.contains("backend-password"),
        "a secret key reached the log:\n{text}"
    );
}

#[tokio::test]
async fn every_call_is_observed_with_upstream_labels() {
    let s = setup();
    let _driver = serve(&s.socket, &s.knobs);
    let mut registry = Registry::default();
    let metrics = OperationMetrics::register(&mut registry);

    let channel = s.connect().await;
    handshake(channel.clone(), s.handshake_options(metrics.clone()))
        .await
        .unwrap();
    let csi: Arc<dyn CsiController> =
        Arc::new(GrpcCsi::new(channel, Duration::from_secs(5), metrics));
    csi.create_volume(create_request("ok", "x"), false)
        .await
        .unwrap();
    *s.knobs.create_error.lock().unwrap() = Some((Code::InvalidArgument, "bad parameter".into()));
    csi.create_volume(create_request("bad", "x"), false)
        .await
        .unwrap_err();
    csi.get_capacity(v1::GetCapacityRequest::default())
        .await
        .unwrap_err();

    let text = exposition(&registry);
    let count = |driver: &str, code: &str, method: &str| {
        format!(
            r#"csi_sidecar_operations_seconds_count{{driver_name="{driver}",grpc_status_code="{code}",method_name="{method}"}} 1"#
        )
    };
    // Before GetPluginInfo answers, the driver name is unknown, as upstream.
    for line in [
        count("", "OK", "/csi.v1.Identity/Probe"),
        count("", "OK", "/csi.v1.Identity/GetPluginInfo"),
        count(DRIVER_NAME, "OK", "/csi.v1.Identity/GetPluginCapabilities"),
        count(
            DRIVER_NAME,
            "OK",
            "/csi.v1.Controller/ControllerGetCapabilities",
        ),
        count(DRIVER_NAME, "OK", "/csi.v1.Controller/CreateVolume"),
        count(
            DRIVER_NAME,
            "InvalidArgument",
            "/csi.v1.Controller/CreateVolume",
        ),
        count(
            DRIVER_NAME,
            "Unimplemented",
            "/csi.v1.Controller/GetCapacity",
        ),
    ] {
        assert!(text.contains(&line), "missing {line} in:\n{text}");
    }
}
