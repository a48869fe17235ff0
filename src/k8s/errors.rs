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
            Some(status.reason.as_str())
                .filter(|reason| !reason.is_empty())
                .unwrap_or("unknown")
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
#[path = "errors_tests.rs"]
mod tests;
