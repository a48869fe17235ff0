//! Tests of the dead-node tracker ([`super`]).

use std::time::Duration;

use super::*;
use crate::gone_nodes::candidates::*;
use crate::gone_nodes::policy::*;
use crate::model::locate::HOSTNAME_LABEL;
use crate::model::locate::Mode;
use crate::model::locate::{Unlocated, node_query};
use crate::rendezvous;
use crate::testing::{PvBuilder, node, pv, pvc};
use k8s_openapi::api::core::v1::{NodeCondition, NodeStatus};
use kube::core::Status;

const DRIVER: &str = crate::testing::DRIVER;
const GRACE: Duration = Duration::from_secs(300);

fn config() -> GoneConfig {
    GoneConfig::new(DRIVER, Mode::Node, GRACE, false)
}

fn t0() -> Now {
    Now {
        instant: Instant::now(),
        wall: jiff::Timestamp::from_second(1_700_000_000).unwrap(),
    }
}

/// A released PV of our driver pinned to `node` by hostname, recording `node` with `uid`.
fn released_on(node: &str, uid: &str) -> PvBuilder {
    pv("pv-1")
        .reclaim("Delete")
        .phase("Released")
        .finalizer(names::FINALIZER_PV_DELETION_PROTECTION)
        .node_affinity([(HOSTNAME_LABEL, node)])
        .annotation(names::ANN_NODE_NAME, node)
        .annotation(names::ANN_NODE_UID, uid)
}

fn api_error(code: u16) -> kube::Error {
    kube::Error::Api(Status::failure("boom", "").with_code(code).boxed())
}

fn get(result: Result<Option<k8s_openapi::api::core::v1::Node>, kube::Error>) -> NodeLookup {
    NodeLookup::from_get(&result)
}

/// Runs the happy path to the end of the grace period and returns the tracker there.
fn waited_out(volume: &PersistentVolume) -> (NodeGoneTracker, Now) {
    let mut t = NodeGoneTracker::new(config());
    let start = t0();
    let first = t.observe(
        volume,
        &NodeCheck::Cached(NodeLookup::NotFound),
        Some(0),
        start,
    );
    assert_eq!(
        first,
        GoneAction::StartTimer {
            deadline: start.instant + GRACE
        }
    );
    (t, start.after(GRACE))
}

#[test]
fn a_missing_node_starts_the_grace_period_then_is_confirmed_live_then_acted_on() {
    let volume = released_on("n1", "u1").build();
    let (mut t, end) = waited_out(&volume);
    assert_eq!(t.waiting(), 1);

    let halfway = t0().after(GRACE / 2);
    assert!(matches!(
        t.observe(
            &volume,
            &NodeCheck::Cached(NodeLookup::NotFound),
            Some(0),
            halfway
        ),
        GoneAction::StartTimer { .. }
    ));

    let confirm = t.observe(
        &volume,
        &NodeCheck::Cached(NodeLookup::NotFound),
        Some(0),
        end,
    );
    assert_eq!(
        confirm,
        GoneAction::ConfirmLive {
            query: NodeQuery::ByName {
                name: "n1".into(),
                uid: Some("u1".into())
            }
        },
        "the cache alone never decides"
    );
    let live = NodeCheck::Live(get(Err(api_error(404))));
    let GoneAction::ActOnPv(GonePlan::RemovePv {
        pv,
        pv_uid,
        delete_object,
        remove_finalizer,
        event,
    }) = t.observe(&volume, &live, Some(0), end)
    else {
        panic!("expected the PV to be answered as deleted");
    };
    assert_eq!((pv.as_str(), pv_uid.as_str()), ("pv-1", "uid-pv-1"));
    assert!(delete_object && remove_finalizer);
    assert_eq!(event.reason, "VolumeNodeGone");
    assert!(
        event
            .message
            .contains("node \"n1\" (UID u1) no longer exists"),
        "{}",
        event.message
    );
    assert!(
        event.message.contains("missing since 2023-11-14T22:13:20Z"),
        "{}",
        event.message
    );
    assert!(
        event.message.contains("grace period of 5m0s"),
        "{}",
        event.message
    );
    t.forget("pv-1");
    assert_eq!(t.waiting(), 0);
}

