//! Per-object exponential backoff (`--retry-interval-start` .. `--retry-interval-max`), the
//! infeasible hold-back ("slow set") for claims whose CreateVolume failed with `InvalidArgument`,
//! and [`retry_transient`], the one in-place retry loop for a call whose transient failures are
//! worth a few quick attempts before the object goes back to its backoff.
//!
//! Both are plain data: the caller passes `Instant`s in and wraps the value in a lock if it shares
//! it between workers. This mirrors upstream's workqueue `ItemExponentialFailureRateLimiter` (one
//! counter per key, delay `start·2^n` capped at `max`, forgotten on success) and the lib's SlowSet
//! (reference §10), whose retention is effectively fixed at 5 minutes whatever
//! `--retry-interval-max` says; ours is [`INFEASIBLE_HOLD_BACK`] likewise.

use std::collections::HashMap;
use std::hash::Hash;
use std::time::{Duration, Instant};

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

#[cfg(test)]
#[path = "retry_tests.rs"]
mod tests;
