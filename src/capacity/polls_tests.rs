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
