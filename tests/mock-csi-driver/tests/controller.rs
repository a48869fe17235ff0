//! The mock driver's CSI behaviour over a real Unix socket: idempotency, error codes, capacity,
//! topology placement, secrets, content sources, paging, snapshots and modify.

mod support;

use std::collections::HashMap;

use mock_csi_driver::csi::v1::*;
use mock_csi_driver::{ContentSource, ControllerCap};
use support::{Fixture, create_req, topo};
use tonic::Code;

const GI: i64 = 1 << 30;

#[tokio::test]
async fn create_volume_is_idempotent_by_name_and_rejects_incompatible_repeats() {
    let mut f = Fixture::start(|c| c).await;
    let first = f
        .controller
        .create_volume(create_req("pvc-1", GI))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    let again = f
        .controller
        .create_volume(create_req("pvc-1", GI))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert_eq!(first.volume_id, again.volume_id);
    assert_eq!(first.capacity_bytes, GI);
    assert_eq!(
        first
            .volume_context
            .get("mock.csi/node")
            .map(String::as_str),
        Some("n1")
    );

    let err = f
        .controller
        .create_volume(create_req("pvc-1", 2 * GI))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::AlreadyExists, "{err:?}");
    let mut other_params = create_req("pvc-1", GI);
    other_params.parameters.insert("type".into(), "fast".into());
    assert_eq!(
        f.controller
            .create_volume(other_params)
            .await
            .unwrap_err()
            .code(),
        Code::AlreadyExists
    );

    let state = f.driver.state();
    assert_eq!(state.volumes.len(), 1);
    assert_eq!(state.volumes[0].node, "n1");
    assert_eq!(state.calls("CreateVolume"), 4);
}

#[tokio::test]
async fn missing_required_fields_are_invalid_arguments() {
    let mut f = Fixture::start(|c| c).await;
    let no_name = create_req("", GI);
    assert_eq!(
        f.controller
            .create_volume(no_name)
            .await
            .unwrap_err()
            .code(),
        Code::InvalidArgument
    );
    let mut no_caps = create_req("pvc-1", GI);
    no_caps.volume_capabilities.clear();
    assert_eq!(
        f.controller
            .create_volume(no_caps)
            .await
            .unwrap_err()
            .code(),
        Code::InvalidArgument
    );
    let no_id = DeleteVolumeRequest::default();
    assert_eq!(
        f.controller.delete_volume(no_id).await.unwrap_err().code(),
        Code::InvalidArgument
    );
    let no_snap_name = CreateSnapshotRequest {
        source_volume_id: "v".into(),
        ..Default::default()
    };
    assert_eq!(
        f.controller
            .create_snapshot(no_snap_name)
            .await
            .unwrap_err()
            .code(),
        Code::InvalidArgument
    );
    assert!(f.driver.state().volumes.is_empty());
}

#[tokio::test]
async fn delete_volume_is_idempotent_and_frees_the_pool() {
    let mut f = Fixture::start(|c| c).await;
    let id = f.create("pvc-1", GI).await;
    assert_eq!(f.driver.state().pools[0].used_bytes, GI);
    for _ in 0..2 {
        f.controller
            .delete_volume(DeleteVolumeRequest {
                volume_id: id.clone(),
                ..Default::default()
            })
            .await
            .unwrap();
    }
    let unknown = DeleteVolumeRequest {
        volume_id: "vol-does-not-exist".into(),
        ..Default::default()
    };
    f.controller.delete_volume(unknown).await.unwrap();
    let state = f.driver.state();
    assert!(state.volumes.is_empty());
    assert_eq!(state.pools[0].used_bytes, 0);
    assert_eq!(state.calls("DeleteVolume"), 3);
}

#[tokio::test]
async fn sizes_above_the_maximum_are_out_of_range_and_a_full_pool_is_resource_exhausted() {
    let mut f = Fixture::start(|mut c| {
        c.capacity_total = 3 * GI;
        c.max_volume_size = Some(2 * GI);
        c
    })
    .await;
    let err = f
        .controller
        .create_volume(create_req("big", 2 * GI + 1))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::OutOfRange);
    f.create("a", 2 * GI).await;
    let err = f
        .controller
        .create_volume(create_req("b", 2 * GI))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted, "{err:?}");
    let cap = f
        .controller
        .get_capacity(GetCapacityRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(cap.available_capacity, GI);
    assert_eq!(cap.maximum_volume_size, Some(2 * GI));
    // An exact range is honoured exactly.
    let mut exact = create_req("c", GI);
    exact.capacity_range = Some(CapacityRange {
        required_bytes: GI,
        limit_bytes: GI,
    });
    let v = f
        .controller
        .create_volume(exact)
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert_eq!(v.capacity_bytes, GI);
}

