//! Start-up handshake with the driver: Probe until ready, then plugin info and capabilities, and in
//! node-deployment mode NodeGetInfo, condensed into [`DriverInfo`].

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;
use tonic::transport::Channel;
use tonic::{Code, Status};
use tracing::info;

use super::client::{CsiController, GrpcCsi, OperationMetrics, go_code_name, method};
use super::connect::shutdown_requested;
use super::v1;

/// How the handshake runs.
#[derive(Clone, Debug)]
pub struct HandshakeOptions {
    /// `--timeout`, applied to every call.
    pub timeout: Duration,
    /// `--node-deployment`: also ask the node service who this node is.
    pub node_deployment: bool,
    /// Set to `true` to stop waiting for the driver.
    pub shutdown: watch::Receiver<bool>,
    /// Where the handshake calls are recorded; it learns the driver name from GetPluginInfo.
    pub metrics: OperationMetrics,
    /// Pause between two Probe calls while the driver is not ready (upstream: 1 s).
    pub probe_interval: Duration,
    /// How often to repeat the "waiting for CSI driver" line.
    pub log_interval: Duration,
}

impl HandshakeOptions {
    /// Controller mode, fresh metrics, Probe every 1 s, log every 10 s.
    pub fn new(timeout: Duration, shutdown: watch::Receiver<bool>) -> Self {
        Self {
            timeout,
            node_deployment: false,
            shutdown,
            metrics: OperationMetrics::new(),
            probe_interval: Duration::from_secs(1),
            log_interval: Duration::from_secs(10),
        }
    }
}

/// What the sidecar learned about the driver at start-up.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DriverInfo {
    /// Driver name from GetPluginInfo (never empty).
    pub name: String,
    /// Opaque driver version from GetPluginInfo.
    pub vendor_version: String,
    /// Optional manifest from GetPluginInfo.
    pub manifest: BTreeMap<String, String>,
    /// GetPluginCapabilities.
    pub plugin: PluginCapabilities,
    /// ControllerGetCapabilities (all false when the plugin has no controller service).
    pub controller: ControllerCapabilities,
    /// NodeGetInfo, in node-deployment mode only.
    pub node: Option<NodeInfo>,
}

/// Plugin-wide capabilities.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[allow(clippy::struct_excessive_bools)]
pub struct PluginCapabilities {
    /// CONTROLLER_SERVICE.
    pub controller_service: bool,
    /// VOLUME_ACCESSIBILITY_CONSTRAINTS: volumes have topology.
    pub volume_accessibility_constraints: bool,
    /// GROUP_CONTROLLER_SERVICE.
    pub group_controller_service: bool,
    /// SNAPSHOT_METADATA_SERVICE.
    pub snapshot_metadata_service: bool,
    /// VolumeExpansion ONLINE.
    pub online_expansion: bool,
    /// VolumeExpansion OFFLINE.
    pub offline_expansion: bool,
}

/// Controller-service capabilities.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[allow(clippy::struct_excessive_bools)]
pub struct ControllerCapabilities {
    /// CREATE_DELETE_VOLUME.
    pub create_delete_volume: bool,
    /// PUBLISH_UNPUBLISH_VOLUME.
    pub publish_unpublish_volume: bool,
    /// LIST_VOLUMES.
    pub list_volumes: bool,
    /// GET_CAPACITY.
    pub get_capacity: bool,
    /// CREATE_DELETE_SNAPSHOT.
    pub create_delete_snapshot: bool,
    /// LIST_SNAPSHOTS.
    pub list_snapshots: bool,
    /// CLONE_VOLUME.
    pub clone_volume: bool,
    /// PUBLISH_READONLY.
    pub publish_readonly: bool,
    /// EXPAND_VOLUME.
    pub expand_volume: bool,
    /// LIST_VOLUMES_PUBLISHED_NODES.
    pub list_volumes_published_nodes: bool,
    /// VOLUME_CONDITION.
    pub volume_condition: bool,
    /// GET_VOLUME.
    pub get_volume: bool,
    /// SINGLE_NODE_MULTI_WRITER.
    pub single_node_multi_writer: bool,
    /// MODIFY_VOLUME.
    pub modify_volume: bool,
    /// GET_SNAPSHOT.
    pub get_snapshot: bool,
}