#[test]
fn a_live_404_before_the_grace_period_ends_only_waits() {
    let volume = released_on("n1", "u1").build();
    let mut t = NodeGoneTracker::new(config());
    let live = NodeCheck::Live(NodeLookup::NotFound);
    let start = t0();
    assert!(matches!(
        t.observe(&volume, &live, Some(0), start),
        GoneAction::StartTimer { .. }
    ));
    let almost = start.after(GRACE - Duration::from_secs(1));
    assert_eq!(
        t.observe(&volume, &live, Some(0), almost),
        GoneAction::StartTimer {
            deadline: start.instant + GRACE
        }
    );
}

#[test]
fn a_node_recreated_with_the_recorded_uid_within_the_grace_period_cancels() {
    let volume = released_on("n1", "u1").build();
    let mut t = NodeGoneTracker::new(config());
    let start = t0();
    t.observe(
        &volume,
        &NodeCheck::Cached(NodeLookup::NotFound),
        Some(0),
        start,
    );
    let back = NodeLookup::Found {
        uid: Some("u1".into()),
    };
    assert_eq!(
        t.observe(
            &volume,
            &NodeCheck::Cached(back.clone()),
            Some(0),
            start.after(GRACE / 2)
        ),
        GoneAction::Cancel(CancelReason::NodePresent)
    );
    assert_eq!(t.waiting(), 0);
    // Absent again later: a fresh, full grace period.
    let later = start.after(GRACE);
    assert_eq!(
        t.observe(
            &volume,
            &NodeCheck::Cached(NodeLookup::NotFound),
            Some(0),
            later
        ),
        GoneAction::StartTimer {
            deadline: later.instant + GRACE
        }
    );
}

#[test]
fn a_node_that_reappears_at_the_live_check_cancels() {
    let volume = released_on("n1", "u1").build();
    let (mut t, end) = waited_out(&volume);
    let found = node("n1").uid("u1").build();
    assert_eq!(
        t.observe(
            &volume,
            &NodeCheck::Live(get(Ok(Some(found)))),
            Some(0),
            end
        ),
        GoneAction::Cancel(CancelReason::NodePresent)
    );
}

#[test]
fn a_node_of_the_same_name_with_another_uid_counts_as_gone() {
    let volume = released_on("n1", "u1").build();
    let (mut t, end) = waited_out(&volume);
    // The cache shows a new n1 the whole time; still gone.
    let new_n1 = node("n1").uid("u2").build();
    let cached = NodeQuery::ByName {
        name: "n1".into(),
        uid: Some("u1".into()),
    }
    .lookup_in([&new_n1.metadata]);
    assert_eq!(
        cached,
        NodeLookup::Found {
            uid: Some("u2".into())
        }
    );
    assert!(matches!(
        t.observe(&volume, &NodeCheck::Cached(cached), Some(0), end),
        GoneAction::ConfirmLive { .. }
    ));
    let action = t.observe(
        &volume,
        &NodeCheck::Live(get(Ok(Some(new_n1)))),
        Some(0),
        end,
    );
    let GoneAction::ActOnPv(GonePlan::RemovePv { event, .. }) = action else {
        panic!("expected the PV to be answered as deleted, got {action:?}");
    };
    assert!(
        event
            .message
            .contains("was replaced by a new node of the same name (UID u2)"),
        "{}",
        event.message
    );
}