#[tokio::test]
async fn topology_places_volumes_on_an_allowed_node_preferred_first() {
    let mut f = Fixture::start(|mut c| {
        c.topology = true;
        c.extra_nodes = vec!["n2".into(), "n3".into()];
        c.capacity_total = 4 * GI;
        c
    })
    .await;
    let mut req = create_req("pvc-1", GI);
    req.accessibility_requirements = Some(TopologyRequirement {
        requisite: vec![topo("n2"), topo("n3")],
        preferred: vec![topo("n3"), topo("n2")],
    });
    let v = f
        .controller
        .create_volume(req.clone())
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert_eq!(v.accessible_topology, vec![topo("n3")]);
    assert_eq!(f.driver.state().volume(&v.volume_id).unwrap().node, "n3");

    // n3 is now too full for 4 GiB more, so the next preferred node with room is used.
    req.name = "pvc-2".into();
    req.capacity_range = Some(CapacityRange {
        required_bytes: 4 * GI,
        limit_bytes: 0,
    });
    let v = f
        .controller
        .create_volume(req)
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert_eq!(v.accessible_topology, vec![topo("n2")]);

    let per_node = |node: &str| GetCapacityRequest {
        accessible_topology: Some(topo(node)),
        ..Default::default()
    };
    let cap = |r: GetCapacityResponse| r.available_capacity;
    assert_eq!(
        cap(f
            .controller
            .get_capacity(per_node("n3"))
            .await
            .unwrap()
            .into_inner()),
        3 * GI
    );
    assert_eq!(
        cap(f
            .controller
            .get_capacity(per_node("n2"))
            .await
            .unwrap()
            .into_inner()),
        0
    );
    assert_eq!(
        cap(f
            .controller
            .get_capacity(per_node("elsewhere"))
            .await
            .unwrap()
            .into_inner()),
        0
    );

    let info = f
        .node
        .node_get_info(NodeGetInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (info.node_id.as_str(), info.accessible_topology),
        ("n1", Some(topo("n1")))
    );
}

#[tokio::test]
async fn a_node_driver_refuses_requirements_that_exclude_its_node() {
    let mut f = Fixture::start(|c| c.with_topology()).await;
    let mut req = create_req("pvc-1", GI);
    req.accessibility_requirements = Some(TopologyRequirement {
        requisite: vec![topo("n2")],
        preferred: vec![topo("n2")],
    });
    let err = f.controller.create_volume(req).await.unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted, "{err:?}");
    assert!(f.driver.state().volumes.is_empty());

    let caps = f
        .identity
        .get_plugin_capabilities(GetPluginCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner();
    let services: Vec<i32> = caps
        .capabilities
        .iter()
        .filter_map(|c| match &c.r#type {
            Some(plugin_capability::Type::Service(s)) => Some(s.r#type),
            _ => None,
        })
        .collect();
    assert!(
        services
            .contains(&(plugin_capability::service::Type::VolumeAccessibilityConstraints as i32))
    );
}