/// NodeGetInfo, for node-deployment mode.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeInfo {
    /// The driver's id for this node.
    pub node_id: String,
    /// Zero when the driver reports no limit.
    pub max_volumes_per_node: i64,
    /// Topology segments of this node (empty when the driver reports none).
    pub accessible_topology: BTreeMap<String, String>,
}

/// Why the handshake failed. Every variant is fatal for start-up.
#[derive(Debug, thiserror::Error)]
pub enum HandshakeError {
    /// Shutdown was requested while waiting for the driver.
    #[error("shutdown requested while waiting for the CSI driver to become ready")]
    Cancelled,
    /// Probe answered with an error that does not mean "starting up".
    #[error(
        "CSI driver Probe failed with {}: {message}; the driver reports itself unhealthy, check its logs",
        go_code_name(*code)
    )]
    Probe {
        /// gRPC code from the driver.
        code: Code,
        /// gRPC message from the driver.
        message: String,
    },
    /// A handshake call other than Probe failed.
    #[error("{method} failed with {}: {message}", go_code_name(*code))]
    Call {
        /// Full gRPC method.
        method: &'static str,
        /// gRPC code.
        code: Code,
        /// gRPC message.
        message: String,
    },
    /// GetPluginInfo returned no name.
    #[error(
        "CSI driver returned an empty name from GetPluginInfo; the driver must report its name \
         (for example \"hostpath.csi.k8s.io\")"
    )]
    EmptyDriverName,
    // The driver cannot provision volumes. Up to the `;`, upstream's text; then what to do.
    /// No plugin capability CONTROLLER_SERVICE.
    #[error(
        "CSI driver does not support dynamic provisioning: plugin CONTROLLER_SERVICE capability is \
         not reported; point --csi-address at the driver's controller plugin (not its node-only \
         plugin)"
    )]
    NoControllerService,
    /// No controller capability CREATE_DELETE_VOLUME.
    #[error(
        "CSI driver does not support dynamic provisioning: controller CREATE_DELETE_VOLUME \
         capability is not reported; this driver cannot create volumes, so remove the \
         csi-provisioner sidecar or enable provisioning in the driver"
    )]
    NoCreateDeleteVolume,
}

impl HandshakeError {
    fn call(method: &'static str, status: &Status) -> Self {
        HandshakeError::Call {
            method,
            code: status.code(),
            message: status.message().to_owned(),
        }
    }
}

impl DriverInfo {
    /// This node's topology segments (NodeGetInfo): empty in controller mode or when the driver
    /// reports none.
    pub fn node_segments(&self) -> BTreeMap<String, String> {
        let node = self.node.as_ref();
        node.map(|n| n.accessible_topology.clone())
            .unwrap_or_default()
    }

    /// Whether the driver's volumes have topology (VOLUME_ACCESSIBILITY_CONSTRAINTS). The caller
    /// combines this with the `Topology` feature gate.
    pub fn supports_topology(&self) -> bool {
        self.plugin.volume_accessibility_constraints
    }

    /// Refuses drivers that cannot provision: no CONTROLLER_SERVICE or no CREATE_DELETE_VOLUME.
    pub fn require_provisioning(&self) -> Result<(), HandshakeError> {
        if !self.plugin.controller_service {
            return Err(HandshakeError::NoControllerService);
        }
        if !self.controller.create_delete_volume {
            return Err(HandshakeError::NoCreateDeleteVolume);
        }
        Ok(())
    }
}

