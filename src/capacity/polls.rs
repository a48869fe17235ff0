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
        let after = match &self.cursor {
            Some(cursor) => keys
                .range((Bound::Excluded(cursor), Bound::Unbounded))
                .chain(keys.iter())
                .take(count)
                .cloned()
                .collect::<Vec<_>>(),
            None => keys.iter().take(count).cloned().collect(),
        };
        if let Some(last) = after.last() {
            self.cursor = Some(last.clone());
        }
        after
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn keys(n: usize) -> BTreeSet<Key> {
        (0..n)
            .map(|i| Key {
                class: "fast".into(),
                segment: BTreeMap::from([("node".to_string(), format!("node-{i:04}"))]),
            })
            .collect()
    }

    #[test]
    fn every_key_is_polled_once_per_interval_a_few_at_each_check() {
        let start = Instant::now();
        let all = keys(600);
        let mut polls = Polls::new(Duration::from_secs(60), start);
        let mut seen = Vec::new();
        for second in 1..=60 {
            let due = polls.due(&all, start + Duration::from_secs(second));
            assert_eq!(due.len(), 10, "a steady rate: 600 keys / 60 s");
            seen.extend(due);
        }
        let distinct: BTreeSet<Key> = seen.iter().cloned().collect();
        assert_eq!(seen.len(), 600);
        assert_eq!(distinct, all, "each key once");
        // The next round starts over from the first key.
        let next = polls.due(&all, start + Duration::from_secs(61));
        assert_eq!(next.first(), all.iter().next());
    }

    #[test]
    fn a_late_check_owes_at_most_one_round() {
        let start = Instant::now();
        let all = keys(10);
        let mut polls = Polls::new(Duration::from_secs(1), start);
        assert_eq!(polls.due(&all, start + Duration::from_secs(30)).len(), 10);
        assert!(polls.due(&all, start + Duration::from_secs(30)).is_empty());
    }

    #[test]
    fn fewer_keys_than_checks_are_polled_on_time_and_no_key_is_skipped_when_keys_change() {
        let start = Instant::now();
        let mut polls = Polls::new(Duration::from_secs(60), start);
        let two = keys(2);
        let due: usize = (1..=60)
            .map(|s| polls.due(&two, start + Duration::from_secs(s)).len())
            .sum();
        assert_eq!(due, 2);
        // A third key appears: the round goes on after the last key polled and reaches it.
        let three = keys(3);
        let round: Vec<Key> = (61..=120)
            .flat_map(|s| polls.due(&three, start + Duration::from_secs(s)))
            .collect();
        assert_eq!(round.len(), 3);
        assert_eq!(round.iter().cloned().collect::<BTreeSet<_>>(), three);
        assert!(
            polls
                .due(&BTreeSet::new(), start + Duration::from_secs(121))
                .is_empty()
        );
    }
}