#[test]
fn server_errors_and_timeouts_never_count_as_absence() {
    let volume = released_on("n1", "u1").build();
    let timeout = kube::Error::Service(Box::new(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        "deadline exceeded",
    )));
    for error in [
        api_error(500),
        api_error(503),
        api_error(429),
        api_error(403),
        timeout,
    ] {
        let lookup = get(Err(error));
        assert!(matches!(lookup, NodeLookup::Failed { .. }), "{lookup:?}");

        // Never starts a clean-up on its own...
        let mut t = NodeGoneTracker::new(config());
        let start = t0();
        for minute in 0..30 {
            let now = start.after(Duration::from_secs(60 * minute));
            let action = t.observe(&volume, &NodeCheck::Live(lookup.clone()), Some(0), now);
            assert!(
                matches!(action, GoneAction::StartTimer { .. }),
                "minute {minute}: {action:?}"
            );
        }
        assert_eq!(t.waiting(), 0);

        // ...and never confirms one that the cache started.
        let (mut t, end) = waited_out(&volume);
        let action = t.observe(&volume, &NodeCheck::Live(lookup), Some(0), end);
        assert_eq!(
            action,
            GoneAction::StartTimer {
                deadline: end.instant + UNKNOWN_RECHECK
            }
        );
        assert_eq!(t.waiting(), 1, "the first-absent time is kept");
    }
}

#[test]
fn a_not_ready_node_is_not_absent() {
    let mut not_ready = node("n1").uid("u1").build();
    not_ready.status = Some(NodeStatus {
        conditions: Some(vec![NodeCondition {
            type_: "Ready".into(),
            status: "False".into(),
            ..NodeCondition::default()
        }]),
        ..NodeStatus::default()
    });
    let query = NodeQuery::ByName {
        name: "n1".into(),
        uid: Some("u1".into()),
    };
    assert_eq!(
        query.lookup_in([&not_ready.metadata]),
        NodeLookup::Found {
            uid: Some("u1".into())
        }
    );
    let volume = released_on("n1", "u1").build();
    let mut t = NodeGoneTracker::new(config());
    let lookup = NodeCheck::Live(get(Ok(Some(not_ready))));
    assert_eq!(
        t.observe(&volume, &lookup, Some(0), t0()),
        GoneAction::Nothing
    );
    assert_eq!(
        t.observe(&volume, &lookup, Some(0), t0().after(GRACE * 10)),
        GoneAction::Nothing
    );
}

#[test]
fn only_released_delete_policy_volumes_of_our_driver_pinned_to_one_node_are_candidates() {
    let cfg = config();
    let ok = released_on("n1", "u1").build();
    assert!(classify(&ok, &cfg).is_ok());
    let cases = [
        (
            released_on("n1", "u1").driver("other.csi").build(),
            Skip::NotOurDriver,
        ),
        (
            released_on("n1", "u1").reclaim("Retain").build(),
            Skip::NotDeletePolicy,
        ),
        (
            released_on("n1", "u1")
                .phase("Bound")
                .claim_ref("ns", "c", "cu")
                .build(),
            Skip::BoundClaimKept,
        ),
        (
            released_on("n1", "u1").phase("Available").build(),
            Skip::NotReleased,
        ),
        (
            pv("pv-1")
                .reclaim("Delete")
                .phase("Released")
                .node_affinity([("topology.kubernetes.io/zone", "z1")])
                .annotation(names::ANN_NODE_NAME, "n1")
                .build(),
            Skip::NotNodeLocal,
        ),
        (
            pv("pv-1").reclaim("Delete").phase("Released").build(),
            Skip::NoNodeKnown,
        ),
        (
            pv("pv-1")
                .reclaim("Delete")
                .phase("Released")
                .deleting()
                .build(),
            Skip::AlreadyHandled,
        ),
    ];
    for (volume, skip) in cases {
        assert_eq!(classify(&volume, &cfg), Err(skip));
    }
}