#[tokio::test]
async fn required_secrets_are_checked_and_only_their_keys_are_recorded() {
    let mut f = Fixture::start(|c| c.with_required_secret("password", "s3cr3t-value")).await;
    let err = f
        .controller
        .create_volume(create_req("pvc-1", GI))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated);
    let mut wrong = create_req("pvc-1", GI);
    wrong.secrets = HashMap::from([("password".into(), "guess".into())]);
    assert_eq!(
        f.controller.create_volume(wrong).await.unwrap_err().code(),
        Code::Unauthenticated
    );

    let mut right = create_req("pvc-1", GI);
    right.secrets = HashMap::from([("password".into(), "s3cr3t-value".into())]);
    let id = f
        .controller
        .create_volume(right)
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap()
        .volume_id;
    let err = f
        .controller
        .delete_volume(DeleteVolumeRequest {
            volume_id: id.clone(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated);

    let state = f.driver.state();
    assert_eq!(state.volumes[0].secret_keys, vec!["password".to_owned()]);
    let dump = serde_json::to_string(&state).unwrap();
    assert!(
        !dump.contains("s3cr3t-value"),
        "the state dump leaks a secret value"
    );
}

#[tokio::test]
async fn clones_and_restores_record_their_source_and_missing_sources_are_not_found() {
    let mut f = Fixture::start(|c| c).await;
    let src = f.create("src", GI).await;
    let snap = f
        .controller
        .create_snapshot(CreateSnapshotRequest {
            source_volume_id: src.clone(),
            name: "snap-1".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .snapshot
        .unwrap();
    assert!(snap.ready_to_use && snap.creation_time.is_some());
    assert_eq!(
        (snap.source_volume_id.as_str(), snap.size_bytes),
        (src.as_str(), GI)
    );

    let from = |name: &str, t: volume_content_source::Type| {
        let mut r = create_req(name, GI);
        r.volume_content_source = Some(VolumeContentSource { r#type: Some(t) });
        r
    };
    use volume_content_source::{SnapshotSource, Type, VolumeSource};
    let clone = from(
        "clone",
        Type::Volume(VolumeSource {
            volume_id: src.clone(),
        }),
    );
    let v = f
        .controller
        .create_volume(clone)
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert_eq!(
        v.content_source.unwrap().r#type,
        Some(Type::Volume(VolumeSource {
            volume_id: src.clone()
        }))
    );
    let restore = from(
        "restore",
        Type::Snapshot(SnapshotSource {
            snapshot_id: snap.snapshot_id.clone(),
        }),
    );
    let v = f
        .controller
        .create_volume(restore)
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert_eq!(
        f.driver
            .state()
            .volume(&v.volume_id)
            .unwrap()
            .content_source,
        Some(ContentSource::Snapshot(snap.snapshot_id.clone()))
    );

    let missing = from(
        "x",
        Type::Volume(VolumeSource {
            volume_id: "vol-missing".into(),
        }),
    );
    assert_eq!(
        f.controller
            .create_volume(missing)
            .await
            .unwrap_err()
            .code(),
        Code::NotFound
    );
    let missing = from(
        "y",
        Type::Snapshot(SnapshotSource {
            snapshot_id: "snap-missing".into(),
        }),
    );
    assert_eq!(
        f.controller
            .create_volume(missing)
            .await
            .unwrap_err()
            .code(),
        Code::NotFound
    );
    let smaller = {
        let mut r = from(
            "z",
            Type::Volume(VolumeSource {
                volume_id: src.clone(),
            }),
        );
        r.capacity_range = Some(CapacityRange {
            required_bytes: GI / 2,
            limit_bytes: 0,
        });
        r
    };
    assert_eq!(
        f.controller
            .create_volume(smaller)
            .await
            .unwrap_err()
            .code(),
        Code::OutOfRange
    );

    // Same snapshot name, other source: ALREADY_EXISTS; same source: the same snapshot.
    let clash = CreateSnapshotRequest {
        source_volume_id: v.volume_id.clone(),
        name: "snap-1".into(),
        ..Default::default()
    };
    assert_eq!(
        f.controller
            .create_snapshot(clash)
            .await
            .unwrap_err()
            .code(),
        Code::AlreadyExists
    );
    let again = CreateSnapshotRequest {
        source_volume_id: src,
        name: "snap-1".into(),
        ..Default::default()
    };
    let again = f
        .controller
        .create_snapshot(again)
        .await
        .unwrap()
        .into_inner()
        .snapshot
        .unwrap();
    assert_eq!(again.snapshot_id, snap.snapshot_id);
}

#[tokio::test]
async fn list_volumes_pages_through_every_volume_once_and_rejects_foreign_tokens() {
    let mut f = Fixture::start(|c| c).await;
    let mut created = Vec::new();
    for i in 0..7 {
        created.push(f.create(&format!("pvc-{i}"), GI).await);
    }
    let mut seen = Vec::new();
    let mut token = String::new();
    loop {
        let page = f
            .controller
            .list_volumes(ListVolumesRequest {
                max_entries: 3,
                starting_token: token.clone(),
            })
            .await
            .unwrap()
            .into_inner();
        assert!(page.entries.len() <= 3);
        seen.extend(
            page.entries
                .into_iter()
                .map(|e| e.volume.unwrap().volume_id),
        );
        if page.next_token.is_empty() {
            break;
        }
        token = page.next_token;
    }
    assert_eq!(seen, created);
    let bad = ListVolumesRequest {
        max_entries: 0,
        starting_token: "not-a-token".into(),
    };
    assert_eq!(
        f.controller.list_volumes(bad).await.unwrap_err().code(),
        Code::Aborted
    );
    let bad = ListSnapshotsRequest {
        starting_token: "not-a-token".into(),
        ..Default::default()
    };
    assert_eq!(
        f.controller.list_snapshots(bad).await.unwrap_err().code(),
        Code::Aborted
    );
}

#[tokio::test]
async fn modify_volume_sets_only_the_given_keys() {
    let mut f = Fixture::start(|mut c| {
        c.mutable_parameter_keys = ["iops".to_owned(), "tier".to_owned()].into();
        c
    })
    .await;
    let mut req = create_req("pvc-1", GI);
    req.mutable_parameters = HashMap::from([
        ("iops".into(), "100".into()),
        ("tier".into(), "gold".into()),
    ]);
    let id = f
        .controller
        .create_volume(req)
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap()
        .volume_id;
    let modify = |params: &[(&str, &str)]| ControllerModifyVolumeRequest {
        volume_id: id.clone(),
        mutable_parameters: params
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        ..Default::default()
    };
    f.controller
        .controller_modify_volume(modify(&[("iops", "500")]))
        .await
        .unwrap();
    let params = f
        .driver
        .state()
        .volume(&id)
        .unwrap()
        .mutable_parameters
        .clone();
    assert_eq!(params.get("iops").map(String::as_str), Some("500"));
    assert_eq!(params.get("tier").map(String::as_str), Some("gold"));

    let err = f
        .controller
        .controller_modify_volume(modify(&[("color", "red")]))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    let missing = ControllerModifyVolumeRequest {
        volume_id: "vol-missing".into(),
        mutable_parameters: HashMap::from([("iops".into(), "1".into())]),
        ..Default::default()
    };
    assert_eq!(
        f.controller
            .controller_modify_volume(missing)
            .await
            .unwrap_err()
            .code(),
        Code::NotFound
    );
}

#[tokio::test]
async fn a_switched_off_capability_is_neither_advertised_nor_served() {
    let mut f = Fixture::start(|c| c.without_capability(ControllerCap::ListVolumes)).await;
    let caps = f
        .controller
        .controller_get_capabilities(ControllerGetCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner();
    let has = |caps: &ControllerGetCapabilitiesResponse,
               t: controller_service_capability::rpc::Type| {
        caps.capabilities.iter().any(|c| {
            matches!(&c.r#type, Some(controller_service_capability::Type::Rpc(r)) if r.r#type == t as i32)
        })
    };
    use controller_service_capability::rpc::Type;
    assert!(!has(&caps, Type::ListVolumes));
    assert!(has(&caps, Type::CreateDeleteVolume));
    let err = f
        .controller
        .list_volumes(ListVolumesRequest::default())
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unimplemented);

    // Switched at run time, e.g. to watch a provisioner react.
    f.driver.set_capability(ControllerCap::ListVolumes, true);
    f.driver.set_capability(ControllerCap::CloneVolume, false);
    let caps = f
        .controller
        .controller_get_capabilities(ControllerGetCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner();
    assert!(has(&caps, Type::ListVolumes) && !has(&caps, Type::CloneVolume));
    f.controller
        .list_volumes(ListVolumesRequest::default())
        .await
        .unwrap();
}

#[tokio::test]
async fn identity_reports_the_configured_name_and_a_version() {
    let mut f = Fixture::start(|c| c.with_driver_name("hostpath.csi.k8s.io")).await;
    let info = f
        .identity
        .get_plugin_info(GetPluginInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.name, "hostpath.csi.k8s.io");
    assert!(!info.vendor_version.is_empty());
    let probe = f
        .identity
        .probe(ProbeRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(probe.ready, Some(true));
}
