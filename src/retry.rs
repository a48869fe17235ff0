//! Failures and what comes next: what a Kubernetes API error means for the caller, how it reads,
//! and when the next attempt is.
//!
//! **What an API error means** ([`classify`] → [`ApiErrorClass`]). Every shell asks this module,
//! never `err.to_string().contains(..)`: a 409 means "re-read and try again", a 404 "the object is
//! gone", 429/5xx/transport "back off and retry", anything else is final for this attempt and
//! deserves an event. The mapping follows apimachinery's `errors.Is*` helpers: the `reason` field
//! wins when it is a known reason, the HTTP code decides otherwise.
//!
//! **When to try again.** Per-object exponential backoff (`--retry-interval-start` ..
//! `--retry-interval-max`), the infeasible hold-back ("slow set") for claims whose CreateVolume
//! failed with `InvalidArgument`, and [`retry_transient`], the one in-place retry loop for a call
//! whose transient failures are worth a few quick attempts before the object goes back to its
//! backoff. Backoff and hold-back are plain data: the caller passes `Instant`s in and wraps the
//! value in a lock if it shares it between workers. This mirrors upstream's workqueue
//! `ItemExponentialFailureRateLimiter` (one counter per key, delay `start·2^n` capped at `max`,
//! forgotten on success) and the lib's SlowSet (reference §10), whose retention is effectively
//! fixed at 5 minutes whatever `--retry-interval-max` says; ours is [`INFEASIBLE_HOLD_BACK`]
//! likewise.

use std::collections::HashMap;
use std::hash::Hash;
use std::time::{Duration, Instant};

use kube::core::Status;

/// How long a claim whose CreateVolume failed with `InvalidArgument` is held back, unless its
/// StorageClass is replaced (new UID). Upstream's value is fixed at 5 minutes (reference §10).
pub(crate) const INFEASIBLE_HOLD_BACK: Duration = Duration::from_secs(5 * 60);

/// Per-key exponential backoff: the n-th consecutive failure of a key waits `start·2^(n-1)`,
/// capped at `max`; [`Backoff::reset`] on success starts the key over.
#[derive(Debug, Clone)]
pub(crate) struct Backoff<K> {
    start: Duration,
    max: Duration,
    failures: HashMap<K, u32>,
}

impl<K: Eq + Hash + Clone> Backoff<K> {
    /// A backoff from `start` doubling up to `max` (`--retry-interval-start`, `--retry-interval-max`).
    pub(crate) fn new(start: Duration, max: Duration) -> Self {
        Self {
            start,
            max,
            failures: HashMap::new(),
        }
    }

    /// Records one more failure of `key` and returns how long to wait before retrying it.
    pub(crate) fn failed(&mut self, key: &K) -> Duration {
        let count = self.failures.entry(key.clone()).or_insert(0);
        let delay = delay_after(self.start, self.max, *count);
        *count = count.saturating_add(1);
        delay
    }

    /// The delay the next failure of `key` would get, without recording anything.
    #[cfg(test)]
    pub(crate) fn peek(&self, key: &K) -> Duration {
        delay_after(self.start, self.max, self.failures(key))
    }

    /// Consecutive failures recorded for `key` since the last reset.
    #[cfg(test)]
    pub(crate) fn failures(&self, key: &K) -> u32 {
        self.failures.get(key).copied().unwrap_or(0)
    }

    /// Forgets `key` (call on success, or when the object is gone).
    pub(crate) fn reset(&mut self, key: &K) {
        self.failures.remove(key);
    }

    /// Keeps only the keys `keep` accepts (drops the state of objects that are gone).
    pub(crate) fn retain(&mut self, mut keep: impl FnMut(&K) -> bool) {
        self.failures.retain(|k, _| keep(k));
    }

    /// Number of keys with at least one recorded failure (for tests and metrics).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.failures.len()
    }

    /// Whether no key has a recorded failure.
    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.failures.is_empty()
    }
}