#[test]
fn a_volume_that_stops_being_a_candidate_is_cancelled() {
    let volume = released_on("n1", "u1").build();
    let mut t = NodeGoneTracker::new(config());
    t.observe(
        &volume,
        &NodeCheck::Cached(NodeLookup::NotFound),
        Some(0),
        t0(),
    );
    let retained = released_on("n1", "u1").reclaim("Retain").build();
    assert_eq!(
        t.observe(
            &retained,
            &NodeCheck::Cached(NodeLookup::NotFound),
            Some(0),
            t0()
        ),
        GoneAction::Cancel(CancelReason::NotCandidate(Skip::NotDeletePolicy))
    );
}

#[test]
fn a_volume_deleted_first_only_loses_our_finalizer() {
    let volume = released_on("n1", "u1").deleting().build();
    let (mut t, end) = waited_out(&volume);
    let action = t.observe(
        &volume,
        &NodeCheck::Live(NodeLookup::NotFound),
        Some(0),
        end,
    );
    assert!(matches!(
        action,
        GoneAction::ActOnPv(GonePlan::RemovePv {
            delete_object: false,
            remove_finalizer: true,
            ..
        })
    ));
}

#[test]
fn legacy_volumes_are_found_by_their_pinned_hostname_and_a_reused_name_counts_as_present() {
    let legacy = pv("pv-1")
        .reclaim("Delete")
        .phase("Released")
        .node_affinity([(HOSTNAME_LABEL, "host-1")])
        .build();
    let candidate = classify(&legacy, &config()).unwrap();
    let query = NodeQuery::ByLabel {
        key: HOSTNAME_LABEL.into(),
        value: "host-1".into(),
    };
    assert_eq!(candidate.query, query);
    assert_eq!(
        query.label_selector().as_deref(),
        Some("kubernetes.io/hostname=host-1")
    );
    let reused = node("host-1")
        .uid("new")
        .labels([(HOSTNAME_LABEL, "host-1")])
        .build();
    assert!(matches!(
        query.lookup_in([&reused.metadata]),
        NodeLookup::Found { .. }
    ));
    let other = node("host-2").labels([(HOSTNAME_LABEL, "host-2")]).build();
    assert_eq!(query.lookup_in([&other.metadata]), NodeLookup::NotFound);
}

#[test]
fn a_volume_without_affinity_relies_on_the_record_in_node_mode_only() {
    let volume = pv("pv-1")
        .reclaim("Delete")
        .phase("Released")
        .annotation(names::ANN_NODE_NAME, "n1")
        .annotation(names::ANN_NODE_UID, "u1")
        .build();
    assert_eq!(
        node_query(&volume, Mode::Node, &PerNodeKeys::default()),
        Ok(NodeQuery::ByName {
            name: "n1".into(),
            uid: Some("u1".into())
        })
    );
    assert_eq!(
        node_query(&volume, Mode::Controller, &PerNodeKeys::default()),
        Err(Unlocated::NotNodeLocal)
    );
}

#[test]
fn controller_mode_acts_on_node_local_volumes_as_the_single_instance() {
    let mut t = NodeGoneTracker::new(GoneConfig::new(DRIVER, Mode::Controller, GRACE, false));
    let volume = released_on("n1", "u1").build();
    let rank = actor_rank(Mode::Controller, &janitor_key(DRIVER), "controller-pod", []);
    assert_eq!(rank, Some(0));
    let start = t0();
    t.observe(
        &volume,
        &NodeCheck::Cached(NodeLookup::NotFound),
        rank,
        start,
    );
    assert!(matches!(
        t.observe(
            &volume,
            &NodeCheck::Live(NodeLookup::NotFound),
            rank,
            start.after(GRACE)
        ),
        GoneAction::ActOnPv(_)
    ));
}

