//! csi-sanity against the mock driver: a correct mock passes every check (with topology,
//! secrets and mutable parameters, so no check is skipped) and leaves nothing behind; each
//! deliberately broken mock makes exactly the check for the broken rule fail, and the binary
//! exits non-zero.

use std::collections::HashMap;
use std::process::Command;
use std::time::Duration;

use csi_sanity::{Options, Outcome, Pattern, Report, Secrets};
use mock_csi_driver::{Config, FaultRule, Misbehaviour, MockDriver, MockDriverHandle};

const SECRET: &str = "sanity-Secret-Value";

struct Setup {
    _dir: tempfile::TempDir,
    driver: MockDriverHandle,
    opts: Options,
}

/// A topology-aware mock requiring secrets, and options that exercise every check.
fn setup(tweak: impl FnOnce(Config) -> Config) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let mut config = Config::new(dir.path().join("csi.sock"), "node-1")
        .with_topology()
        .with_required_secret("password", SECRET);
    config.max_volume_size = Some(100 << 30);
    config.mutable_parameter_keys = ["iops".to_owned()].into();
    let driver = MockDriver::start(tweak(config)).unwrap();
    let mut opts = Options::new(driver.endpoint());
    let secret = HashMap::from([("password".to_owned(), SECRET.to_owned())]);
    for section in ["CreateVolumeSecret", "DeleteVolumeSecret"] {
        opts.secrets.set(section, secret.clone());
    }
    opts.test_volume_size = 1 << 30;
    opts.test_volume_mutable_parameters = HashMap::from([("iops".to_owned(), "3000".to_owned())]);
    opts.timeout = Duration::from_secs(20);
    Setup {
        _dir: dir,
        driver,
        opts,
    }
}

async fn run(opts: Options) -> (Report, String) {
    let mut out = Vec::new();
    let report = csi_sanity::run(opts, &mut out).await.unwrap();
    (report, String::from_utf8(out).unwrap())
}

fn assert_fails(report: &Report, name: &str) {
    match report.outcome(name) {
        Some(Outcome::Fail(_)) => {}
        other => panic!("{name} should fail against the broken mock, got {other:?}"),
    }
}

#[tokio::test]
async fn the_mock_driver_passes_every_check_and_is_left_clean() {
    let s = setup(|c| c);
    let (report, out) = run(s.opts.clone()).await;
    assert!(report.success(), "{out}");
    assert_eq!(
        report.skipped(),
        0,
        "every check applies to the full mock:\n{out}"
    );
    assert_eq!(report.passed(), csi_sanity::checks::all().len());
    assert_eq!(
        out.lines().last().unwrap(),
        format!("{} passed, 0 failed, 0 skipped", report.passed())
    );
    let state = s.driver.state();
    assert!(
        state.volumes.is_empty() && state.snapshots.is_empty(),
        "csi-sanity left objects behind: {state:#?}"
    );
    assert!(!out.contains(SECRET));
}

#[tokio::test]
async fn checks_for_capabilities_the_driver_lacks_are_skipped_not_failed() {
    let s = setup(|mut c| {
        c.capabilities.clear();
        c.capabilities
            .insert(mock_csi_driver::ControllerCap::CreateDeleteVolume);
        c.topology = false;
        c
    });
    let mut opts = s.opts.clone();
    opts.secrets = Secrets::default();
    opts.secrets.set(
        "CreateVolumeSecret",
        HashMap::from([("password".to_owned(), SECRET.to_owned())]),
    );
    opts.secrets.set(
        "DeleteVolumeSecret",
        HashMap::from([("password".to_owned(), SECRET.to_owned())]),
    );
    let (report, out) = run(opts).await;
    assert!(report.success(), "{out}");
    for name in [
        "controller/list-volumes/pagination",
        "controller/create-snapshot/basic",
        "controller/create-volume/clone",
        "controller/create-volume/topology",
    ] {
        assert!(
            matches!(report.outcome(name), Some(Outcome::Skip(_))),
            "{name}: {out}"
        );
    }
    assert!(
        out.contains(
            "SKIP controller/list-volumes/pagination: driver does not advertise LIST_VOLUMES"
        ),
        "{out}"
    );
}

#[tokio::test]
async fn a_non_idempotent_create_fails_the_idempotency_check_and_everything_is_still_cleaned_up() {
    let s = setup(|c| c.with_misbehaviour(Misbehaviour::NonIdempotentCreate));
    let mut opts = s.opts.clone();
    opts.focus = vec![Pattern::new("controller/create-volume/idempotent")];
    let (report, out) = run(opts).await;
    assert_fails(&report, "controller/create-volume/idempotent");
    assert!(out.contains("returned two volumes"), "{out}");
    assert_eq!(out.lines().last().unwrap(), "0 passed, 1 failed, 0 skipped");
    assert!(
        s.driver.state().volumes.is_empty(),
        "both volumes of the failed check are deleted"
    );
}

