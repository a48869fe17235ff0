use super::*;

#[test]
fn an_attempt_never_uses_a_whole_renew_deadline() {
    let t = |renew| Timings {
        lease_duration: Duration::from_secs(15),
        renew_deadline: renew,
        retry_period: Duration::from_secs(2),
    };
    assert_eq!(
        attempt_budget(t(Duration::from_secs(10))),
        Duration::from_secs(5)
    );
    assert_eq!(
        attempt_budget(t(Duration::from_millis(1500))),
        Duration::from_secs(1)
    );
}