#[test]
fn fallback_instances_wait_one_delay_per_rank_and_the_rest_do_not_track() {
    let volume = released_on("n1", "u1").build();
    let start = t0();
    let delay = config().fallback_delay;
    for rank in 0..MAX_ACTOR_RANKS {
        let mut t = NodeGoneTracker::new(config());
        let expected = start.instant + GRACE + delay * u32::try_from(rank).unwrap();
        assert_eq!(
            t.observe(
                &volume,
                &NodeCheck::Live(NodeLookup::NotFound),
                Some(rank),
                start
            ),
            GoneAction::StartTimer { deadline: expected }
        );
        let just_before =
            start.after(GRACE + delay * u32::try_from(rank).unwrap() - Duration::from_secs(1));
        assert!(matches!(
            t.observe(
                &volume,
                &NodeCheck::Live(NodeLookup::NotFound),
                Some(rank),
                just_before
            ),
            GoneAction::StartTimer { .. }
        ));
        assert_eq!(
            t.waiting(),
            usize::from(rank == 0),
            "only the primary counts in the gauge"
        );
    }
    let mut t = NodeGoneTracker::new(config());
    assert_eq!(
        t.observe(
            &volume,
            &NodeCheck::Live(NodeLookup::NotFound),
            Some(MAX_ACTOR_RANKS),
            start
        ),
        GoneAction::Nothing
    );
    assert_eq!(
        t.observe(&volume, &NodeCheck::Live(NodeLookup::NotFound), None, start),
        GoneAction::Nothing
    );
}

#[test]
fn the_next_instance_in_rendezvous_order_becomes_the_actor_when_the_first_leaves() {
    let live = ["n1", "n2", "n3", "n4", "n5"];
    let key = janitor_key(DRIVER);
    let order = rendezvous::rendezvous_order(&key, live);
    let ranks: Vec<Option<usize>> = order
        .iter()
        .map(|me| actor_rank(Mode::Node, &key, me, live))
        .collect();
    assert_eq!(ranks, vec![Some(0), Some(1), Some(2), None, None]);
    let without_first: Vec<&str> = live.iter().copied().filter(|n| *n != order[0]).collect();
    assert_eq!(
        actor_rank(Mode::Node, &key, order[1], without_first),
        Some(0)
    );
    assert_eq!(actor_rank(Mode::Node, &key, "not-live", live), None);
}

#[test]
fn claims_are_deleted_only_when_opted_in_and_the_bond_matches_by_uid() {
    let claim = pvc("ns", "data-0").volume_name("pv-1").build();
    let bound = released_on("n1", "u1").phase("Bound").claim(&claim).build();

    // Off by default.
    assert_eq!(classify(&bound, &config()), Err(Skip::BoundClaimKept));
    let (mut t, end) = waited_out(&released_on("n1", "u1").build());
    assert!(matches!(
        t.observe(&bound, &NodeCheck::Live(NodeLookup::NotFound), Some(0), end),
        GoneAction::Cancel(CancelReason::NotCandidate(Skip::BoundClaimKept))
    ));

    // Opted in.
    let mut cfg = config();
    cfg.pvc_cleanup = true;
    // A claim reference without a namespace or name would address the whole collection (found
    // by the property test): kept.
    for (ns, name) in [("", "data-0"), ("ns", "")] {
        let odd = released_on("n1", "u1")
            .phase("Bound")
            .claim_ref(ns, name, "cu")
            .build();
        assert_eq!(classify(&odd, &cfg), Err(Skip::BoundClaimKept));
    }
    let mut t = NodeGoneTracker::new(cfg);
    let start = t0();
    t.observe(
        &bound,
        &NodeCheck::Cached(NodeLookup::NotFound),
        Some(0),
        start,
    );
    let GoneAction::ActOnPv(GonePlan::DeleteClaim {
        claim: target,
        event,
        ..
    }) = t.observe(
        &bound,
        &NodeCheck::Live(NodeLookup::NotFound),
        Some(0),
        start.after(GRACE),
    )
    else {
        panic!("expected the claim to be deleted");
    };
    assert_eq!(
        target,
        ClaimToDelete {
            namespace: "ns".into(),
            name: "data-0".into(),
            uid: "uid-ns-data-0".into()
        }
    );
    assert!(
        event.message.contains("Deleted claim ns/data-0"),
        "{}",
        event.message
    );
    assert!(claim_bond_matches(&bound, &claim));
    let replaced = pvc("ns", "data-0")
        .uid("another")
        .volume_name("pv-1")
        .build();
    assert!(
        !claim_bond_matches(&bound, &replaced),
        "same name, other UID"
    );
    let elsewhere = pvc("ns", "data-0").volume_name("pv-2").build();
    assert!(
        !claim_bond_matches(&bound, &elsewhere),
        "bound to another volume"
    );

    // Once released, it is answered without a second grace period.
    let released = released_on("n1", "u1").claim(&claim).build();
    let later = start.after(GRACE + Duration::from_secs(5));
    assert!(matches!(
        t.observe(
            &released,
            &NodeCheck::Cached(NodeLookup::NotFound),
            Some(0),
            later
        ),
        GoneAction::ConfirmLive { .. }
    ));
}

