use super::*;

fn key(s: &str) -> Key {
    Arc::from(s)
}

#[test]
fn a_key_is_queued_once_and_never_runs_twice_at_once() {
    let mut q = WorkQueue::default();
    q.add(key("a"));
    q.add(key("a"));
    q.add(key("b"));
    assert_eq!(q.next().as_deref(), Some("a"));
    // Triggered while running: not handed to a second worker...
    q.add(key("a"));
    assert_eq!(q.next().as_deref(), Some("b"));
    assert_eq!(q.next(), None);
    // ...but run again once the first run ends, even if it asked to wait.
    q.done(
        key("a"),
        Action::requeue(Duration::from_secs(60)),
        Instant::now(),
    );
    assert_eq!(q.next().as_deref(), Some("a"));
    q.done(key("a"), Action::await_change(), Instant::now());
    q.done(key("b"), Action::await_change(), Instant::now());
    assert_eq!(q.len(), 0, "nothing is kept of keys that wait for a change");
}

#[test]
fn a_retry_runs_when_due_and_a_trigger_before_it_wins() {
    let mut q = WorkQueue::default();
    let now = Instant::now();
    q.add(key("a"));
    q.add(key("b"));
    let a = q.next().unwrap();
    let b = q.next().unwrap();
    q.done(a, Action::requeue(Duration::from_secs(5)), now);
    q.done(b, Action::requeue(Duration::from_secs(10)), now);
    assert_eq!(q.next_due(), Some(now + Duration::from_secs(5)));
    q.promote(now + Duration::from_secs(4));
    assert_eq!(q.next(), None, "not due yet");
    // A change to b runs it now and cancels its scheduled retry.
    q.add(key("b"));
    assert_eq!(q.next().as_deref(), Some("b"));
    q.done(key("b"), Action::await_change(), now);
    q.promote(now + Duration::from_secs(5));
    assert_eq!(q.next().as_deref(), Some("a"));
    q.promote(now + Duration::from_secs(60));
    assert_eq!(q.next(), None, "b's old retry was dropped");
    assert_eq!(q.next_due(), None);
}

#[test]
fn of_two_requested_retries_the_earlier_is_kept() {
    let mut q = WorkQueue::default();
    let now = Instant::now();
    q.add_at(key("a"), now + Duration::from_secs(10));
    q.add_at(key("a"), now + Duration::from_secs(3));
    q.add_at(key("a"), now + Duration::from_secs(7));
    assert_eq!(q.next_due(), Some(now + Duration::from_secs(3)));
    q.promote(now + Duration::from_secs(3));
    assert_eq!(q.next().as_deref(), Some("a"));
    assert_eq!(q.next_due(), None);
}

#[test]
fn metrics_follow_client_go_counting() {
    let metrics = QueueMetrics::default();
    let mut q = WorkQueue::new(metrics.clone());
    let now = Instant::now();
    q.add(key("a"));
    q.add(key("a"));
    q.add(key("b"));
    assert_eq!(metrics.depth(), 2, "a duplicate trigger is no add");
    let a = q.next().unwrap();
    assert_eq!(metrics.depth(), 1);
    q.add(key("a"));
    assert_eq!(metrics.depth(), 2, "triggered while running: waiting again");
    q.done(a, Action::requeue(Duration::from_secs(5)), now);
    assert_eq!(metrics.depth(), 2, "the run again is the same add");
    assert_eq!(q.next().as_deref(), Some("b"));
    assert_eq!(q.next().as_deref(), Some("a"));
    assert_eq!(metrics.depth(), 0);
}
