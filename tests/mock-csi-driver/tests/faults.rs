//! Fault switches of the in-process driver and of the control socket: errors by count, after
//! the effect, latency past the caller's deadline, probe not-ready, crash-after-create with a
//! state file, and the deliberate misbehaviours.

mod support;

use std::time::Duration;

use mock_csi_driver::csi::v1::*;
use mock_csi_driver::{Config, ControlClient, FaultRule, Misbehaviour, MockDriver, Trigger};
use support::{Fixture, PATIENCE, create_req, wait_for};
use tonic::Code;

const GI: i64 = 1 << 30;

#[tokio::test]
async fn an_error_set_over_the_control_socket_fails_exactly_that_many_calls() {
    let mut f = Fixture::start(|c| {
        let control = c.endpoint.with_file_name("control.sock");
        c.with_control(control)
    })
    .await;
    let control = ControlClient::connect(f.driver.config().control.clone().unwrap())
        .await
        .unwrap();
    control
        .set_fault("CreateVolume", FaultRule::times(Code::Unavailable, 2))
        .await
        .unwrap();

    let mut codes = Vec::new();
    for _ in 0..3 {
        codes.push(
            f.controller
                .create_volume(create_req("pvc-1", GI))
                .await
                .err()
                .map(|e| e.code()),
        );
    }
    assert_eq!(
        codes,
        vec![Some(Code::Unavailable), Some(Code::Unavailable), None]
    );

    let state = control.state().await.unwrap();
    assert_eq!(state.volumes.len(), 1);
    let calls = state.calls["CreateVolume"];
    assert_eq!((calls.total, calls.ok, calls.failed), (3, 1, 2));
    assert!(
        state.switches.faults.is_empty(),
        "a used-up rule switches itself off"
    );

    control.reset_counts().await.unwrap();
    assert_eq!(control.state().await.unwrap().calls("CreateVolume"), 0);
    let err = control
        .set_fault("CreateVolumes", FaultRule::always(Code::Internal))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("unknown CSI method"), "{err}");
}

#[tokio::test]
async fn an_error_after_the_effect_leaves_the_volume_created_and_a_retry_returns_it() {
    let mut f = Fixture::start(|c| c).await;
    f.driver
        .set_fault(
            "CreateVolume",
            FaultRule::times(Code::DeadlineExceeded, 1).after_effect(),
        )
        .unwrap();
    let err = f
        .controller
        .create_volume(create_req("pvc-1", GI))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::DeadlineExceeded);
    let created = f
        .driver
        .state()
        .volume_by_name("pvc-1")
        .cloned()
        .expect("the volume exists despite the error");
    let again = f
        .controller
        .create_volume(create_req("pvc-1", GI))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert_eq!(again.volume_id, created.id);
    assert_eq!(f.driver.state().volumes.len(), 1);
}

#[tokio::test]
async fn latency_past_the_callers_deadline_times_out_but_the_volume_is_still_created() {
    let mut f = Fixture::start(|c| c).await;
    f.driver
        .set_latency("CreateVolume", Duration::from_millis(300))
        .unwrap();
    let mut req = tonic::Request::new(create_req("pvc-slow", GI));
    req.set_timeout(Duration::from_millis(20));
    let err = f.controller.create_volume(req).await.unwrap_err();
    assert!(
        matches!(err.code(), Code::DeadlineExceeded | Code::Cancelled),
        "{err:?}"
    );
    // The backend keeps working after the caller gave up, like a real one.
    let id = wait_for("the slow create to finish", PATIENCE, || {
        f.driver
            .state()
            .volume_by_name("pvc-slow")
            .map(|v| v.id.clone())
    })
    .await;
    f.driver
        .set_latency("CreateVolume", Duration::ZERO)
        .unwrap();
    let again = f
        .controller
        .create_volume(create_req("pvc-slow", GI))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert_eq!(again.volume_id, id);
}

#[tokio::test]
async fn probe_reports_not_ready_for_the_first_probes_then_ready() {
    let mut f = Fixture::start(|mut c| {
        c.probe_not_ready.count = 2;
        c
    })
    .await;
    let mut answers = Vec::new();
    for _ in 0..3 {
        answers.push(
            f.identity
                .probe(ProbeRequest {})
                .await
                .unwrap()
                .into_inner()
                .ready,
        );
    }
    assert_eq!(answers, vec![Some(false), Some(false), Some(true)]);

    f.driver.set_probe_not_ready(0, Duration::from_secs(3600));
    assert_eq!(
        f.identity
            .probe(ProbeRequest {})
            .await
            .unwrap()
            .into_inner()
            .ready,
        Some(false)
    );
    f.driver.clear_faults();
    assert_eq!(
        f.identity
            .probe(ProbeRequest {})
            .await
            .unwrap()
            .into_inner()
            .ready,
        Some(true)
    );
}