#[test]
fn a_new_pv_under_the_same_name_starts_over() {
    let volume = released_on("n1", "u1").build();
    let (mut t, end) = waited_out(&volume);
    let successor = released_on("n1", "u1").uid("other-uid").build();
    assert_eq!(
        t.observe(
            &successor,
            &NodeCheck::Live(NodeLookup::NotFound),
            Some(0),
            end
        ),
        GoneAction::StartTimer {
            deadline: end.instant + GRACE
        }
    );
    t.retain(["pv-other"]);
    assert_eq!(t.waiting(), 0);
}

#[test]
fn durations_print_like_go() {
    assert_eq!(
        crate::gofmt::format_go_duration(Duration::from_secs(300)),
        "5m0s"
    );
    assert_eq!(
        crate::gofmt::format_go_duration(Duration::from_secs(45)),
        "45s"
    );
    assert_eq!(
        crate::gofmt::format_go_duration(Duration::from_secs(3723)),
        "1h2m3s"
    );
}

#[test]
fn checks_run_at_a_tenth_of_the_grace_period_within_bounds() {
    assert_eq!(check_interval(Duration::from_secs(300)), UNKNOWN_RECHECK);
    assert_eq!(check_interval(Duration::from_secs(3600)), UNKNOWN_RECHECK);
    assert_eq!(
        check_interval(Duration::from_secs(60)),
        Duration::from_secs(6)
    );
    assert_eq!(
        check_interval(Duration::from_secs(3)),
        Duration::from_secs(1)
    );
    assert_eq!(check_interval(Duration::ZERO), Duration::from_secs(1));
}

#[test]
fn an_unknown_answer_is_asked_again_after_the_configured_recheck() {
    let volume = released_on("n1", "uid-n1").build();
    let mut config = config();
    config.unknown_recheck = Duration::from_secs(2);
    let mut t = NodeGoneTracker::new(config);
    let start = t0();
    t.observe(
        &volume,
        &NodeCheck::Cached(NodeLookup::NotFound),
        Some(0),
        start,
    );
    let end = start.after(GRACE);
    let failed = NodeCheck::Live(NodeLookup::Failed {
        reason: "503".into(),
    });
    assert_eq!(
        t.observe(&volume, &failed, Some(0), end),
        GoneAction::StartTimer {
            deadline: end.instant + Duration::from_secs(2)
        }
    );
    assert_eq!(t.tracked().collect::<Vec<_>>(), vec!["pv-1"]);
}

#[test]
fn the_fallback_delay_is_half_the_grace_period_between_one_second_and_two_minutes() {
    let s = Duration::from_secs;
    assert_eq!(fallback_delay(s(300)), s(120), "default grace period");
    assert_eq!(fallback_delay(s(180)), s(90));
    assert_eq!(fallback_delay(s(4)), s(2));
    assert_eq!(fallback_delay(Duration::ZERO), s(1));
    assert_eq!(fallback_delay(s(24 * 3600)), s(120));
}