impl PluginCapabilities {
    /// Reads a GetPluginCapabilities answer; values this build does not know are ignored.
    pub fn from_response(response: &v1::GetPluginCapabilitiesResponse) -> Self {
        use v1::plugin_capability::{Type as Capability, service, volume_expansion};
        let mut caps = Self::default();
        for capability in &response.capabilities {
            let flag = match &capability.r#type {
                Some(Capability::Service(s)) => match service::Type::try_from(s.r#type) {
                    Ok(service::Type::ControllerService) => &mut caps.controller_service,
                    Ok(service::Type::VolumeAccessibilityConstraints) => {
                        &mut caps.volume_accessibility_constraints
                    }
                    Ok(service::Type::GroupControllerService) => &mut caps.group_controller_service,
                    Ok(service::Type::SnapshotMetadataService) => {
                        &mut caps.snapshot_metadata_service
                    }
                    Ok(service::Type::Unknown) | Err(_) => continue,
                },
                Some(Capability::VolumeExpansion(e)) => {
                    match volume_expansion::Type::try_from(e.r#type) {
                        Ok(volume_expansion::Type::Online) => &mut caps.online_expansion,
                        Ok(volume_expansion::Type::Offline) => &mut caps.offline_expansion,
                        Ok(volume_expansion::Type::Unknown) | Err(_) => continue,
                    }
                }
                None => continue,
            };
            *flag = true;
        }
        caps
    }
}

impl ControllerCapabilities {
    /// Reads a ControllerGetCapabilities answer; values this build does not know are ignored.
    pub fn from_response(response: &v1::ControllerGetCapabilitiesResponse) -> Self {
        use v1::controller_service_capability::{Type as Capability, rpc::Type as Rpc};
        let mut caps = Self::default();
        for capability in &response.capabilities {
            let Some(Capability::Rpc(rpc)) = &capability.r#type else {
                continue;
            };
            let Ok(rpc) = Rpc::try_from(rpc.r#type) else {
                continue;
            };
            let flag = match rpc {
                Rpc::Unknown => continue,
                Rpc::CreateDeleteVolume => &mut caps.create_delete_volume,
                Rpc::PublishUnpublishVolume => &mut caps.publish_unpublish_volume,
                Rpc::ListVolumes => &mut caps.list_volumes,
                Rpc::GetCapacity => &mut caps.get_capacity,
                Rpc::CreateDeleteSnapshot => &mut caps.create_delete_snapshot,
                Rpc::ListSnapshots => &mut caps.list_snapshots,
                Rpc::CloneVolume => &mut caps.clone_volume,
                Rpc::PublishReadonly => &mut caps.publish_readonly,
                Rpc::ExpandVolume => &mut caps.expand_volume,
                Rpc::ListVolumesPublishedNodes => &mut caps.list_volumes_published_nodes,
                Rpc::VolumeCondition => &mut caps.volume_condition,
                Rpc::GetVolume => &mut caps.get_volume,
                Rpc::SingleNodeMultiWriter => &mut caps.single_node_multi_writer,
                Rpc::ModifyVolume => &mut caps.modify_volume,
                Rpc::GetSnapshot => &mut caps.get_snapshot,
            };
            *flag = true;
        }
        caps
    }
}

impl NodeInfo {
    /// Reads a NodeGetInfo answer.
    pub fn from_response(response: v1::NodeGetInfoResponse) -> Self {
        Self {
            node_id: response.node_id,
            max_volumes_per_node: response.max_volumes_per_node,
            accessible_topology: response
                .accessible_topology
                .map(|t| t.segments.into_iter().collect())
                .unwrap_or_default(),
        }
    }
}