#[tokio::test]
async fn each_broken_rule_fails_its_check() {
    let cases: &[(Misbehaviour, &str)] = &[
        (
            Misbehaviour::DeleteUnknownNotFound,
            "controller/delete-volume/unknown-id",
        ),
        (
            Misbehaviour::AcceptBadListToken,
            "controller/list-volumes/invalid-token",
        ),
        (
            Misbehaviour::UndersizedVolumes,
            "controller/create-volume/basic",
        ),
        (
            Misbehaviour::EmptyVolumeId,
            "controller/create-volume/basic",
        ),
        (
            Misbehaviour::DropContentSource,
            "controller/create-volume/clone",
        ),
        (
            Misbehaviour::DropContentSource,
            "controller/create-volume/from-snapshot",
        ),
    ];
    for (m, check) in cases {
        let s = setup(|c| c.with_misbehaviour(*m));
        let mut opts = s.opts.clone();
        opts.focus = vec![Pattern::new(&format!("^{check}$"))];
        let (report, out) = run(opts).await;
        assert_fails(&report, check);
        assert_eq!(report.results.len(), 1, "{out}");
    }
}

#[tokio::test]
async fn a_wrong_error_code_fails_the_check_and_names_both_codes() {
    let s = setup(|c| c);
    s.driver
        .set_fault("ListVolumes", FaultRule::always(tonic::Code::Internal))
        .unwrap();
    let mut opts = s.opts.clone();
    opts.focus = vec![Pattern::new("list-volumes/invalid-token")];
    let (report, out) = run(opts).await;
    assert_fails(&report, "controller/list-volumes/invalid-token");
    assert!(
        out.contains("got INTERNAL") && out.contains("requires ABORTED"),
        "{out}"
    );
}

#[tokio::test]
async fn a_driver_that_is_not_ready_at_first_is_waited_for() {
    let s = setup(|mut c| {
        c.probe_not_ready.count = 5;
        c
    });
    let mut opts = s.opts.clone();
    opts.focus = vec![Pattern::new("^identity/")];
    let (report, out) = run(opts).await;
    assert!(report.success(), "{out}");
    assert!(s.driver.state().calls("Probe") >= 6);
}

#[tokio::test]
async fn a_failing_delete_during_cleanup_fails_the_check() {
    let s = setup(|c| c);
    // Every DeleteVolume fails, so the volume of a passing check cannot be removed.
    s.driver
        .set_fault("DeleteVolume", FaultRule::always(tonic::Code::Internal))
        .unwrap();
    let mut opts = s.opts.clone();
    opts.focus = vec![Pattern::new("create-volume/idempotent")];
    let (report, out) = run(opts).await;
    assert_fails(&report, "controller/create-volume/idempotent");
    assert!(out.contains("cleanup failed"), "{out}");
}

#[tokio::test]
async fn the_binary_reports_one_line_per_check_and_exits_by_outcome() {
    let bin = env!("CARGO_BIN_EXE_csi-sanity");
    let s = setup(|c| c.with_misbehaviour(Misbehaviour::DeleteUnknownNotFound));
    let dir = tempfile::tempdir().unwrap();
    let secrets = dir.path().join("secrets.yaml");
    std::fs::write(
        &secrets,
        format!(
            "CreateVolumeSecret:\n  password: {SECRET}\nDeleteVolumeSecret:\n  password: {SECRET}\n"
        ),
    )
    .unwrap();
    let address = format!("unix://{}", s.driver.endpoint().display());
    let sanity = |extra: &[&str]| {
        let out = Command::new(bin)
            .args([
                "--csi-address",
                &address,
                "--secrets-file",
                secrets.to_str().unwrap(),
                "--test-volume-size",
                "1073741824",
            ])
            .args(extra)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };

    let (code, out) = sanity(&["--focus", "delete-volume", "--skip", "without-secrets"]);
    assert_eq!(code, Some(1), "{out}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 4, "{out}");
    assert!(
        lines.contains(&"PASS controller/delete-volume/missing-id"),
        "{out}"
    );
    // A second DeleteVolume of a deleted volume is a delete of an unknown id, too.
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("FAIL controller/delete-volume/unknown-id: ")),
        "{out}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("FAIL controller/delete-volume/idempotent: ")),
        "{out}"
    );
    assert_eq!(lines[3], "1 passed, 2 failed, 0 skipped");

    s.driver
        .set_misbehaviour(Misbehaviour::DeleteUnknownNotFound, false);
    let (code, out) = sanity(&["--focus", "delete-volume"]);
    assert_eq!(code, Some(0), "{out}");

    let (code, _) = sanity(&["--focus", "no-such-check"]);
    assert_eq!(code, Some(2));
    let out = Command::new(bin).arg("--list").output().unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains("controller/list-volumes/pagination\t"));
}
