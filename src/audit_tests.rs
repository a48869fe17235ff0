use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::api::core::v1::{
    PersistentVolume, PersistentVolumeClaim, PersistentVolumeClaimCondition,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::*;
use crate::testing::{DRIVER, pv, pvc};

fn at(s: &str) -> jiff::Timestamp {
    s.parse().unwrap()
}

const NOW: &str = "2026-11-24T12:00:00Z";

fn scope() -> Scope<'static> {
    Scope {
        driver: DRIVER,
        node: None,
        listed_at: at(NOW),
        now: at(NOW),
        unused_for: Duration::from_secs(3600),
        stuck_after: Duration::from_secs(600),
    }
}

fn listed(ids: &[&str]) -> Listing {
    Listing::Volumes(ids.iter().map(|s| (*s).to_owned()).collect::<BTreeSet<_>>())
}

/// A bound dynamic PV of ours, created an hour ago, with the finalizer.
fn bound(name: &str) -> PersistentVolume {
    let mut v = pv(name)
        .provisioned_by(DRIVER)
        .reclaim("Delete")
        .claim_ref("ns", &format!("c-{name}"), &format!("cu-{name}"))
        .phase("Bound")
        .finalizer(names::FINALIZER_PV_DELETION_PROTECTION)
        .build();
    v.metadata.creation_timestamp = Some(Time(at("2026-11-24T11:00:00Z")));
    v
}

fn intent(volume: &str, id: Option<&str>) -> Intent {
    Intent {
        volume: volume.into(),
        claim: "ns/c".into(),
        uid: "u".into(),
        volume_id: id.map(Into::into),
        kept_in: "ledger",
    }
}

fn look(listing: &Listing, pvs: &[PersistentVolume], ledger: &[Intent]) -> Observation {
    observe(
        &scope(),
        listing,
        pvs,
        Vec::<PersistentVolumeClaim>::new(),
        ledger,
    )
}

#[test]
fn a_volume_without_pv_or_intent_is_leaked_only_when_both_observations_agree() {
    let pvs = [bound("a")];
    let first = look(&listed(&["handle-a", "x"]), &pvs, &[]);
    let second = look(&listed(&["handle-a", "x", "y"]), &pvs, &[]);
    let report = confirm(DRIVER, &first, &second);
    assert_eq!(report.leaked, ["x"], "y appeared only in the second look");
    assert!(report.lost.is_empty() && report.unconfirmed.is_empty());
    assert_eq!((report.pvs, report.volumes), (1, Some(3)));
}

#[test]
fn volumes_named_by_an_open_intent_are_never_leaked_and_idless_intents_make_them_unconfirmed() {
    let by_name = [intent("pvc-1", None), intent("pvc-2", Some("id-2"))];
    let obs = look(&listed(&["pvc-1", "id-2", "z"]), &[], &by_name);
    // The intent without id is open in both: z may be its answer.
    let report = confirm(DRIVER, &obs, &obs);
    assert!(report.leaked.is_empty());
    assert_eq!(report.unconfirmed, ["z"]);
    assert_eq!(report.unresolved_intents.len(), 2);
    // Once every open intent knows its id, z is leaked.
    let known = [intent("pvc-2", Some("id-2"))];
    let obs = look(&listed(&["id-2", "z"]), &[], &known);
    assert_eq!(confirm(DRIVER, &obs, &obs).leaked, ["z"]);
    // An intent whose PV exists is resolved: not reported.
    let obs = look(&listed(&["handle-pvc-2"]), &[bound("pvc-2")], &known);
    assert!(confirm(DRIVER, &obs, &obs).unresolved_intents.is_empty());
}

#[test]
fn a_pv_is_lost_only_when_old_enough_not_being_deleted_and_missing_twice() {
    let old = bound("old");
    let mut young = bound("young");
    young.metadata.creation_timestamp = Some(Time(at(NOW)));
    let mut released = bound("released");
    released.status.as_mut().unwrap().phase = Some("Released".into());
    let mut deleting = bound("deleting");
    deleting.metadata.deletion_timestamp = Some(Time(at(NOW)));
    let pvs = [old, young, released, deleting];
    let obs = look(&listed(&[]), &pvs, &[]);
    let report = confirm(DRIVER, &obs, &obs);
    let lost: Vec<&str> = report.lost.iter().map(|l| l.pv.as_str()).collect();
    assert_eq!(lost, ["old"]);
    assert_eq!(report.lost[0].claim.as_deref(), Some("ns/c-old"));
    // Back in the second listing: not lost.
    let second = look(&listed(&["handle-old"]), &pvs, &[]);
    assert!(confirm(DRIVER, &obs, &second).lost.is_empty());
}

#[test]
fn without_a_listing_nothing_is_called_leaked_or_lost_and_the_report_says_why() {
    let obs = look(
        &Listing::Unavailable("driver does not advertise LIST_VOLUMES".into()),
        &[bound("a")],
        &[],
    );
    let report = confirm(DRIVER, &obs, &obs);
    assert!(report.leaked.is_empty() && report.lost.is_empty());
    assert_eq!(report.volumes, None);
    assert!(report.volumes_not_checked.unwrap().contains("LIST_VOLUMES"));
}

