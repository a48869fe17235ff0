use super::*;

const S: fn(u64) -> Duration = Duration::from_secs;
const MS: fn(u64) -> Duration = Duration::from_millis;

fn timings() -> Timings {
    Timings {
        lease_duration: S(15),
        renew_deadline: S(10),
        retry_period: S(5),
    }
}

fn wall(secs: i64) -> Timestamp {
    Timestamp::from_second(1_800_000_000 + secs).unwrap()
}

fn held_by(holder: &str, renewed: i64, transitions: i32) -> LeaseSpec {
    LeaseSpec {
        holder_identity: Some(holder.into()),
        lease_duration_seconds: Some(15),
        acquire_time: Some(MicroTime(wall(0))),
        renew_time: Some(MicroTime(wall(renewed))),
        lease_transitions: Some(transitions),
        ..LeaseSpec::default()
    }
}

#[test]
fn lease_names_are_sanitised_as_csi_lib_utils_does() {
    for (driver, lease) in [
        ("hostpath.csi.k8s.io", "hostpath-csi-k8s-io"),
        ("pd.csi.storage.gke.io", "pd-csi-storage-gke-io"),
        ("example.com/driver", "example-com-driver"),
        ("ebs.csi.aws.com", "ebs-csi-aws-com"),
        // A trailing `-` (from any replaced character) gets an `X`.
        ("csi-driver-", "csi-driver-X"),
        ("driver.", "driver-X"),
        ("example.com/", "example-com-X"),
        // Case is kept (the API server then refuses such a name, for upstream as for us).
        ("My.Driver", "My-Driver"),
        // One `-` per character, not per byte.
        ("ü.example", "--example"),
        ("under_score", "under-score"),
        ("a-b-c", "a-b-c"),
    ] {
        assert_eq!(lease_name(driver), lease, "{driver}");
    }
    assert_eq!(lock_name("example.com/driver"), "example.com-driver");
    assert_eq!(
        lock_name("a.b/c"),
        "a.b-c",
        "the lock name is only /-replaced"
    );
}

#[test]
fn identities_are_sanitised_too() {
    assert_eq!(
        sanitize_name("csi-provisioner-7d9f8-abcde"),
        "csi-provisioner-7d9f8-abcde"
    );
    assert_eq!(sanitize_name("node1.example.com"), "node1-example-com");
    assert_eq!(sanitize_name("host-"), "host-X");
}

#[test]
fn the_acting_window_is_the_renew_deadline_but_never_past_the_written_lease() {
    assert_eq!(timings().acting_window(), S(10));
    assert_eq!(timings().lease_seconds(), 15);
    let t = |lease, renew| Timings {
        lease_duration: lease,
        renew_deadline: renew,
        retry_period: MS(100),
    };
    // client-go writes whole seconds: a 2.5s lease is read as 2s by everyone else.
    assert_eq!(t(MS(2500), S(2)).lease_seconds(), 2);
    assert_eq!(t(MS(2500), MS(2400)).acting_window(), S(2));
    assert_eq!(t(S(2), MS(1500)).acting_window(), MS(1500));
}

#[test]
fn a_missing_lease_is_created_with_us_as_holder() {
    let e = Elector::new("me", timings());
    let LeaseDecision::Create(spec) = e.decide(None, Instant::now(), wall(3)) else {
        panic!("expected a create");
    };
    assert_eq!(spec.holder_identity.as_deref(), Some("me"));
    assert_eq!(spec.lease_duration_seconds, Some(15));
    assert_eq!(spec.lease_transitions, Some(0));
    assert_eq!(spec.acquire_time, Some(MicroTime(wall(3))));
    assert_eq!(spec.renew_time, spec.acquire_time);
}

#[test]
fn a_held_lease_expires_a_lease_duration_after_its_last_change_was_seen() {
    let t0 = Instant::now();
    let mut e = Elector::new("me", timings());
    let theirs = held_by("other", 0, 4);
    e.observe(&theirs, t0);
    assert_eq!(
        e.decide(Some(&theirs), t0 + S(14), wall(100)),
        LeaseDecision::Held {
            holder: "other".into()
        }
    );
    // Seeing the same record again does not refresh it: the holder stopped renewing.
    e.observe(&theirs, t0 + S(10));
    assert!(e.lease_valid(t0 + S(14)));
    assert!(!e.lease_valid(t0 + S(15)));
    let LeaseDecision::Update(spec) = e.decide(Some(&theirs), t0 + S(15), wall(100)) else {
        panic!("expected a take-over");
    };
    assert_eq!(spec.holder_identity.as_deref(), Some("me"));
    assert_eq!(
        spec.lease_transitions,
        Some(5),
        "a take-over is a transition"
    );
    assert_eq!(spec.acquire_time, Some(MicroTime(wall(100))));
}

#[test]
fn expiry_ignores_the_renew_time_so_clock_skew_does_not_matter() {
    let t0 = Instant::now();
    let mut e = Elector::new("me", timings());
    // Renewed "an hour ago" by a node whose clock is behind: still valid, it was just seen.
    let theirs = held_by("other", -3600, 0);
    e.observe(&theirs, t0);
    assert!(matches!(
        e.decide(Some(&theirs), t0 + S(1), wall(0)),
        LeaseDecision::Held { .. }
    ));
    // A renewal (any change) restarts the count.
    let renewed = held_by("other", -3595, 0);
    e.observe(&renewed, t0 + S(14));
    assert!(matches!(
        e.decide(Some(&renewed), t0 + S(28), wall(0)),
        LeaseDecision::Held { .. }
    ));
    assert!(matches!(
        e.decide(Some(&renewed), t0 + S(29), wall(0)),
        LeaseDecision::Update(_)
    ));
}

