//! The tonic Identity, Controller and Node services: each RPC is one line that hands the request
//! to the driver through [`Driver::call`] (latency, injected errors, counting).

use std::sync::Arc;

use tonic::{Request, Response, Status};

use crate::config::ControllerCap;
use crate::csi::v1::*;
use crate::driver::Driver;

/// The three CSI services over one shared driver.
#[derive(Debug, Clone)]
pub struct Service(pub Arc<Driver>);

type Reply<T> = Result<Response<T>, Status>;

impl Service {
    async fn run<Req, T, F>(&self, method: &'static str, req: Request<Req>, op: F) -> Reply<T>
    where
        Req: Send + 'static,
        T: Send + 'static,
        F: FnOnce(&Driver, Req) -> Result<T, Status> + Send + 'static,
    {
        let req = req.into_inner();
        self.0
            .call(method, move |d| op(d, req))
            .await
            .map(Response::new)
    }
}

#[tonic::async_trait]
impl identity_server::Identity for Service {
    async fn get_plugin_info(
        &self,
        r: Request<GetPluginInfoRequest>,
    ) -> Reply<GetPluginInfoResponse> {
        self.run("GetPluginInfo", r, |d, _| {
            Ok(GetPluginInfoResponse {
                name: d.config.driver_name.clone(),
                vendor_version: d.config.vendor_version.clone(),
                manifest: Default::default(),
            })
        })
        .await
    }

    async fn get_plugin_capabilities(
        &self,
        r: Request<GetPluginCapabilitiesRequest>,
    ) -> Reply<GetPluginCapabilitiesResponse> {
        self.run("GetPluginCapabilities", r, |d, _| {
            use plugin_capability::{
                Service as S, Type, VolumeExpansion, service, volume_expansion,
            };
            let mut capabilities = vec![PluginCapability {
                r#type: Some(Type::Service(S {
                    r#type: service::Type::ControllerService as i32,
                })),
            }];
            if d.config.topology {
                capabilities.push(PluginCapability {
                    r#type: Some(Type::Service(S {
                        r#type: service::Type::VolumeAccessibilityConstraints as i32,
                    })),
                });
            }
            if d.faults.has_capability(ControllerCap::ExpandVolume) {
                capabilities.push(PluginCapability {
                    r#type: Some(Type::VolumeExpansion(VolumeExpansion {
                        r#type: volume_expansion::Type::Online as i32,
                    })),
                });
            }
            Ok(GetPluginCapabilitiesResponse { capabilities })
        })
        .await
    }

    async fn probe(&self, r: Request<ProbeRequest>) -> Reply<ProbeResponse> {
        self.run("Probe", r, |d, _| {
            Ok(ProbeResponse {
                ready: Some(d.faults.probe_ready()),
            })
        })
        .await
    }
}

#[tonic::async_trait]
impl controller_server::Controller for Service {
    async fn create_volume(&self, r: Request<CreateVolumeRequest>) -> Reply<CreateVolumeResponse> {
        let _outstanding = self.0.create_started(&r.get_ref().name);
        self.0.create_received(r.get_ref());
        self.run("CreateVolume", r, Driver::create_volume).await
    }

    async fn delete_volume(&self, r: Request<DeleteVolumeRequest>) -> Reply<DeleteVolumeResponse> {
        self.0.delete_received(&r.get_ref().volume_id);
        self.run("DeleteVolume", r, Driver::delete_volume).await
    }

    async fn controller_publish_volume(
        &self,
        r: Request<ControllerPublishVolumeRequest>,
    ) -> Reply<ControllerPublishVolumeResponse> {
        self.run("ControllerPublishVolume", r, Driver::controller_publish)
            .await
    }

    async fn controller_unpublish_volume(
        &self,
        r: Request<ControllerUnpublishVolumeRequest>,
    ) -> Reply<ControllerUnpublishVolumeResponse> {
        self.run("ControllerUnpublishVolume", r, Driver::controller_unpublish)
            .await
    }

    async fn validate_volume_capabilities(
        &self,
        r: Request<ValidateVolumeCapabilitiesRequest>,
    ) -> Reply<ValidateVolumeCapabilitiesResponse> {
        self.run(
            "ValidateVolumeCapabilities",
            r,
            Driver::validate_capabilities,
        )
        .await
    }

    async fn list_volumes(&self, r: Request<ListVolumesRequest>) -> Reply<ListVolumesResponse> {
        self.run("ListVolumes", r, Driver::list_volumes).await
    }

    async fn get_capacity(&self, r: Request<GetCapacityRequest>) -> Reply<GetCapacityResponse> {
        self.run("GetCapacity", r, Driver::get_capacity).await
    }