#[test]
fn stuck_pvs_carry_the_reason_the_objects_give() {
    let mut terminating = bound("t");
    terminating.metadata.deletion_timestamp = Some(Time(at("2026-11-24T11:00:00Z")));
    terminating
        .metadata
        .finalizers
        .as_mut()
        .unwrap()
        .push(names::FINALIZER_PV_PROTECTION.into());
    let mut released = bound("r");
    let status = released.status.as_mut().unwrap();
    status.phase = Some("Released".into());
    status.last_phase_transition_time = Some(Time(at("2026-11-24T11:30:00Z")));
    let mut recent = bound("recent");
    let status = recent.status.as_mut().unwrap();
    status.phase = Some("Released".into());
    status.last_phase_transition_time = Some(Time(at("2026-11-24T11:55:00Z")));
    let claim = pvc("ns", "c-t").uid("cu-t").build();
    let obs = observe(
        &scope(),
        &listed(&["handle-t", "handle-r", "handle-recent"]),
        [terminating, released, recent],
        [claim],
        &[],
    );
    let stuck: Vec<(&str, &str)> = obs.stuck.iter().map(|s| (s.pv.as_str(), s.state)).collect();
    assert_eq!(stuck, [("t", "Terminating"), ("r", "Released")]);
    assert!(obs.stuck[0].reason.contains("still bound to claim ns/c-t"));
    assert!(obs.stuck[1].reason.contains("waiting for DeleteVolume"));
}

#[test]
fn pvs_of_ours_without_the_finalizer_are_listed_and_other_nodes_pvs_ignored() {
    let mut bare = bound("bare");
    bare.metadata.finalizers = None;
    let mut retain = bound("retain");
    retain.metadata.finalizers = None;
    retain
        .spec
        .as_mut()
        .unwrap()
        .persistent_volume_reclaim_policy = Some("Retain".into());
    let other = pv("other").driver("other.csi").build();
    let obs = look(
        &listed(&["handle-bare", "handle-retain"]),
        &[bare.clone(), retain, other],
        &[],
    );
    let report = confirm(DRIVER, &obs, &obs);
    let names: Vec<&str> = report
        .missing_finalizer
        .iter()
        .map(|u| u.pv.as_str())
        .collect();
    assert_eq!(names, ["bare"]);
    assert_eq!(report.pvs, 2, "the other driver's PV is not ours to audit");

    let mut pinned = bare;
    pinned
        .metadata
        .labels
        .get_or_insert_default()
        .insert(names::LABEL_PV_NODE.into(), "node-b".into());
    let node_scope = Scope {
        node: Some("node-a"),
        ..scope()
    };
    let obs = observe(
        &node_scope,
        &listed(&[]),
        [pinned],
        Vec::<PersistentVolumeClaim>::new(),
        &[],
    );
    assert_eq!(obs.pvs, 0);
    assert!(obs.lost.is_empty());
}

#[test]
fn unused_claims_come_from_the_condition_where_kubernetes_keeps_it_else_from_our_annotation() {
    let old = "2026-11-20T00:00:00Z";
    let annotated = pvc("ns", "a")
        .provisioner(DRIVER)
        .annotation(names::ANN_UNUSED_SINCE, old)
        .build();
    let fresh = pvc("ns", "fresh")
        .provisioner(DRIVER)
        .annotation(names::ANN_UNUSED_SINCE, "2026-11-24T11:59:00Z")
        .build();
    let condition = |status: &str| PersistentVolumeClaimCondition {
        type_: names::CONDITION_UNUSED.into(),
        status: status.into(),
        last_transition_time: Some(Time(at(old))),
        ..Default::default()
    };
    let mut in_use = pvc("ns", "in-use")
        .provisioner(DRIVER)
        .annotation(names::ANN_UNUSED_SINCE, old)
        .build();
    in_use.status.get_or_insert_default().conditions = Some(vec![condition("False")]);
    let mut by_condition = pvc("ns", "cond").provisioner(DRIVER).build();
    by_condition.status.get_or_insert_default().conditions = Some(vec![condition("True")]);
    let foreign = pvc("ns", "foreign")
        .provisioner("other.csi")
        .annotation(names::ANN_UNUSED_SINCE, old)
        .build();
    let obs = observe(
        &scope(),
        &listed(&[]),
        Vec::<PersistentVolume>::new(),
        [annotated, fresh, in_use, by_condition, foreign],
        &[],
    );
    let unused: Vec<(&str, &str)> = obs
        .unused
        .iter()
        .map(|u| (u.claim.as_str(), u.from))
        .collect();
    assert_eq!(unused, [("ns/a", "annotation"), ("ns/cond", "condition")]);
    assert_eq!(obs.unused[0].age_seconds, 4 * 86_400 + 12 * 3600);
    let report = confirm(DRIVER, &obs, &obs);
    let buckets =
        crate::unused::controller::buckets(report.unused_claims.iter().map(|u| u.age_seconds));
    assert_eq!(buckets[1], ("1d_7d", 2));
}

#[test]
fn the_table_has_a_section_per_finding_and_json_and_yaml_carry_the_same_fields() {
    let pvs = [bound("a")];
    let obs = look(&listed(&["x"]), &pvs, &[]);
    let report = confirm(DRIVER, &obs, &obs);
    let table = render::render(&report, args::Output::Table);
    assert!(
        table.starts_with("driver mock.csi.test: 1 PVs, 1 volumes\n"),
        "{table}"
    );
    for section in [
        "Leaked volumes (no PV) (1):\n  VOLUME ID\n  x\n",
        "Lost volumes (PV without its volume) (1):",
        "Stuck PVs (0):",
        "Unresolved intents (0):",
        "Unused claims (0):",
    ] {
        assert!(table.contains(section), "{section:?} missing:\n{table}");
    }
    let json: serde_json::Value =
        serde_json::from_str(&render::render(&report, args::Output::Json)).unwrap();
    assert_eq!(json["leaked"][0], "x");
    assert_eq!(json["lost"][0]["volumeHandle"], "handle-a");
    let yaml = render::render(&report, args::Output::Yaml);
    assert!(yaml.contains("leaked:\n- x\n"), "{yaml}");
    assert!(yaml.contains("volumeHandle: handle-a"), "{yaml}");
}