#[test]
fn a_released_lease_is_taken_at_once() {
    let t0 = Instant::now();
    let mut e = Elector::new("me", timings());
    let released = LeaseSpec {
        holder_identity: Some(String::new()),
        lease_duration_seconds: Some(1),
        lease_transitions: Some(2),
        ..held_by("", 0, 2)
    };
    e.observe(&released, t0);
    let LeaseDecision::Update(spec) = e.decide(Some(&released), t0, wall(1)) else {
        panic!("expected a take-over");
    };
    assert_eq!(spec.holder_identity.as_deref(), Some("me"));
    assert_eq!(spec.lease_transitions, Some(3));
    // Also when written by a client that leaves the holder out entirely.
    let absent = LeaseSpec {
        holder_identity: None,
        ..released
    };
    assert!(matches!(
        e.decide(Some(&absent), t0, wall(1)),
        LeaseDecision::Update(_)
    ));
}

#[test]
fn renewing_our_own_lease_keeps_its_acquire_time_and_transitions() {
    let t0 = Instant::now();
    let mut e = Elector::new("me", timings());
    let ours = held_by("me", 5, 7);
    e.observe(&ours, t0);
    assert!(e.is_leader());
    let LeaseDecision::Update(spec) = e.decide(Some(&ours), t0 + S(1), wall(10)) else {
        panic!("expected a renewal");
    };
    assert_eq!(spec.acquire_time, Some(MicroTime(wall(0))));
    assert_eq!(spec.renew_time, Some(MicroTime(wall(10))));
    assert_eq!(spec.lease_transitions, Some(7));
    // The fast path gives the same renewal without reading, while our lease is valid.
    assert_eq!(e.fast_renewal(t0 + S(1), wall(10)), Some(spec.clone()));
    e.written(spec, t0 + S(1));
    assert!(e.fast_renewal(t0 + S(15), wall(24)).is_some());
    assert_eq!(e.fast_renewal(t0 + S(16), wall(25)), None, "expired");
}

#[test]
fn no_fast_path_for_a_standby() {
    let t0 = Instant::now();
    let mut e = Elector::new("me", timings());
    assert_eq!(e.fast_renewal(t0, wall(0)), None);
    e.observe(&held_by("other", 0, 0), t0);
    assert_eq!(e.fast_renewal(t0, wall(0)), None);
    assert!(!e.is_leader());
}

#[test]
fn timestamps_are_written_to_the_microsecond_so_our_read_back_compares_equal() {
    let e = Elector::new("me", timings());
    let wall = Timestamp::from_nanosecond(1_800_000_000_123_456_789).unwrap();
    let LeaseDecision::Create(spec) = e.decide(None, Instant::now(), wall) else {
        panic!()
    };
    assert_eq!(
        spec.renew_time.unwrap().0.as_nanosecond(),
        1_800_000_000_123_456_000
    );
}

#[test]
fn an_absent_field_and_its_zero_value_are_the_same_record() {
    let t0 = Instant::now();
    let mut e = Elector::new("me", timings());
    let a = LeaseSpec {
        holder_identity: Some(String::new()),
        lease_transitions: Some(0),
        ..LeaseSpec::default()
    };
    e.observe(&a, t0);
    e.observe(&LeaseSpec::default(), t0 + S(5));
    let later = held_by("x", 0, 0);
    e.observe(&later, t0 + S(6));
    assert!(
        e.lease_valid(t0 + S(20)),
        "a real change moves the observation"
    );
    let mut e = Elector::new("me", timings());
    e.observe(
        &LeaseSpec {
            lease_duration_seconds: Some(15),
            ..a.clone()
        },
        t0,
    );
    e.observe(
        &LeaseSpec {
            lease_duration_seconds: Some(15),
            holder_identity: None,
            lease_transitions: None,
            ..a
        },
        t0 + S(10),
    );
    assert!(!e.lease_valid(t0 + S(15)), "no change was seen at t0+10s");
}

#[test]
fn release_clears_the_holder_only_when_the_lease_is_ours() {
    let e = Elector::new("me", timings());
    let spec = e.release(&held_by("me", 0, 3), wall(9)).unwrap();
    assert_eq!(spec.holder_identity.as_deref(), Some(""));
    assert_eq!(spec.lease_duration_seconds, Some(1));
    assert_eq!(spec.lease_transitions, Some(3));
    assert_eq!(spec.renew_time, Some(MicroTime(wall(9))));
    assert_eq!(e.release(&held_by("other", 0, 3), wall(9)), None);
}

#[test]
fn health_fails_only_for_a_leader_whose_renewals_are_stuck() {
    let t0 = Instant::now();
    let mut e = Elector::new("me", timings());
    assert_eq!(e.health(t0 + S(3600)), Ok(()), "nothing observed yet");
    e.observe(&held_by("other", 0, 0), t0);
    assert_eq!(e.health(t0 + S(3600)), Ok(()), "a standby is healthy");
    e.written(held_by("me", 0, 1), t0);
    assert_eq!(e.health(t0 + S(35)), Ok(()));
    assert_eq!(e.health(t0 + S(36)), Err(S(36)));
}

#[test]
fn labels_are_merged_into_the_leases_own() {
    let ours = BTreeMap::from([("app".to_owned(), "csi".to_owned())]);
    assert_eq!(merged_labels(None, &BTreeMap::new()), None);
    assert_eq!(merged_labels(None, &ours), Some(ours.clone()));
    let existing = BTreeMap::from([
        ("app".to_owned(), "old".to_owned()),
        ("team".to_owned(), "storage".to_owned()),
    ]);
    assert_eq!(
        merged_labels(Some(existing), &ours),
        Some(BTreeMap::from([
            ("app".to_owned(), "csi".to_owned()),
            ("team".to_owned(), "storage".to_owned()),
        ]))
    );
}
