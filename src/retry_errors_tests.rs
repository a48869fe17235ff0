use super::*;
use kube::core::response::StatusDetails;

fn api(code: u16, reason: &str) -> kube::Error {
    kube::Error::Api(Status::failure("boom", reason).with_code(code).boxed())
}

#[test]
fn each_status_code_maps_to_what_the_controller_should_do() {
    let table: &[(u16, &str, ApiErrorClass)] = &[
        (409, "Conflict", ApiErrorClass::Conflict),
        (409, "AlreadyExists", ApiErrorClass::AlreadyExists),
        (404, "NotFound", ApiErrorClass::NotFound),
        (410, "Gone", ApiErrorClass::Gone),
        (410, "Expired", ApiErrorClass::Gone),
        (
            429,
            "TooManyRequests",
            ApiErrorClass::Throttled { retry_after: None },
        ),
        (500, "InternalError", ApiErrorClass::ServerError),
        (500, "ServerTimeout", ApiErrorClass::ServerError),
        (503, "ServiceUnavailable", ApiErrorClass::ServerError),
        (504, "Timeout", ApiErrorClass::ServerError),
        (422, "Invalid", ApiErrorClass::Invalid),
        (403, "Forbidden", ApiErrorClass::Forbidden),
        (401, "Unauthorized", ApiErrorClass::Forbidden),
        (400, "BadRequest", ApiErrorClass::Other),
        (415, "UnsupportedMediaType", ApiErrorClass::Other),
    ];
    for &(code, reason, want) in table {
        assert_eq!(classify(&api(code, reason)), want, "{code} {reason}");
    }
}

#[test]
fn the_code_decides_when_the_reason_is_missing_or_unknown() {
    let table: &[(u16, ApiErrorClass)] = &[
        (409, ApiErrorClass::Conflict),
        (404, ApiErrorClass::NotFound),
        (410, ApiErrorClass::Gone),
        (422, ApiErrorClass::Invalid),
        (403, ApiErrorClass::Forbidden),
        (502, ApiErrorClass::ServerError),
        (418, ApiErrorClass::Other),
    ];
    for &(code, want) in table {
        assert_eq!(classify(&api(code, "")), want, "{code} without reason");
        assert_eq!(
            classify(&api(code, "SomethingNew")),
            want,
            "{code} unknown reason"
        );
    }
}

#[test]
fn a_known_reason_wins_over_a_contradicting_code() {
    // apimachinery trusts the reason: a 500 that says NotFound is NotFound.
    assert_eq!(classify(&api(500, "NotFound")), ApiErrorClass::NotFound);
}

#[test]
fn throttling_carries_the_servers_retry_after() {
    let status = Status::failure("slow down", "TooManyRequests")
        .with_code(429)
        .with_details(StatusDetails {
            name: String::new(),
            group: String::new(),
            kind: String::new(),
            uid: String::new(),
            causes: vec![],
            retry_after_seconds: 7,
        });
    let class = classify(&kube::Error::Api(status.boxed()));
    assert_eq!(class.retry_after(), Some(Duration::from_secs(7)));
    assert!(class.is_retryable());
}

#[test]
fn transport_failures_are_retryable_and_decode_failures_are_not() {
    let transport = kube::Error::Service("connection refused".into());
    assert_eq!(classify(&transport), ApiErrorClass::Transport);
    assert!(classify(&transport).is_retryable());

    let decode = kube::Error::SerdeError(serde_json::from_str::<u8>("x").unwrap_err());
    assert_eq!(classify(&decode), ApiErrorClass::Other);
    assert!(!classify(&decode).is_retryable());
}

/// Issue 28: an API error reads as upstream's `err.Error()`, the server's own message.
#[test]
fn an_api_error_reads_as_the_servers_message() {
    let missing = kube::Error::Api(
        Status::failure(r#"secrets "missing-secret" not found"#, "NotFound")
            .with_code(404)
            .boxed(),
    );
    assert_eq!(describe(&missing), r#"secrets "missing-secret" not found"#);
    let bare = kube::Error::Api(
        Status::failure("", "ServiceUnavailable")
            .with_code(503)
            .boxed(),
    );
    let text = describe(&bare);
    assert!(text.contains("503") && !text.contains("Status {"), "{text}");
}

#[test]
fn watch_failures_read_like_the_reflector_without_a_status_dump() {
    use kube::runtime::watcher::Error;
    let not_found = || {
        kube::Error::Api(
            Status::failure(
                "the server could not find the requested resource",
                "NotFound",
            )
            .with_code(404)
            .boxed(),
        )
    };
    assert_eq!(
        describe_watch(&Error::InitialListFailed(not_found())),
        "failed to list: the server could not find the requested resource"
    );
    assert_eq!(
        describe_watch(&Error::WatchStartFailed(not_found())),
        "failed to watch: the server could not find the requested resource"
    );
    assert_eq!(
        describe_watch(&Error::WatchFailed(not_found())),
        "watch ended with: the server could not find the requested resource"
    );
    let gone = Status::failure("too old resource version: 1 (2)", "Expired").with_code(410);
    assert_eq!(
        describe_watch(&Error::WatchError(gone.boxed())),
        "watch ended with: too old resource version: 1 (2)"
    );
}

#[test]
fn only_transient_classes_are_retryable() {
    let retryable = [
        ApiErrorClass::Conflict,
        ApiErrorClass::Gone,
        ApiErrorClass::Throttled { retry_after: None },
        ApiErrorClass::ServerError,
        ApiErrorClass::Transport,
    ];
    let final_ = [
        ApiErrorClass::NotFound,
        ApiErrorClass::AlreadyExists,
        ApiErrorClass::Invalid,
        ApiErrorClass::Forbidden,
        ApiErrorClass::Other,
    ];
    assert!(retryable.iter().all(|c| c.is_retryable()));
    assert!(final_.iter().all(|c| !c.is_retryable()));
}