/// Runs the start-up handshake on `channel`.
///
/// Probe is repeated every `probe_interval` while the driver answers ready=false, DeadlineExceeded or
/// Unavailable (it is starting, or its socket is being re-created); any other Probe error is fatal.
/// Then GetPluginInfo (an empty name is fatal), GetPluginCapabilities, ControllerGetCapabilities (only
/// when the plugin has a controller service, as upstream) and, in node-deployment mode, NodeGetInfo.
/// It does not check provisioning support: call [`DriverInfo::require_provisioning`].
pub async fn handshake(
    channel: Channel,
    options: HandshakeOptions,
) -> Result<DriverInfo, HandshakeError> {
    let csi = GrpcCsi::new(channel, options.timeout, options.metrics.clone());
    let mut shutdown = options.shutdown.clone();
    wait_until_ready(&csi, &options, &mut shutdown).await?;

    let plugin_info = csi
        .get_plugin_info()
        .await
        .map_err(|s| HandshakeError::call(method::GET_PLUGIN_INFO, &s))?;
    if plugin_info.name.is_empty() {
        return Err(HandshakeError::EmptyDriverName);
    }
    options.metrics.set_driver_name(&plugin_info.name);
    info!(driver = %plugin_info.name, version = %plugin_info.vendor_version, "detected CSI driver {}", plugin_info.name);

    let plugin = csi
        .get_plugin_capabilities()
        .await
        .map(|r| PluginCapabilities::from_response(&r))
        .map_err(|s| HandshakeError::call(method::GET_PLUGIN_CAPABILITIES, &s))?;
    let controller = if plugin.controller_service {
        csi.controller_get_capabilities()
            .await
            .map(|r| ControllerCapabilities::from_response(&r))
            .map_err(|s| HandshakeError::call(method::CONTROLLER_GET_CAPABILITIES, &s))?
    } else {
        ControllerCapabilities::default()
    };
    let node = if options.node_deployment {
        csi.node_get_info()
            .await
            .map(|r| Some(NodeInfo::from_response(r)))
            .map_err(|s| HandshakeError::call(method::NODE_GET_INFO, &s))?
    } else {
        None
    };

    Ok(DriverInfo {
        name: plugin_info.name,
        vendor_version: plugin_info.vendor_version,
        manifest: plugin_info.manifest.into_iter().collect(),
        plugin,
        controller,
        node,
    })
}

/// What a Probe answer means for start-up.
#[derive(Debug, PartialEq, Eq)]
enum Readiness {
    Ready,
    /// Not yet; the text says why, for the log.
    NotYet(String),
    Failed {
        code: Code,
        message: String,
    },
}

fn readiness(result: Result<v1::ProbeResponse, Status>) -> Readiness {
    match result {
        // An unset `ready` means ready, per the spec.
        Ok(v1::ProbeResponse { ready: Some(false) }) => {
            Readiness::NotYet("Probe answered ready=false (driver still initializing)".into())
        }
        Ok(_) => Readiness::Ready,
        Err(status) if matches!(status.code(), Code::DeadlineExceeded | Code::Unavailable) => {
            Readiness::NotYet(format!(
                "Probe failed with {}: {}",
                go_code_name(status.code()),
                status.message()
            ))
        }
        Err(status) => Readiness::Failed {
            code: status.code(),
            message: status.message().to_owned(),
        },
    }
}

async fn wait_until_ready(
    csi: &GrpcCsi,
    options: &HandshakeOptions,
    shutdown: &mut watch::Receiver<bool>,
) -> Result<(), HandshakeError> {
    let mut last_logged: Option<Instant> = None;
    loop {
        if *shutdown.borrow() {
            return Err(HandshakeError::Cancelled);
        }
        let probe = tokio::select! {
            result = csi.probe() => result,
            () = shutdown_requested(shutdown) => return Err(HandshakeError::Cancelled),
        };
        match readiness(probe) {
            Readiness::Ready => return Ok(()),
            Readiness::Failed { code, message } => {
                return Err(HandshakeError::Probe { code, message });
            }
            Readiness::NotYet(why) => {
                if last_logged.is_none_or(|at| at.elapsed() >= options.log_interval) {
                    info!("waiting for CSI driver to become ready: {why}");
                    last_logged = Some(Instant::now());
                }
            }
        }
        tokio::select! {
            () = tokio::time::sleep(options.probe_interval) => {}
            () = shutdown_requested(shutdown) => return Err(HandshakeError::Cancelled),
        }
    }
}

#[cfg(test)]
#[path = "probe_tests.rs"]
mod tests;