/// `start·2^previous_failures`, capped at `max`, without overflow for any count.
pub(crate) fn delay_after(start: Duration, max: Duration, previous_failures: u32) -> Duration {
    // 2^32 times any non-zero start already exceeds every sensible max; checked_* keeps it exact.
    2u32.checked_pow(previous_failures)
        .and_then(|factor| start.checked_mul(factor))
        .map_or(max, |delay| delay.min(max))
}

/// The infeasible hold-back ("slow set"): claims whose CreateVolume answered `InvalidArgument`
/// are not retried for [`INFEASIBLE_HOLD_BACK`], unless the StorageClass UID changes (a class
/// deleted and re-created with fixed parameters should be tried at once).
#[derive(Debug, Clone)]
pub(crate) struct InfeasibleHold<K> {
    retention: Duration,
    entries: HashMap<K, (Instant, String)>,
}

impl<K: Eq + Hash + Clone> InfeasibleHold<K> {
    /// A hold-back of `retention` (use [`INFEASIBLE_HOLD_BACK`] in production).
    pub(crate) fn new(retention: Duration) -> Self {
        Self {
            retention,
            entries: HashMap::new(),
        }
    }

    /// Records that `key` failed as infeasible at `now` with the StorageClass of UID `class_uid`.
    pub(crate) fn record(&mut self, key: K, class_uid: &str, now: Instant) {
        self.entries.insert(key, (now, class_uid.to_owned()));
    }

    /// `Err(remaining)` while `key` must still wait: it failed as infeasible recently and its
    /// StorageClass has not changed since. Drops the entry once it has expired or the class UID
    /// differs from the recorded one, so the claim is provisioned normally again.
    pub(crate) fn check(&mut self, key: &K, class_uid: &str, now: Instant) -> Result<(), Duration> {
        let Some((since, recorded_uid)) = self.entries.get(key) else {
            return Ok(());
        };
        let elapsed = now.saturating_duration_since(*since);
        if recorded_uid != class_uid || elapsed >= self.retention {
            self.entries.remove(key);
            return Ok(());
        }
        Err(self.retention - elapsed)
    }

    /// Forgets `key` (the claim was provisioned, or deleted).
    pub(crate) fn remove(&mut self, key: &K) {
        self.entries.remove(key);
    }

    /// Whether `key` has an entry (expired or not).
    #[cfg(test)]
    pub(crate) fn contains(&self, key: &K) -> bool {
        self.entries.contains_key(key)
    }

    /// Keeps only the keys `keep` accepts (drops the state of claims that are gone).
    pub(crate) fn retain(&mut self, mut keep: impl FnMut(&K) -> bool) {
        self.entries.retain(|k, _| keep(k));
    }
}

/// What one attempt of [`retry_transient`] came to.
pub(crate) enum Attempt<T, E> {
    /// A final answer, success or not: no further attempt.
    Done(Result<T, E>),
    /// A failure that may pass: try again (after at least `retry_after`, when the server said).
    Transient {
        /// The failure, returned if no attempt is left.
        error: E,
        /// The server's Retry-After, if any.
        retry_after: Option<Duration>,
    },
}

/// Runs `attempt(n)` for n = 1..=`attempts` until it is [`Attempt::Done`], waiting between
/// transient failures a delay that doubles from `start` up to `max` (at least the server's
/// Retry-After). Returns the last transient error when the attempts run out.
pub(crate) async fn retry_transient<T, E, Fut>(
    attempts: u32,
    start: Duration,
    max: Duration,
    mut attempt: impl FnMut(u32) -> Fut,
) -> Result<T, E>
where
    Fut: Future<Output = Attempt<T, E>>,
{
    let mut delay = start;
    let mut n = 1;
    loop {
        match attempt(n).await {
            Attempt::Done(result) => return result,
            Attempt::Transient { error, .. } if n >= attempts => return Err(error),
            Attempt::Transient { retry_after, .. } => {
                delay = delay.max(retry_after.unwrap_or_default());
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(max);
                n += 1;
            }
        }
    }
}

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
#[path = "retry_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "retry_errors_tests.rs"]
mod errors_tests;
