use super::*;

#[derive(Debug, thiserror::Error)]
#[error("transport error")]
struct Wrapper(#[source] std::io::Error);

#[test]
fn describes_the_os_error_without_its_number() {
    let io = std::io::Error::from_raw_os_error(2);
    assert_eq!(describe_error(&Wrapper(io)), "No such file or directory");
}

#[test]
fn describes_non_io_chains_once_per_piece() {
    #[derive(Debug, thiserror::Error)]
    #[error("h2 protocol error: connection reset")]
    struct Reset;
    #[derive(Debug, thiserror::Error)]
    #[error("transport error")]
    struct Outer(#[source] Reset);
    assert_eq!(
        describe_error(&Outer(Reset)),
        "transport error: h2 protocol error: connection reset"
    );
}

#[test]
fn strips_only_a_trailing_os_error() {
    assert_eq!(
        strip_os_error_suffix("Connection refused (os error 111)"),
        "Connection refused"
    );
    assert_eq!(strip_os_error_suffix("plain"), "plain");
}

#[tokio::test]
async fn gives_up_when_shutdown_is_requested() {
    let dir = tempfile::tempdir().unwrap();
    let (stop, shutdown) = watch::channel(false);
    let endpoint = Endpoint::from_path(dir.path().join("never.sock"));
    let waiting = tokio::spawn(connect(endpoint, ConnectOptions::new(shutdown)));
    stop.send(true).unwrap();
    let result = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .unwrap()
        .unwrap();
    assert!(matches!(result, Err(ConnectError::Cancelled(p)) if p.ends_with("never.sock")));
}
