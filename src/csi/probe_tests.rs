use super::*;
use v1::controller_service_capability::{Rpc, rpc};
use v1::plugin_capability::{Service, VolumeExpansion, service, volume_expansion};

fn plugin_caps(services: &[service::Type]) -> v1::GetPluginCapabilitiesResponse {
    let mut capabilities: Vec<_> = services
        .iter()
        .map(|t| v1::PluginCapability {
            r#type: Some(v1::plugin_capability::Type::Service(Service {
                r#type: *t as i32,
            })),
        })
        .collect();
    capabilities.push(v1::PluginCapability {
        r#type: Some(v1::plugin_capability::Type::VolumeExpansion(
            VolumeExpansion {
                r#type: volume_expansion::Type::Online as i32,
            },
        )),
    });
    // A value from a newer spec must not break parsing.
    capabilities.push(v1::PluginCapability {
        r#type: Some(v1::plugin_capability::Type::Service(Service { r#type: 99 })),
    });
    v1::GetPluginCapabilitiesResponse { capabilities }
}

fn controller_caps(rpcs: &[rpc::Type]) -> v1::ControllerGetCapabilitiesResponse {
    v1::ControllerGetCapabilitiesResponse {
        capabilities: rpcs
            .iter()
            .map(|t| v1::ControllerServiceCapability {
                r#type: Some(v1::controller_service_capability::Type::Rpc(Rpc {
                    r#type: *t as i32,
                })),
            })
            .collect(),
    }
}

#[test]
fn reads_plugin_capabilities() {
    let caps = PluginCapabilities::from_response(&plugin_caps(&[
        service::Type::ControllerService,
        service::Type::VolumeAccessibilityConstraints,
    ]));
    assert_eq!(
        caps,
        PluginCapabilities {
            controller_service: true,
            volume_accessibility_constraints: true,
            online_expansion: true,
            ..Default::default()
        }
    );
}

#[test]
fn reads_controller_capabilities() {
    let caps = ControllerCapabilities::from_response(&controller_caps(&[
        rpc::Type::CreateDeleteVolume,
        rpc::Type::CloneVolume,
        rpc::Type::ModifyVolume,
    ]));
    assert_eq!(
        caps,
        ControllerCapabilities {
            create_delete_volume: true,
            clone_volume: true,
            modify_volume: true,
            ..Default::default()
        }
    );
}

#[test]
fn requires_controller_service_then_create_delete_volume() {
    let mut info = DriverInfo::default();
    let err = info.require_provisioning().unwrap_err().to_string();
    assert!(
        err.starts_with("CSI driver does not support dynamic provisioning: plugin CONTROLLER_SERVICE capability is not reported"),
        "{err}"
    );
    assert!(err.contains("--csi-address"), "{err}");

    info.plugin.controller_service = true;
    let err = info.require_provisioning().unwrap_err().to_string();
    assert!(
        err.contains("controller CREATE_DELETE_VOLUME capability is not reported"),
        "{err}"
    );

    info.controller.create_delete_volume = true;
    assert!(info.require_provisioning().is_ok());
}

#[test]
fn topology_follows_volume_accessibility_constraints() {
    let mut info = DriverInfo::default();
    assert!(!info.supports_topology());
    info.plugin.volume_accessibility_constraints = true;
    assert!(info.supports_topology());
}

#[test]
fn node_info_flattens_topology() {
    let info = NodeInfo::from_response(v1::NodeGetInfoResponse {
        node_id: "n1".into(),
        max_volumes_per_node: 7,
        accessible_topology: Some(v1::Topology {
            segments: [("topology.example.com/zone".to_owned(), "z1".to_owned())].into(),
        }),
    });
    assert_eq!(info.node_id, "n1");
    assert_eq!(info.max_volumes_per_node, 7);
    assert_eq!(info.accessible_topology["topology.example.com/zone"], "z1");
    assert!(
        NodeInfo::from_response(Default::default())
            .accessible_topology
            .is_empty()
    );
}

#[test]
fn probe_answers_that_mean_not_yet() {
    assert_eq!(
        readiness(Ok(v1::ProbeResponse { ready: None })),
        Readiness::Ready
    );
    assert_eq!(
        readiness(Ok(v1::ProbeResponse { ready: Some(true) })),
        Readiness::Ready
    );
    assert!(matches!(
        readiness(Ok(v1::ProbeResponse { ready: Some(false) })),
        Readiness::NotYet(_)
    ));
    assert!(matches!(
        readiness(Err(Status::deadline_exceeded("slow"))),
        Readiness::NotYet(_)
    ));
    assert!(matches!(
        readiness(Err(Status::unavailable("restarting"))),
        Readiness::NotYet(_)
    ));
    assert_eq!(
        readiness(Err(Status::failed_precondition("no backend"))),
        Readiness::Failed {
            code: Code::FailedPrecondition,
            message: "no backend".into()
        }
    );
}
