use std::time::Duration;

use super::*;

#[test]
fn a_volume_name_is_locked_once_until_its_guard_drops() {
    let locks = VolumeLocks::default();
    let first = locks.try_lock("pvc-1");
    assert!(first.is_some());
    assert!(locks.try_lock("pvc-1").is_none());
    assert!(locks.try_lock("pvc-2").is_some());
    drop(first);
    assert!(locks.try_lock("pvc-1").is_some());
}

#[tokio::test]
async fn the_guard_closes_at_the_end_of_the_window_and_waits_for_the_next() {
    assert!(Leadership::always().is_acting());
    let (tx, rx) = watch::channel(None);
    let guard = Leadership::from_receiver(rx);
    assert!(!guard.is_acting(), "a standby does not act");
    let until = Instant::now() + Duration::from_millis(200);
    tx.send_replace(Some(until));
    assert!(guard.is_acting());
    guard.acting().await;
    tokio::time::sleep_until(until).await;
    assert!(!guard.is_acting(), "closed once the deadline passed");
    let waiting = tokio::spawn({
        let guard = guard.clone();
        async move { guard.acting().await }
    });
    // The waiter has run (and found the window closed) before the renewal below.
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!waiting.is_finished(), "no renewal, no operation");
    tx.send_replace(Some(Instant::now() + Duration::from_secs(10)));
    tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("a renewal lets it through")
        .unwrap();
    // A stale renewal (a window already over) does not let anything through.
    tx.send_replace(Some(Instant::now()));
    let stale = tokio::spawn({
        let guard = guard.clone();
        async move { guard.acting().await }
    });
    drop(tx);
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!stale.is_finished(), "never acts after the election ended");
    stale.abort();
}
