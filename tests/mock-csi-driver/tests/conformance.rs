//! The behaviours upstream csi-sanity v5.4 checks beyond csi-sanity's own first set: mutable
//! parameters a driver does not support, ControllerModifyVolume's error order and empty maps,
//! target paths created and removed by the node service, and GET_SNAPSHOT being opt-in;
//! plus the misbehaviour switches that break each of them on purpose.

mod support;

use std::collections::HashMap;

use mock_csi_driver::csi::v1::*;
use mock_csi_driver::{ControllerCap, Misbehaviour};
use support::{Fixture, create_req, mount_cap};
use tonic::Code;

const GI: i64 = 1 << 30;

fn params(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

fn modify(volume_id: &str, pairs: &[(&str, &str)]) -> ControllerModifyVolumeRequest {
    ControllerModifyVolumeRequest {
        volume_id: volume_id.to_owned(),
        mutable_parameters: params(pairs),
        ..Default::default()
    }
}

#[tokio::test]
async fn create_volume_refuses_mutable_parameters_the_driver_does_not_support() {
    let mut f = Fixture::start(|c| c).await;
    let mut req = create_req("pvc-vac", GI);
    req.mutable_parameters = params(&[("XXX_FakeKey", "XXX_FakeValue")]);
    let err = f.controller.create_volume(req).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(
        err.message().contains("XXX_FakeKey") && err.message().contains("iops"),
        "the message names the bad key and the supported ones: {}",
        err.message()
    );
    assert!(f.driver.state().volumes.is_empty(), "nothing was created");

    // The default keys are supported out of the box.
    let mut req = create_req("pvc-vac", GI);
    req.mutable_parameters = params(&[("iops", "3000"), ("throughput", "125")]);
    f.controller.create_volume(req).await.unwrap();
    let state = f.driver.state();
    let v = state.volume_by_name("pvc-vac").unwrap();
    assert_eq!(v.mutable_parameters["iops"], "3000");
}

#[tokio::test]
async fn modify_of_a_missing_volume_is_not_found_whatever_the_parameters() {
    let mut f = Fixture::start(|c| c).await;
    for pairs in [&[][..], &[("iops", "1")], &[("XXX_FakeKey", "x")]] {
        let err = f
            .controller
            .controller_modify_volume(modify("vol-missing", pairs))
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::NotFound, "{pairs:?}: {err:?}");
    }
    let err = f
        .controller
        .controller_modify_volume(modify("", &[("iops", "1")]))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
}

#[tokio::test]
async fn modify_with_no_parameters_changes_nothing_and_succeeds() {
    let mut f = Fixture::start(|c| c).await;
    let mut req = create_req("pvc-1", GI);
    req.mutable_parameters = params(&[("iops", "3000")]);
    let id = f
        .controller
        .create_volume(req)
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap()
        .volume_id;
    f.controller
        .controller_modify_volume(modify(&id, &[]))
        .await
        .unwrap();
    f.controller
        .controller_modify_volume(modify(&id, &[("iops", "3000")]))
        .await
        .unwrap();
    let state = f.driver.state();
    assert_eq!(
        state.volume(&id).unwrap().mutable_parameters,
        [("iops".to_owned(), "3000".to_owned())].into()
    );
}

#[tokio::test]
async fn modify_with_an_unsupported_key_is_invalid_and_changes_nothing() {
    let mut f = Fixture::start(|c| c).await;
    let plain = f.create("pvc-plain", GI).await;
    let mut req = create_req("pvc-vac", GI);
    req.mutable_parameters = params(&[("iops", "3000")]);
    let with_vac = f
        .controller
        .create_volume(req)
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap()
        .volume_id;
    for id in [&plain, &with_vac] {
        let err = f
            .controller
            .controller_modify_volume(modify(id, &[("iops", "9"), ("XXX_FakeKey", "x")]))
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    }
    let state = f.driver.state();
    assert!(state.volume(&plain).unwrap().mutable_parameters.is_empty());
    assert_eq!(
        state.volume(&with_vac).unwrap().mutable_parameters["iops"],
        "3000",
        "a refused request changes no key, not even the supported one"
    );
}

#[tokio::test]
async fn the_mutable_parameter_switches_break_exactly_their_rule() {
    let mut f = Fixture::start(|c| {
        c.with_misbehaviour(Misbehaviour::AcceptUnknownMutableParameters)
            .with_misbehaviour(Misbehaviour::ModifyUnknownVolumeOk)
    })
    .await;
    let mut req = create_req("pvc-1", GI);
    req.mutable_parameters = params(&[("XXX_FakeKey", "x")]);
    let id = f
        .controller
        .create_volume(req)
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap()
        .volume_id;
    f.controller
        .controller_modify_volume(modify(&id, &[("XXX_Other", "y")]))
        .await
        .unwrap();
    f.controller
        .controller_modify_volume(modify("vol-missing", &[]))
        .await
        .unwrap();
    // A missing volume id is still refused: the switches break one rule each, nothing else.
    let err = f
        .controller
        .controller_modify_volume(modify("", &[]))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
}

