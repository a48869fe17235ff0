//! The `mock-csi-driver` binary as other crates' tests run it: --help, bad flags, crash-after-create
//! with a state file and a restart, SIGTERM, stale sockets, and secrets kept out of the log.

mod support;

use std::path::Path;
use std::process::Command;

use mock_csi_driver::csi::v1::*;
use mock_csi_driver::process::MockDriverProcess;
use mock_csi_driver::{CRASH_EXIT_CODE, FaultRule};
use support::create_req;
use tonic::Code;

const GI: i64 = 1 << 30;
const BIN: &str = env!("CARGO_BIN_EXE_mock-csi-driver");

fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

async fn controller(
    endpoint: &Path,
) -> controller_client::ControllerClient<tonic::transport::Channel> {
    controller_client::ControllerClient::new(mock_csi_driver::connect(endpoint).await.unwrap())
}

#[test]
fn help_documents_the_endpoint_fault_and_control_flags() {
    let out = Command::new(BIN).arg("--help").output().unwrap();
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    for flag in [
        "--endpoint",
        "--drivername",
        "--nodeid",
        "--topology",
        "--topology-key",
        "--state-file",
        "--control",
        "--fail",
        "--latency",
        "--crash-after-create",
        "--disable-capability",
        "--require-secret",
    ] {
        assert!(help.contains(flag), "--help does not mention {flag}");
    }
}

#[test]
fn a_bad_flag_value_exits_with_a_message_saying_what_to_use() {
    let out = Command::new(BIN)
        .args([
            "--endpoint",
            "/tmp/unused.sock",
            "--nodeid",
            "n1",
            "--fail",
            "CreateVolume=SOMETIMES",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("UNAVAILABLE"), "{err}");
}

#[tokio::test]
async fn crash_after_create_exits_86_and_the_restarted_driver_still_lists_the_volume() {
    let dir = tempfile::tempdir().unwrap();
    let (sock, ctl, state) = (
        dir.path().join("csi.sock"),
        dir.path().join("ctl.sock"),
        dir.path().join("state.json"),
    );
    let state_arg = state.display().to_string();
    let base = [
        "--nodeid",
        "node-a",
        "--topology",
        "--state-file",
        state_arg.as_str(),
    ];
    let mut with_crash = args(&base);
    with_crash.extend(args(&["--crash-after-create", "1"]));

    let mut driver = MockDriverProcess::spawn(&sock, &ctl, &with_crash)
        .await
        .unwrap();
    let err = controller(&sock)
        .await
        .create_volume(create_req("pvc-1", GI))
        .await
        .unwrap_err();
    assert!(
        matches!(
            err.code(),
            Code::Unavailable | Code::Unknown | Code::Cancelled | Code::Internal
        ),
        "{err:?}"
    );
    let status = driver.wait().await.unwrap();
    assert_eq!(status.code(), Some(CRASH_EXIT_CODE));

    let driver = MockDriverProcess::spawn(&sock, &ctl, &args(&base))
        .await
        .unwrap();
    let mut c = controller(&sock).await;
    let listed = c
        .list_volumes(ListVolumesRequest::default())
        .await
        .unwrap()
        .into_inner()
        .entries;
    assert_eq!(listed.len(), 1);
    let volume = listed[0].volume.clone().unwrap();
    let record = driver
        .control()
        .state()
        .await
        .unwrap()
        .volume(&volume.volume_id)
        .cloned()
        .unwrap();
    assert_eq!(
        (record.name.as_str(), record.node.as_str()),
        ("pvc-1", "node-a")
    );
    let retry = c
        .create_volume(create_req("pvc-1", GI))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert_eq!(retry.volume_id, volume.volume_id);
    assert_eq!(driver.control().state().await.unwrap().volumes.len(), 1);
}

#[tokio::test]
async fn sigterm_stops_the_driver_cleanly_and_removes_its_sockets() {
    let dir = tempfile::tempdir().unwrap();
    let (sock, ctl) = (dir.path().join("csi.sock"), dir.path().join("ctl.sock"));
    let driver = MockDriverProcess::spawn(&sock, &ctl, &args(&["--nodeid", "n1"]))
        .await
        .unwrap();
    // An open client connection must not keep the driver alive.
    let mut c = controller(&sock).await;
    c.controller_get_capabilities(ControllerGetCapabilitiesRequest {})
        .await
        .unwrap();
    let status = driver.terminate().await.unwrap();
    assert!(status.success(), "{status:?}");
    assert!(!sock.exists() && !ctl.exists());
}

#[tokio::test]
async fn a_stale_socket_file_from_an_earlier_run_is_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let (sock, ctl) = (dir.path().join("csi.sock"), dir.path().join("ctl.sock"));
    drop(std::os::unix::net::UnixListener::bind(&sock).unwrap());
    assert!(sock.exists());
    let _driver = MockDriverProcess::spawn(&sock, &ctl, &args(&["--nodeid", "n1"]))
        .await
        .unwrap();
    controller(&sock)
        .await
        .controller_get_capabilities(ControllerGetCapabilitiesRequest {})
        .await
        .unwrap();
}

#[tokio::test]
async fn secret_values_never_reach_the_log_or_the_state_dump() {
    let dir = tempfile::tempdir().unwrap();
    let (sock, ctl, log) = (
        dir.path().join("csi.sock"),
        dir.path().join("ctl.sock"),
        dir.path().join("driver.log"),
    );
    let flags = args(&[
        "--nodeid",
        "n1",
        "--require-secret",
        "password=Tr0ub4dor-SECRET",
        "--log-format",
        "json",
    ]);
    let driver = MockDriverProcess::spawn_logging_to(&sock, &ctl, &flags, &log)
        .await
        .unwrap();
    driver
        .control()
        .set_fault("ListVolumes", FaultRule::times(Code::Internal, 1))
        .await
        .unwrap();
    let mut c = controller(&sock).await;

    let mut wrong = create_req("pvc-1", GI);
    wrong
        .secrets
        .insert("password".into(), "wrong-GUESS-value".into());
    assert_eq!(
        c.create_volume(wrong).await.unwrap_err().code(),
        Code::Unauthenticated
    );
    let mut right = create_req("pvc-1", GI);
    right
        .secrets
        .insert("password".into(), "Tr0ub4dor-SECRET".into());
    let id = c
        .create_volume(right)
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap()
        .volume_id;
    let mut delete = DeleteVolumeRequest {
        volume_id: id,
        ..Default::default()
    };
    delete
        .secrets
        .insert("password".into(), "Tr0ub4dor-SECRET".into());
    c.delete_volume(delete).await.unwrap();
    let dump = serde_json::to_string(&driver.control().state().await.unwrap()).unwrap();
    driver.terminate().await.unwrap();

    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.contains("CreateVolume: volume created"),
        "the log is captured: {text}"
    );
    for secret in ["Tr0ub4dor-SECRET", "wrong-GUESS-value"] {
        assert!(!text.contains(secret), "the log leaks {secret}");
        assert!(!dump.contains(secret), "the state dump leaks {secret}");
    }
}
