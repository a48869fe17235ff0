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