#[tokio::test]
async fn refuse_mutable_parameters_on_create_refuses_even_supported_keys() {
    let mut f =
        Fixture::start(|c| c.with_misbehaviour(Misbehaviour::RefuseMutableParametersOnCreate))
            .await;
    let mut req = create_req("pvc-vac", GI);
    req.mutable_parameters = params(&[("iops", "3000")]);
    let err = f.controller.create_volume(req).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    // Without mutable parameters nothing changes.
    f.create("pvc-plain", GI).await;
}

fn publish(volume_id: &str, target: &std::path::Path, block: bool) -> NodePublishVolumeRequest {
    let mut cap = mount_cap();
    if block {
        cap.access_type = Some(volume_capability::AccessType::Block(
            volume_capability::BlockVolume {},
        ));
    }
    NodePublishVolumeRequest {
        volume_id: volume_id.to_owned(),
        target_path: target.to_str().unwrap().to_owned(),
        volume_capability: Some(cap),
        ..Default::default()
    }
}

fn unpublish(volume_id: &str, target: &std::path::Path) -> NodeUnpublishVolumeRequest {
    NodeUnpublishVolumeRequest {
        volume_id: volume_id.to_owned(),
        target_path: target.to_str().unwrap().to_owned(),
    }
}

#[tokio::test]
async fn node_publish_creates_the_target_path_and_unpublish_removes_it() {
    let mut f = Fixture::start(|c| c).await;
    let id = f.create("pvc-1", GI).await;
    let mount = f.path("mount-target");
    let block = f.path("block-target");

    for _ in 0..2 {
        f.node
            .node_publish_volume(publish(&id, &mount, false))
            .await
            .unwrap();
        f.node
            .node_publish_volume(publish(&id, &block, true))
            .await
            .unwrap();
    }
    assert!(mount.is_dir(), "a mount volume's target is a directory");
    assert!(block.is_file(), "a block volume's target is a file");

    for _ in 0..2 {
        f.node
            .node_unpublish_volume(unpublish(&id, &mount))
            .await
            .unwrap();
        f.node
            .node_unpublish_volume(unpublish(&id, &block))
            .await
            .unwrap();
    }
    assert!(!mount.exists() && !block.exists());
}

#[tokio::test]
async fn node_publish_under_a_missing_parent_fails_and_names_the_path() {
    let mut f = Fixture::start(|c| c).await;
    let target = f.path("no-such-parent/target");
    let err = f
        .node
        .node_publish_volume(publish("vol-1", &target, false))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert!(
        err.message().contains("no-such-parent"),
        "{}",
        err.message()
    );
}

#[tokio::test]
async fn node_unpublish_leaves_a_non_empty_directory_alone() {
    let mut f = Fixture::start(|c| c).await;
    let target = f.path("target");
    std::fs::create_dir(&target).unwrap();
    std::fs::write(target.join("data"), b"not ours").unwrap();
    let err = f
        .node
        .node_unpublish_volume(unpublish("vol-1", &target))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Internal);
    assert!(target.join("data").exists());
}

#[tokio::test]
async fn keep_target_path_leaves_the_target_behind() {
    let mut f = Fixture::start(|c| c.with_misbehaviour(Misbehaviour::KeepTargetPath)).await;
    let target = f.path("target");
    f.node
        .node_publish_volume(publish("vol-1", &target, false))
        .await
        .unwrap();
    f.node
        .node_unpublish_volume(unpublish("vol-1", &target))
        .await
        .unwrap();
    assert!(target.is_dir());
}

fn advertises(
    caps: &ControllerGetCapabilitiesResponse,
    t: controller_service_capability::rpc::Type,
) -> bool {
    caps.capabilities.iter().any(|c| {
        matches!(&c.r#type, Some(controller_service_capability::Type::Rpc(r)) if r.r#type == t as i32)
    })
}

#[tokio::test]
async fn the_get_snapshot_capability_is_opt_in() {
    use controller_service_capability::rpc::Type;
    let mut f = Fixture::start(|c| c).await;
    let caps = f
        .controller
        .controller_get_capabilities(ControllerGetCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner();
    assert!(!advertises(&caps, Type::GetSnapshot));
    assert!(advertises(&caps, Type::ModifyVolume));
    let err = f
        .controller
        .get_snapshot(GetSnapshotRequest {
            snapshot_id: "snap-1".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unimplemented);

    let mut f = Fixture::start(|c| c.with_capability(ControllerCap::GetSnapshot)).await;
    let caps = f
        .controller
        .controller_get_capabilities(ControllerGetCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner();
    assert!(advertises(&caps, Type::GetSnapshot));
}
