use super::*;

fn drain(q: &mut Queue<u32>) -> Vec<u32> {
    std::iter::from_fn(|| q.pop(|_| true).map(|(i, _)| i)).collect()
}

#[test]
fn a_missing_object_goes_ahead_of_every_queued_refresh() {
    let now = Instant::now();
    let mut q = Queue::default();
    for key in 0..1000 {
        q.push(key, Lane::Refresh, now);
    }
    q.push(5000, Lane::Urgent, now);
    assert_eq!(q.pop(|_| true).map(|(i, _)| i), Some(5000));
    assert_eq!(
        q.pop(|_| true).map(|(i, _)| i),
        Some(0),
        "then the refreshes in order"
    );
}

#[test]
fn an_item_queued_again_stays_one_item_and_moves_ahead_when_it_becomes_urgent() {
    let start = Instant::now();
    let later = start + Duration::from_secs(10);
    let mut q = Queue::default();
    assert!(q.push(1, Lane::Refresh, start));
    assert!(q.push(2, Lane::Refresh, start));
    assert!(
        !q.push(1, Lane::Refresh, later),
        "a second poll is not a second item"
    );
    assert_eq!(q.len(), 2);
    assert!(
        !q.push(2, Lane::Urgent, later),
        "its object was deleted meanwhile"
    );
    assert_eq!(q.len(), 2);
    assert_eq!(q.oldest(later), Duration::from_secs(10), "it kept its time");
    assert_eq!(drain(&mut q), vec![2, 1]);
}

#[test]
fn items_that_are_not_ready_are_passed_over_not_lost() {
    let now = Instant::now();
    let mut q = Queue::default();
    q.push(1, Lane::Urgent, now);
    q.push(2, Lane::Refresh, now);
    assert_eq!(q.pop(|i| *i != 1).map(|(i, _)| i), Some(2));
    assert_eq!(q.pop(|i| *i != 1), None);
    assert_eq!(drain(&mut q), vec![1]);
    assert_eq!(q.oldest(now), Duration::ZERO);
}

#[test]
fn a_new_nodes_objects_go_ahead_of_the_initial_creations_and_the_refreshes() {
    let now = Instant::now();
    let mut q = Queue::default();
    for key in 0..4000 {
        q.push(key, Lane::Urgent, now);
    }
    q.push(9000, Lane::Refresh, now);
    q.push(9001, Lane::Refresh, now);
    q.push(5000, Lane::New, now);
    q.push(5001, Lane::New, now);
    assert!(!q.push(9001, Lane::New, now), "still one item");
    let first: Vec<u32> = (0..4)
        .filter_map(|_| q.pop(|_| true).map(|(i, _)| i))
        .collect();
    assert_eq!(first, vec![5000, 5001, 9001, 0]);
    assert!(!q.push(5, Lane::Refresh, now));
    let rest = drain(&mut q);
    assert_eq!(rest.len(), 3999 + 1, "one item each");
    assert!(
        rest.iter().position(|i| *i == 5) < rest.iter().position(|i| *i == 9000),
        "an urgent item queued again as a refresh is never moved back"
    );
}