    async fn controller_get_capabilities(
        &self,
        r: Request<ControllerGetCapabilitiesRequest>,
    ) -> Reply<ControllerGetCapabilitiesResponse> {
        self.run("ControllerGetCapabilities", r, |d, _| {
            Ok(d.controller_capabilities())
        })
        .await
    }

    async fn create_snapshot(
        &self,
        r: Request<CreateSnapshotRequest>,
    ) -> Reply<CreateSnapshotResponse> {
        self.run("CreateSnapshot", r, Driver::create_snapshot).await
    }

    async fn delete_snapshot(
        &self,
        r: Request<DeleteSnapshotRequest>,
    ) -> Reply<DeleteSnapshotResponse> {
        self.run("DeleteSnapshot", r, Driver::delete_snapshot).await
    }

    async fn list_snapshots(
        &self,
        r: Request<ListSnapshotsRequest>,
    ) -> Reply<ListSnapshotsResponse> {
        self.run("ListSnapshots", r, Driver::list_snapshots).await
    }

    async fn get_snapshot(&self, r: Request<GetSnapshotRequest>) -> Reply<GetSnapshotResponse> {
        self.run("GetSnapshot", r, Driver::get_snapshot).await
    }

    async fn controller_expand_volume(
        &self,
        r: Request<ControllerExpandVolumeRequest>,
    ) -> Reply<ControllerExpandVolumeResponse> {
        self.run("ControllerExpandVolume", r, Driver::expand_volume)
            .await
    }

    async fn controller_get_volume(
        &self,
        r: Request<ControllerGetVolumeRequest>,
    ) -> Reply<ControllerGetVolumeResponse> {
        self.run("ControllerGetVolume", r, Driver::get_volume).await
    }

    async fn controller_modify_volume(
        &self,
        r: Request<ControllerModifyVolumeRequest>,
    ) -> Reply<ControllerModifyVolumeResponse> {
        self.run("ControllerModifyVolume", r, Driver::modify_volume)
            .await
    }
}

/// Node RPCs: nothing is mounted; target paths are created and removed (see `node.rs`).
#[tonic::async_trait]
impl node_server::Node for Service {
    async fn node_stage_volume(
        &self,
        r: Request<NodeStageVolumeRequest>,
    ) -> Reply<NodeStageVolumeResponse> {
        self.run("NodeStageVolume", r, Driver::node_stage).await
    }

    async fn node_unstage_volume(
        &self,
        r: Request<NodeUnstageVolumeRequest>,
    ) -> Reply<NodeUnstageVolumeResponse> {
        self.run("NodeUnstageVolume", r, Driver::node_unstage).await
    }

    async fn node_publish_volume(
        &self,
        r: Request<NodePublishVolumeRequest>,
    ) -> Reply<NodePublishVolumeResponse> {
        self.run("NodePublishVolume", r, Driver::node_publish).await
    }

    async fn node_unpublish_volume(
        &self,
        r: Request<NodeUnpublishVolumeRequest>,
    ) -> Reply<NodeUnpublishVolumeResponse> {
        self.run("NodeUnpublishVolume", r, Driver::node_unpublish)
            .await
    }

    async fn node_get_volume_stats(
        &self,
        r: Request<NodeGetVolumeStatsRequest>,
    ) -> Reply<NodeGetVolumeStatsResponse> {
        self.run("NodeGetVolumeStats", r, |_, _| {
            Err(Status::unimplemented(
                "NodeGetVolumeStats: GET_VOLUME_STATS is not advertised",
            ))
        })
        .await
    }

    async fn node_expand_volume(
        &self,
        r: Request<NodeExpandVolumeRequest>,
    ) -> Reply<NodeExpandVolumeResponse> {
        self.run("NodeExpandVolume", r, |_, _| {
            Err(Status::unimplemented(
                "NodeExpandVolume: node EXPAND_VOLUME is not advertised",
            ))
        })
        .await
    }

    async fn node_get_capabilities(
        &self,
        r: Request<NodeGetCapabilitiesRequest>,
    ) -> Reply<NodeGetCapabilitiesResponse> {
        self.run("NodeGetCapabilities", r, |_, _| {
            Ok(NodeGetCapabilitiesResponse {
                capabilities: vec![],
            })
        })
        .await
    }

    async fn node_get_info(&self, r: Request<NodeGetInfoRequest>) -> Reply<NodeGetInfoResponse> {
        self.run("NodeGetInfo", r, |d, _| {
            let accessible_topology = d.config.topology.then(|| Topology {
                segments: d.config.segment_of(&d.config.node_id).into_iter().collect(),
            });
            Ok(NodeGetInfoResponse {
                node_id: d.config.node_id.clone(),
                max_volumes_per_node: 0,
                accessible_topology,
            })
        })
        .await
    }
}
