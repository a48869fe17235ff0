//! Classification of Kubernetes API errors into what a controller should do next.
//!
//! Every shell asks this module, never `err.to_string().contains(..)`: a 409 means "re-read and try
//! again", a 404 "the object is gone", 429/5xx/transport "back off and retry", anything else is final
//! for this attempt and deserves an event. The mapping follows apimachinery's `errors.Is*` helpers:
//! the `reason` field wins when it is a known reason, the HTTP code decides otherwise.

use std::time::Duration;

use kube::core::Status;

/// What a failed Kubernetes API call means for the caller.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ApiErrorClass {
    /// 409 Conflict: the object changed under us (resourceVersion / UID precondition). Re-read, retry.
    Conflict,
    /// 404: the object (or its namespace) does not exist.
    NotFound,
    /// 409 AlreadyExists on create.
    AlreadyExists,
    /// 410 Gone / Expired: typically a too-old resourceVersion on list/watch; re-list.
    Gone,
    /// 429 TooManyRequests: the server asks us to slow down, optionally saying for how long.
    Throttled {
        /// `details.retryAfterSeconds` when the server sent one.
        retry_after: Option<Duration>,
    },
    /// 5xx (including ServerTimeout, Timeout, InternalError, ServiceUnavailable).
    ServerError,
    /// 422 Invalid: the write was rejected (also a failed JSON-patch `test` op on the real server,
    /// and "no new finalizers can be added if the object is being deleted").
    Invalid,
    /// 401/403: credentials or RBAC. Retrying will not help until someone fixes the permissions.
    Forbidden,
    /// The request never got an answer from the API server (connection, TLS, timeout, auth plugin).
    Transport,
    /// Anything else (400, 405, 415, undecodable responses, request-building bugs).
    Other,
}

impl ApiErrorClass {
    /// Whether repeating the same request after a short backoff can succeed without anyone else
    /// changing anything. Final classes (`NotFound`, `AlreadyExists`, `Invalid`, `Forbidden`,
    /// `Other`) still go through the per-object backoff of the shells: upstream retries every
    /// failure forever, this only says whether an *immediate* retry loop makes sense.
    pub(crate) fn is_retryable(self) -> bool {
        match self {
            Self::Conflict
            | Self::Gone
            | Self::Throttled { .. }
            | Self::ServerError
            | Self::Transport => true,
            Self::NotFound
            | Self::AlreadyExists
            | Self::Invalid
            | Self::Forbidden
            | Self::Other => false,
        }
    }

    /// The minimum wait the server asked for, if any.
    pub(crate) fn retry_after(self) -> Option<Duration> {
        match self {
            Self::Throttled { retry_after } => retry_after,
            _ => None,
        }
    }

    /// Short stable name, for logs and metric labels.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Conflict => "conflict",
            Self::NotFound => "not_found",
            Self::AlreadyExists => "already_exists",
            Self::Gone => "gone",
            Self::Throttled { .. } => "throttled",
            Self::ServerError => "server_error",
            Self::Invalid => "invalid",
            Self::Forbidden => "forbidden",
            Self::Transport => "transport",
            Self::Other => "other",
        }
    }
}

impl std::fmt::Display for ApiErrorClass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `err` as upstream's Go code prints it (`err.Error()` of a client-go error): the API server's
/// own message (`secrets "x" not found`), never kube's rendering of the whole Status structure.
/// Every error text with a `kube::Error` in it, in events and logs alike, goes through here.
pub(crate) fn describe(err: &kube::Error) -> String {
    match err {
        kube::Error::Api(status) if !status.message.is_empty() => status.message.clone(),
        // client-go's text for a Status without a message names the reason and code.
        kube::Error::Api(status) => format!(
            "the server responded with the status code {} but did not return more information ({})",
            status.code,
            if status.reason.is_empty() {
                "unknown"
            } else {
                status.reason.as_str()
            }
        ),
        other => other.to_string(),
    }
}

/// A watch failure as client-go's reflector words it (`failed to list ...: <err>`), the inner
/// `kube::Error` through [`describe`]: kube's own Display would dump the whole Status.
pub(crate) fn describe_watch(err: &kube::runtime::watcher::Error) -> String {
    use kube::runtime::watcher::Error;
    match err {
        Error::InitialListFailed(e) => format!("failed to list: {}", describe(e)),
        Error::WatchStartFailed(e) => format!("failed to watch: {}", describe(e)),
        Error::WatchFailed(e) => format!("watch ended with: {}", describe(e)),
        Error::WatchError(status) => format!(
            "watch ended with: {}",
            describe(&kube::Error::Api(status.clone()))
        ),
        Error::NoResourceVersion => err.to_string(),
    }
}

/// Classifies any error returned by a `kube::Api` call.
pub(crate) fn classify(err: &kube::Error) -> ApiErrorClass {
    match err {
        kube::Error::Api(status) => classify_status(status),
        kube::Error::HyperError(_)
        | kube::Error::Service(_)
        | kube::Error::ReadEvents(_)
        | kube::Error::RustlsTls(_)
        | kube::Error::Auth(_) => ApiErrorClass::Transport,
        _ => ApiErrorClass::Other,
    }
}

/// Classifies a `Status` returned by the API server.
pub(crate) fn classify_status(status: &Status) -> ApiErrorClass {
    use kube::core::response::reason;

    // Known reasons first (a reason clarifies the code, apimachinery `ReasonForError`); the code
    // decides only when the reason is empty or unknown, like apimachinery's `reasonAndCodeForError`.
    match status.reason.as_str() {
        reason::ALREADY_EXISTS => return ApiErrorClass::AlreadyExists,
        reason::CONFLICT => return ApiErrorClass::Conflict,
        reason::NOT_FOUND => return ApiErrorClass::NotFound,
        reason::GONE | reason::EXPIRED => return ApiErrorClass::Gone,
        reason::TOO_MANY_REQUESTS => return throttled(status),
        reason::SERVER_TIMEOUT
        | reason::TIMEOUT
        | reason::INTERNAL_ERROR
        | reason::SERVICE_UNAVAILABLE
        | reason::STORAGE_READ_ERROR => return ApiErrorClass::ServerError,
        reason::INVALID => return ApiErrorClass::Invalid,
        reason::FORBIDDEN | reason::UNAUTHORIZED => return ApiErrorClass::Forbidden,
        reason::BAD_REQUEST
        | reason::METHOD_NOT_ALLOWED
        | reason::NOT_ACCEPTABLE
        | reason::REQUEST_ENTITY_TOO_LARGE
        | reason::UNSUPPORTED_MEDIA_TYPE => return ApiErrorClass::Other,
        _ => {}
    }
    match status.code {
        409 => ApiErrorClass::Conflict,
        404 => ApiErrorClass::NotFound,
        410 => ApiErrorClass::Gone,
        429 => throttled(status),
        422 => ApiErrorClass::Invalid,
        401 | 403 => ApiErrorClass::Forbidden,
        500..=599 => ApiErrorClass::ServerError,
        _ => ApiErrorClass::Other,
    }
}

fn throttled(status: &Status) -> ApiErrorClass {
    let retry_after = status
        .details
        .as_ref()
        .map(|d| d.retry_after_seconds)
        .filter(|&s| s > 0)
        .map(|s| Duration::from_secs(u64::from(s)));
    ApiErrorClass::Throttled { retry_after }
}

#[cfg(test)]
mod tests {
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
}