#[tokio::test]
async fn crash_after_create_persists_the_volume_and_a_restarted_driver_returns_it_once() {
    let dir = tempfile::tempdir().unwrap();
    let config = Config::new(dir.path().join("csi.sock"), "n1")
        .with_state_file(dir.path().join("state.json"));
    let mut crashing = config.clone();
    crashing.crash_after_create = Some(2);
    let mut f = Fixture::start_in(dir, crashing).await;

    f.create("pvc-0", GI).await;
    let err = f
        .controller
        .create_volume(create_req("pvc-1", GI))
        .await
        .unwrap_err();
    assert!(
        f.driver.has_crashed(),
        "the second create crashes the driver, got {err:?}"
    );
    f.driver.shutdown();

    let restarted = MockDriver::start(config).unwrap();
    let mut controller = controller_client::ControllerClient::new(
        mock_csi_driver::connect(restarted.endpoint())
            .await
            .unwrap(),
    );
    let listed = controller
        .list_volumes(ListVolumesRequest::default())
        .await
        .unwrap()
        .into_inner()
        .entries;
    assert_eq!(listed.len(), 2, "both volumes survived the crash");
    let before = restarted.state().volume_by_name("pvc-1").cloned().unwrap();
    assert_eq!(before.node, "n1");
    let retry = controller
        .create_volume(create_req("pvc-1", GI))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert_eq!(
        retry.volume_id, before.id,
        "the retry after the crash is not provisioned twice"
    );
    assert_eq!(restarted.state().volumes.len(), 2);
}

#[tokio::test]
async fn misbehaviours_break_exactly_the_rule_they_name() {
    let mut f = Fixture::start(|c| c.with_misbehaviour(Misbehaviour::NonIdempotentCreate)).await;
    let a = f.create("pvc-1", GI).await;
    let b = f.create("pvc-1", GI).await;
    assert_ne!(a, b);

    f.driver
        .set_misbehaviour(Misbehaviour::NonIdempotentCreate, false);
    f.driver
        .set_misbehaviour(Misbehaviour::DeleteUnknownNotFound, true);
    let err = f
        .controller
        .delete_volume(DeleteVolumeRequest {
            volume_id: "nope".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);

    f.driver
        .set_misbehaviour(Misbehaviour::AcceptBadListToken, true);
    f.controller
        .list_volumes(ListVolumesRequest {
            max_entries: 0,
            starting_token: "junk".into(),
        })
        .await
        .unwrap();

    f.driver
        .set_misbehaviour(Misbehaviour::UndersizedVolumes, true);
    let v = f
        .controller
        .create_volume(create_req("pvc-2", GI))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert_eq!(v.capacity_bytes, GI / 2);

    f.driver
        .set_misbehaviour(Misbehaviour::DropContentSource, true);
    let mut clone = create_req("pvc-3", GI);
    clone.volume_content_source = Some(VolumeContentSource {
        r#type: Some(volume_content_source::Type::Volume(
            volume_content_source::VolumeSource { volume_id: a },
        )),
    });
    let v = f
        .controller
        .create_volume(clone)
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert!(v.content_source.is_none());
}

#[tokio::test]
async fn a_rate_fault_of_one_fails_every_call_until_cleared() {
    let mut f = Fixture::start(|c| c).await;
    f.driver
        .set_fault(
            "*",
            FaultRule {
                code: Code::Unavailable,
                trigger: Trigger::Rate { rate: 1.0 },
                after: false,
            },
        )
        .unwrap();
    for _ in 0..5 {
        assert_eq!(
            f.identity
                .get_plugin_info(GetPluginInfoRequest {})
                .await
                .unwrap_err()
                .code(),
            Code::Unavailable
        );
    }
    f.driver.clear_faults();
    f.identity
        .get_plugin_info(GetPluginInfoRequest {})
        .await
        .unwrap();
    assert_eq!(f.driver.state().calls["GetPluginInfo"].failed, 5);
}
