//! Polls spread over `--capacity-poll-interval`: each check polls the share of the keys that came
//! due since the last check, round robin after the last key polled. Every key is polled once per
//! interval and the driver sees `keys / interval` GetCapacity calls a second, instead of every key
//! at once (thousands, at thousands of nodes).

use std::collections::BTreeSet;
use std::ops::Bound;
use std::time::{Duration, Instant};

use super::plan::Key;

/// Guarantees:
/// 1. Over any whole interval each key is due once (rounding aside), in key order.
/// 2. A late check never makes more than one round due at once.
/// 3. Keys added or removed between checks change only the share; the round goes on after the
///    last key polled.
#[derive(Debug)]
pub(crate) struct Polls {
    interval: Duration,
    last: Instant,
    /// Keys owed but not yet due (the fraction carries over to the next check).
    credit: f64,
    /// The last key made due.
    cursor: Option<Key>,
}

impl Polls {
    pub(crate) fn new(interval: Duration, now: Instant) -> Self {
        Self {
            interval: interval.max(Duration::from_millis(1)),
            last: now,
            credit: 0.0,
            cursor: None,
        }
    }

    /// The keys due at `now`, out of `keys`.
    pub(crate) fn due(&mut self, keys: &BTreeSet<Key>, now: Instant) -> Vec<Key> {
        let elapsed = now.saturating_duration_since(self.last);
        self.last = now;
        let total = keys.len() as f64;
        let share = elapsed.as_secs_f64() / self.interval.as_secs_f64();
        self.credit = (self.credit + share * total).min(total);
        // Rounding: 0.999… after adding shares that should make a whole key.
        let count = (self.credit + 1e-9).floor() as usize;
        self.credit = (self.credit - count as f64).max(0.0);
        // After the cursor, then round again from the first key (`count` never exceeds a round).
        let start = self
            .cursor
            .as_ref()
            .map_or(Bound::Unbounded, Bound::Excluded);
        let after: Vec<Key> = keys
            .range((start, Bound::Unbounded))
            .chain(keys.iter())
            .take(count)
            .cloned()
            .collect();
        if let Some(last) = after.last() {
            self.cursor = Some(last.clone());
        }
        after
    }
}

#[cfg(test)]
#[path = "polls_tests.rs"]
mod tests;
