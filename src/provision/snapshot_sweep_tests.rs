use super::*;
use crate::testing::pvc;

#[test]
fn only_snapshots_no_pending_claim_restores_from_lose_the_finalizer() {
    let pending = pvc("ns", "r1")
        .data_source(Some("snapshot.storage.k8s.io"), "VolumeSnapshot", "busy")
        .phase("Pending")
        .build();
    let bound = pvc("ns", "r2")
        .data_source(Some("snapshot.storage.k8s.io"), "VolumeSnapshot", "done")
        .phase("Bound")
        .build();
    let keep = referenced([&pending, &bound]);
    assert_eq!(keep, BTreeSet::from(["ns/busy".to_owned()]));
    let ours = vec![SNAPSHOT_SOURCE_FINALIZER.to_owned()];
    let theirs = vec!["snapshot.storage.kubernetes.io/volumesnapshot-bound-protection".to_owned()];
    let listed = [
        ("ns", "busy", ours.as_slice()),
        ("ns", "done", ours.as_slice()),
        ("ns", "untouched", theirs.as_slice()),
    ];
    assert_eq!(
        orphans(listed, &keep),
        [("ns".to_owned(), "done".to_owned())]
    );
}
