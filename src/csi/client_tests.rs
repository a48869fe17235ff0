use prometheus_client::encoding::text::encode;

use super::*;

const TIMEOUT: Duration = Duration::from_secs(10);

#[test]
fn expiry_at_the_deadline_is_reported_as_deadline_exceeded() {
    for code in [Code::Cancelled, Code::DeadlineExceeded] {
        let status = normalize(
            method::CREATE_VOLUME,
            Status::new(code, "Timeout expired"),
            TIMEOUT,
            TIMEOUT,
        );
        assert_eq!(status.code(), Code::DeadlineExceeded);
        assert!(
            status
                .message()
                .contains("CreateVolume did not finish within 10s"),
            "{status:?}"
        );
    }
}

#[test]
fn driver_statuses_pass_through_untouched() {
    let early = Duration::from_secs(1);
    for code in [
        Code::DeadlineExceeded,
        Code::Cancelled,
        Code::InvalidArgument,
        Code::Unavailable,
    ] {
        let status = normalize(
            method::CREATE_VOLUME,
            Status::new(code, "from driver"),
            early,
            TIMEOUT,
        );
        assert_eq!((status.code(), status.message()), (code, "from driver"));
    }
}

#[test]
fn transport_failures_become_unavailable_with_the_cause() {
    let io = std::io::Error::new(
        std::io::ErrorKind::ConnectionRefused,
        "Connection refused (os error 111)",
    );
    let local = Status::from_error(Box::new(io));
    let status = normalize(method::DELETE_VOLUME, local, Duration::ZERO, TIMEOUT);
    assert_eq!(status.code(), Code::Unavailable);
    assert_eq!(
        status.message(),
        "/csi.v1.Controller/DeleteVolume: cannot reach the CSI driver: Connection refused"
    );
}

fn exposition(registry: &Registry) -> String {
    let mut text = String::new();
    encode(&mut text, registry).unwrap();
    text
}

#[test]
fn exposes_upstream_name_labels_and_buckets() {
    let mut registry = Registry::default();
    let metrics = OperationMetrics::register(&mut registry);
    metrics.observe(
        "/csi.v1.Identity/Probe",
        Outcome::Code(tonic::Code::Ok),
        Duration::ZERO,
        false,
    );
    metrics.set_driver_name("hostpath.csi.k8s.io");
    metrics.observe(
        "/csi.v1.Controller/CreateVolume",
        Outcome::Code(tonic::Code::DeadlineExceeded),
        Duration::from_millis(300),
        false,
    );
    let text = exposition(&registry);

    assert!(
        text.contains("# TYPE csi_sidecar_operations_seconds histogram"),
        "{text}"
    );
    assert!(
        text.contains(r#"csi_sidecar_operations_seconds_count{driver_name="",grpc_status_code="OK",method_name="/csi.v1.Identity/Probe"} 1"#),
        "{text}"
    );
    let labels = r#"driver_name="hostpath.csi.k8s.io",grpc_status_code="DeadlineExceeded",method_name="/csi.v1.Controller/CreateVolume""#;
    assert!(
        text.contains(&format!(
            "csi_sidecar_operations_seconds_count{{{labels}}} 1"
        )),
        "{text}"
    );
    // 0.3 s falls in the 0.5 bucket but not in 0.25.
    assert!(
        text.contains(&format!(
            r#"csi_sidecar_operations_seconds_bucket{{le="0.25",{labels}}} 0"#
        )),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            r#"csi_sidecar_operations_seconds_bucket{{le="0.5",{labels}}} 1"#
        )),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            r#"csi_sidecar_operations_seconds_bucket{{le="600.0",{labels}}} 1"#
        )),
        "{text}"
    );
}

#[test]
fn code_labels_are_spelled_like_grpc_go() {
    assert_eq!(Outcome::Code(tonic::Code::Ok).label(), "OK");
    assert_eq!(Outcome::Code(tonic::Code::Cancelled).label(), "Canceled");
    assert_eq!(
        Outcome::Code(tonic::Code::InvalidArgument).label(),
        "InvalidArgument"
    );
    assert_eq!(Outcome::NonGrpc.label(), "unknown-non-grpc");
}
