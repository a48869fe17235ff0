use super::*;
use crate::csi::v1::Topology;

fn memory() -> ClaimMemory {
    ClaimMemory::new(
        Backoff::new(Duration::from_secs(1), Duration::from_secs(60)),
        InfeasibleHold::new(Duration::from_secs(300)),
        Some(Competition::new(
            Duration::from_secs(1),
            Duration::from_secs(8),
        )),
    )
}

fn requirement() -> TopologyRequirement {
    TopologyRequirement {
        requisite: vec![Topology::default()],
        preferred: vec![],
    }
}

#[test]
fn a_claim_that_leaves_the_cache_leaves_nothing_behind() {
    let mut m = memory();
    let now = Instant::now();
    for key in ["a", "b"] {
        m.failed(key);
        m.sent(key, Some(&requirement()));
        m.create_failed(key, ProvisioningState::InBackground, Some(("class", now)));
        m.compete_due(key, now, 0.5);
        m.node_missing_since(key, "n1", now);
    }
    m.retain(|k| k == "b");
    assert!(m.pinned("a").is_none());
    assert!(m.check_feasible("a", "class", now).is_ok());
    assert_eq!(
        m.failed("a"),
        Duration::from_secs(1),
        "the backoff starts over"
    );
    assert!(m.pinned("b").is_some());
    assert!(m.check_feasible("b", "class", now).is_err());
    let later = now + Duration::from_secs(1);
    assert_eq!(
        m.node_missing_since("b", "n1", later),
        now,
        "b's timer kept running"
    );
    assert_eq!(
        m.node_missing_since("a", "n1", later),
        later,
        "a's timer starts over"
    );
}

#[test]
fn a_pv_created_here_counts_until_the_cache_can_have_caught_up() {
    let mut m = memory();
    let now = Instant::now();
    assert!(!m.recently_provisioned("a", now));
    m.provisioned("a");
    assert!(m.recently_provisioned("a", Instant::now()));
    assert!(!m.recently_provisioned("b", Instant::now()));
    assert!(!m.recently_provisioned("a", Instant::now() + PV_CACHE_GRACE));
    m.retain(|k| k != "a");
    assert!(!m.recently_provisioned("a", Instant::now()));
}

#[test]
fn the_pin_stays_while_the_volume_may_be_in_the_making_and_goes_with_the_pv() {
    let mut m = memory();
    m.sent("a", Some(&requirement()));
    m.create_failed("a", ProvisioningState::InBackground, None);
    assert_eq!(m.pinned("a"), Some(requirement()));
    m.provisioned("a");
    assert!(m.pinned("a").is_none());
}

#[test]
fn the_compete_delay_is_drawn_once_per_wait() {
    let mut m = memory();
    let now = Instant::now();
    let due = m.compete_due("a", now, 0.5);
    assert!(due > now);
    assert_eq!(m.compete_due("a", now + Duration::from_secs(1), 0.9), due);
    m.compete_now("a");
    assert_ne!(
        m.compete_due("a", now, 0.5),
        due,
        "a second wait draws a longer delay"
    );
}

#[test]
fn ignoring_a_deleted_claim_forgets_its_pin_and_hold_back_but_not_its_backoff() {
    let mut m = memory();
    let now = Instant::now();
    m.sent("a", Some(&requirement()));
    m.create_failed("a", ProvisioningState::Finished, Some(("class", now)));
    m.failed("a");
    m.ignored("a", &IgnoreReason::ClaimDeleting);
    assert!(m.pinned("a").is_none());
    assert!(m.check_feasible("a", "class", now).is_ok());
    assert_eq!(m.failed("a"), Duration::from_secs(2));
}

#[test]
fn a_claim_created_again_under_its_name_inherits_nothing_from_the_one_before() {
    let mut m = memory();
    let now = Instant::now();
    m.observe("ns/a", "uid-1", false);
    m.failed("ns/a");
    m.sent("ns/a", Some(&requirement()));
    m.create_failed(
        "ns/a",
        ProvisioningState::InBackground,
        Some(("class", now)),
    );
    m.provisioned("ns/b");
    m.observe("ns/a", "uid-1", false);
    assert!(
        m.pinned("ns/a").is_some(),
        "the same claim keeps its memory"
    );
    m.observe("ns/a", "uid-2", false);
    assert!(m.pinned("ns/a").is_none());
    assert!(m.check_feasible("ns/a", "class", now).is_ok());
    assert_eq!(m.failed("ns/a"), Duration::from_secs(1), "a fresh backoff");
    assert!(
        m.recently_provisioned("ns/b", Instant::now()),
        "other claims are untouched"
    );
}

#[test]
fn the_grace_period_starts_anew_for_another_node() {
    let mut m = memory();
    let now = Instant::now();
    let later = now + Duration::from_secs(5);
    assert_eq!(m.node_missing_since("ns/a", "n1", now), now);
    assert_eq!(m.node_missing_since("ns/a", "n1", later), now);
    assert_eq!(m.node_missing_since("ns/a", "n2", later), later);
}

#[test]
fn a_claim_created_again_after_its_namesake_was_bound_inherits_nothing() {
    let mut m = memory();
    m.observe("ns/a", "uid-1", false);
    m.provisioned("ns/a");
    m.observe("ns/a", "uid-1", true);
    assert!(m.uids.is_empty(), "nothing kept per bound claim");
    assert!(m.recently_provisioned("ns/a", Instant::now()));
    m.observe("ns/a", "uid-2", false);
    assert!(!m.recently_provisioned("ns/a", Instant::now()));
}

#[test]
fn pinned_requirements_survive_retries_until_a_final_outcome() {
    let mut m = memory();
    m.sent("u1", None);
    assert!(
        m.pinned("u1").is_none(),
        "nothing to pin without a requirement"
    );
    m.sent("u1", Some(&requirement()));
    for kept in [ProvisioningState::InBackground, ProvisioningState::NoChange] {
        m.create_failed("u1", kept, None);
        assert_eq!(m.pinned("u1"), Some(requirement()));
    }
    m.create_failed("u1", ProvisioningState::Reschedule, None);
    assert!(m.pinned("u1").is_none());
    m.sent("u1", Some(&requirement()));
    m.create_failed("u1", ProvisioningState::Finished, None);
    assert!(m.pinned("u1").is_none());
    m.sent("u1", Some(&requirement()));
    m.provisioned("u1");
    assert!(m.pinned("u1").is_none());
}

#[test]
fn a_claim_created_again_already_bound_inherits_nothing() {
    let mut m = memory();
    m.observe("ns/a", "uid-1", false);
    m.provisioned("ns/a");
    m.observe("ns/a", "uid-2", true);
    assert!(
        !m.bound("ns/a"),
        "no claim-to-Bound sample for a claim this process did not provision"
    );
}
