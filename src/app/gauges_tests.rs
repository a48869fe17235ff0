use super::*;

#[test]
fn pending_claims_and_volumes_stuck_longer_than_ten_minutes_are_counted() {
    use crate::testing::{DRIVER, pv, pvc};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    let now: jiff::Timestamp = "2026-11-23T12:00:00Z".parse().unwrap();
    let at = |mins: i64| Time(now - jiff::SignedDuration::from_mins(mins));
    let mut bound = pvc("ns", "bound").provisioner(DRIVER).build();
    bound.status = Some(Default::default());
    bound.status.as_mut().unwrap().phase = Some("Bound".into());
    let claims = [
        pvc("ns", "waiting").provisioner(DRIVER).build(),
        pvc("ns", "other").provisioner("other.csi").build(),
        bound,
    ]
    .map(|c| Arc::new(Lean::new(c)));
    let released = |name: &str, mins: i64| {
        let mut v = pv(name).build();
        v.spec
            .get_or_insert_default()
            .csi
            .get_or_insert_default()
            .driver = DRIVER.into();
        let status = v.status.get_or_insert_default();
        status.phase = Some("Released".into());
        status.last_phase_transition_time = Some(at(mins));
        v
    };
    let mut terminating = released("t", 1);
    terminating.status = None;
    terminating.metadata.deletion_timestamp = Some(at(30));
    let pvs =
        [released("old", 11), released("new", 9), terminating].map(|v| Arc::new(Lean::new(v)));
    let counts = count(&claims, &pvs, DRIVER, None, now);
    assert_eq!(
        (
            counts.pending,
            counts.released_stuck,
            counts.terminating_stuck
        ),
        (1, 1, 1)
    );
}

#[test]
fn the_backlog_counts_intents_and_pending_deletions_and_in_node_mode_only_this_nodes() {
    use crate::names::{FINALIZER_PV_DELETION_PROTECTION, LABEL_PV_NODE};
    use crate::testing::{DRIVER, pv, pvc};
    let intent = crate::names::FINALIZER_PROVISIONING_INTENT;
    let claims = [
        pvc("ns", "a")
            .provisioner(DRIVER)
            .selected_node("n1")
            .finalizer(intent)
            .build(),
        pvc("ns", "b")
            .provisioner(DRIVER)
            .selected_node("n2")
            .finalizer(intent)
            .build(),
        pvc("ns", "c")
            .provisioner(DRIVER)
            .selected_node("n1")
            .build(),
    ]
    .map(|c| Arc::new(Lean::new(c)));
    let released = |name: &str, node: &str| {
        pv(name)
            .provisioned_by(DRIVER)
            .reclaim("Delete")
            .claim_ref("ns", "c", "uid-c")
            .phase("Released")
            .finalizer(FINALIZER_PV_DELETION_PROTECTION)
            .label(LABEL_PV_NODE, node)
            .build()
    };
    let pvs = [
        released("pv-1", "n1"),
        released("pv-2", "n2"),
        pv("pv-3").provisioned_by(DRIVER).phase("Bound").build(),
    ]
    .map(|v| Arc::new(Lean::new(v)));
    let count_backlog = |driver, node| {
        let counts = count(&claims, &pvs, driver, node, jiff::Timestamp::now());
        (counts.claims_with_intent, counts.volumes_awaiting_deletion)
    };
    assert_eq!(count_backlog(DRIVER, None), (2, 2));
    assert_eq!(count_backlog(DRIVER, Some("n1")), (1, 1));
    assert_eq!(
        count_backlog("other.example", None),
        (0, 0),
        "another driver's intents and volumes are its own sidecar's"
    );
}
