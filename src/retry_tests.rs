use super::*;

const S: Duration = Duration::from_secs(1);

#[test]
fn delays_double_from_start_and_stop_at_max() {
    let mut backoff = Backoff::new(S, Duration::from_secs(300));
    let delays: Vec<u64> = (0..12).map(|_| backoff.failed(&"a").as_secs()).collect();
    assert_eq!(delays, [1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300, 300]);
    assert_eq!(backoff.failures(&"a"), 12);
}

#[test]
fn keys_back_off_independently() {
    let mut backoff = Backoff::new(S, Duration::from_secs(60));
    backoff.failed(&"a");
    backoff.failed(&"a");
    assert_eq!(backoff.failed(&"b"), S);
    assert_eq!(backoff.peek(&"a"), 4 * S);
}

#[test]
fn reset_starts_the_key_over() {
    let mut backoff = Backoff::new(S, Duration::from_secs(60));
    backoff.failed(&"a");
    backoff.failed(&"a");
    backoff.reset(&"a");
    assert_eq!(backoff.failures(&"a"), 0);
    assert!(backoff.is_empty());
    assert_eq!(backoff.failed(&"a"), S);
}

#[test]
fn retain_drops_the_state_of_vanished_keys_and_keeps_the_rest() {
    let mut backoff = Backoff::new(S, Duration::from_secs(60));
    backoff.failed(&"gone");
    backoff.failed(&"live");
    backoff.failed(&"live");
    backoff.retain(|k| *k == "live");
    assert_eq!((backoff.len(), backoff.failures(&"live")), (1, 2));

    let now = Instant::now();
    let mut hold = InfeasibleHold::new(Duration::from_secs(300));
    hold.record("gone", "class-uid", now);
    hold.record("live", "class-uid", now);
    hold.retain(|k| *k == "live");
    assert!(!hold.contains(&"gone"));
    assert!(
        hold.check(&"live", "class-uid", now).is_err(),
        "still held back"
    );
}

#[test]
fn huge_failure_counts_saturate_at_max_instead_of_overflowing() {
    let max = Duration::from_secs(300);
    assert_eq!(delay_after(S, max, 31), max);
    assert_eq!(delay_after(S, max, 32), max);
    assert_eq!(delay_after(S, max, u32::MAX), max);
    assert_eq!(
        delay_after(Duration::from_millis(10), max, 3),
        Duration::from_millis(80)
    );
}

#[test]
fn infeasible_claim_is_held_back_until_the_retention_ends() {
    let t0 = Instant::now();
    let mut hold = InfeasibleHold::new(INFEASIBLE_HOLD_BACK);
    hold.record("uid-1".to_owned(), "sc-uid", t0);
    let remaining = hold
        .check(&"uid-1".to_owned(), "sc-uid", t0 + Duration::from_secs(60))
        .unwrap_err();
    assert_eq!(remaining, Duration::from_secs(240));
    assert!(
        hold.check(&"uid-1".to_owned(), "sc-uid", t0 + INFEASIBLE_HOLD_BACK)
            .is_ok()
    );
    assert!(!hold.contains(&"uid-1".to_owned()));
}

#[test]
fn a_replaced_storage_class_releases_the_hold_at_once() {
    let t0 = Instant::now();
    let mut hold = InfeasibleHold::new(INFEASIBLE_HOLD_BACK);
    hold.record("uid-1".to_owned(), "old-sc", t0);
    assert!(hold.check(&"uid-1".to_owned(), "new-sc", t0).is_ok());
    assert!(!hold.contains(&"uid-1".to_owned()));
}

#[test]
fn claims_never_recorded_are_not_held() {
    let mut hold: InfeasibleHold<String> = InfeasibleHold::new(INFEASIBLE_HOLD_BACK);
    assert!(hold.check(&"x".to_owned(), "sc", Instant::now()).is_ok());
}

#[tokio::test]
async fn transient_failures_are_retried_until_done_or_out_of_attempts() {
    let mut calls = 0;
    let done: Result<u32, String> =
        retry_transient(5, Duration::from_millis(1), Duration::from_millis(2), |n| {
            calls += 1;
            async move {
                if n < 3 {
                    Attempt::Transient {
                        error: format!("try {n}"),
                        retry_after: None,
                    }
                } else {
                    Attempt::Done(Ok(n))
                }
            }
        })
        .await;
    assert_eq!((done, calls), (Ok(3), 3));
    let out: Result<(), String> = retry_transient(
        3,
        Duration::from_millis(100),
        Duration::from_secs(5),
        |n| async move {
            Attempt::Transient {
                error: format!("try {n}"),
                retry_after: Some(Duration::from_millis(1)),
            }
        },
    )
    .await;
    assert_eq!(out, Err("try 3".to_owned()));
    let refused: Result<(), &str> = retry_transient(5, Duration::ZERO, Duration::ZERO, |_| async {
        Attempt::Done(Err("final"))
    })
    .await;
    assert_eq!(refused, Err("final"));
}
