//! The data-source checks, one upstream check per test, in upstream's order and words.

use super::*;
use crate::testing::{DRIVER, pv, pvc};

fn source_claim() -> PersistentVolumeClaim {
    pvc("ns", "src")
        .class("fast")
        .request("1Gi")
        .volume_name("pv-src")
        .phase("Bound")
        .build()
}

fn clone_of(size: &str) -> PersistentVolumeClaim {
    pvc("ns", "copy")
        .class("fast")
        .request(size)
        .data_source(None, "PersistentVolumeClaim", "src")
        .build()
}

fn clone(
    wanted: &PersistentVolumeClaim,
    source: &PersistentVolumeClaim,
    source_pv: &PersistentVolume,
) -> Result<ContentSource, String> {
    clone_source(wanted, "ns", "src", Some(source), Some(source_pv), DRIVER)
}

#[test]
fn source_ref_names_claims_and_snapshots_and_leaves_populators_alone() {
    let claim = clone_of("1Gi");
    assert_eq!(
        source_ref(&claim),
        Some(SourceRef::Claim {
            namespace: "ns".into(),
            name: "src".into()
        })
    );
    let restore = pvc("ns", "r")
        .data_source_ref(Some(SNAPSHOT_GROUP), "VolumeSnapshot", "s", Some("other"))
        .build();
    assert_eq!(
        source_ref(&restore),
        Some(SourceRef::Snapshot {
            namespace: "other".into(),
            name: "s".into()
        })
    );
    let populated = pvc("ns", "p")
        .data_source(Some("hello.example.com"), "Hello", "h")
        .build();
    assert_eq!(source_ref(&populated), None);
    // Upstream clones by kind alone.
    let grouped = pvc("ns", "g")
        .data_source(Some("example.com"), "PersistentVolumeClaim", "src")
        .build();
    assert_eq!(
        source_ref(&grouped),
        Some(SourceRef::Claim {
            namespace: "ns".into(),
            name: "src".into()
        })
    );
    assert_eq!(source_ref(&pvc("ns", "plain").build()), None);
}

#[test]
fn a_bound_source_of_our_driver_clones_its_volume() {
    let source = source_claim();
    let source_pv = pv("pv-src").claim(&source).phase("Bound").build();
    assert_eq!(
        clone(&clone_of("2Gi"), &source, &source_pv),
        Ok(ContentSource::Volume {
            volume_id: "handle-pv-src".into()
        })
    );
}

#[test]
fn clone_checks_come_in_upstreams_order_with_its_messages() {
    let source = source_claim();
    let source_pv = pv("pv-src").claim(&source).phase("Bound").build();
    let wanted = clone_of("1Gi");

    let missing = clone_source(&wanted, "ns", "src", None, None, DRIVER).unwrap_err();
    // Upstream's lister text: singular resource (issue 28).
    assert_eq!(
        missing,
        "error getting PVC src (namespace \"ns\") from api server: persistentvolumeclaim \"src\" not found"
    );

    let pending = pvc("ns", "src").class("fast").phase("Pending").build();
    assert_eq!(
        clone(&wanted, &pending, &source_pv).unwrap_err(),
        "the PVC DataSource src must have a status of Bound.  Got {Pending [] map[] [] map[] map[] <nil> nil}"
    );
    let deleting = pvc("ns", "src")
        .class("fast")
        .volume_name("pv-src")
        .phase("Bound")
        .deleting()
        .build();
    assert_eq!(
        clone(&wanted, &deleting, &source_pv).unwrap_err(),
        "the PVC DataSource src is currently being deleted"
    );
    let classless = pvc("ns", "src")
        .volume_name("pv-src")
        .phase("Bound")
        .build();
    assert_eq!(
        clone(&wanted, &classless, &source_pv).unwrap_err(),
        "the source PVC (src) storageclass cannot be empty"
    );
    assert_eq!(
        clone(&clone_of("512Mi"), &source, &source_pv).unwrap_err(),
        "error, new PVC request must be greater than or equal in size to the specified PVC data source, requested 536870912 but source is 1073741824"
    );
    let other_driver = pv("pv-src")
        .driver("other.csi")
        .claim(&source)
        .phase("Bound")
        .build();
    assert_eq!(
        clone(&wanted, &source, &other_driver).unwrap_err(),
        "claim in dataSource not bound or invalid"
    );
    let released = pv("pv-src").claim(&source).phase("Released").build();
    assert_eq!(
        clone(&wanted, &source, &released).unwrap_err(),
        "claim in dataSource not bound or invalid"
    );
    let block = pvc("ns", "copy")
        .class("fast")
        .volume_mode_block()
        .data_source(None, "PersistentVolumeClaim", "src")
        .build();
    assert_eq!(
        clone(&block, &source, &source_pv).unwrap_err(),
        "the source PVC and destination PVCs must have the same volume mode for cloning.  Source is Filesystem, but new PVC requested Block"
    );
}

fn snapshot(ready: bool) -> VolumeSnapshot {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": "snap", "namespace": "ns", "uid": "uid-snap"},
        "status": {"boundVolumeSnapshotContentName": "content", "readyToUse": ready,
            "restoreSize": "2Gi"}
    }))
    .expect("snapshot")
}

fn content(driver: &str, mode: &str, annotation: Option<&str>) -> SnapshotContent {
    let annotations = annotation.map(|v| serde_json::json!({ALLOW_MODE_CHANGE: v}));
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": "content", "annotations": annotations},
        "spec": {"driver": driver, "sourceVolumeMode": mode,
            "volumeSnapshotRef": {"name": "snap", "namespace": "ns", "uid": "uid-snap"}},
        "status": {"snapshotHandle": "snap-1"}
    }))
    .expect("content")
}

fn restore(
    wanted: &PersistentVolumeClaim,
    snapshot: &VolumeSnapshot,
    content: &SnapshotContent,
) -> Result<ContentSource, String> {
    let read = SnapshotRead::Read(snapshot, Some(Ok(content)));
    snapshot_source(wanted, "snap", read, "fast", DRIVER, true)
}

fn restore_of(size: &str) -> PersistentVolumeClaim {
    pvc("ns", "r")
        .class("fast")
        .request(size)
        .volume_mode_filesystem()
        .data_source(Some(SNAPSHOT_GROUP), "VolumeSnapshot", "snap")
        .build()
}

#[test]
fn a_ready_snapshot_of_our_driver_is_restored_by_its_handle() {
    let ok = restore(
        &restore_of("2Gi"),
        &snapshot(true),
        &content(DRIVER, "Filesystem", None),
    );
    assert_eq!(
        ok,
        Ok(ContentSource::Snapshot {
            snapshot_id: "snap-1".into()
        })
    );
}

#[test]
fn snapshot_checks_come_in_upstreams_order_with_its_messages() {
    let wanted = restore_of("2Gi");
    let ours = content(DRIVER, "Filesystem", None);
    let failed = snapshot_source(
        &wanted,
        "snap",
        SnapshotRead::SnapshotFailed("volumesnapshots \"snap\" not found"),
        "fast",
        DRIVER,
        true,
    );
    assert_eq!(
        failed.unwrap_err(),
        "error getting snapshot snap from api server: volumesnapshots \"snap\" not found"
    );
    let mut unbound = snapshot(true);
    unbound.status = None;
    assert_eq!(
        restore(&wanted, &unbound, &ours).unwrap_err(),
        "snapshot snap not bound"
    );
    let mut stolen = content(DRIVER, "Filesystem", None);
    stolen.spec.volume_snapshot_ref.uid = Some("someone-else".into());
    assert_eq!(
        restore(&wanted, &snapshot(true), &stolen).unwrap_err(),
        "snapshotcontent content for snapshot snap is bound to a different snapshot"
    );
    assert_eq!(
        restore(
            &wanted,
            &snapshot(true),
            &content("other.csi", "Filesystem", None)
        )
        .unwrap_err(),
        "snapshotcontent content for snapshot snap is not handled by CSI driver of StorageClass fast"
    );
    assert_eq!(
        restore(&wanted, &snapshot(false), &ours).unwrap_err(),
        "snapshot snap is not Ready"
    );
    let mut no_handle = content(DRIVER, "Filesystem", None);
    no_handle.status = None;
    assert_eq!(
        restore(&wanted, &snapshot(true), &no_handle).unwrap_err(),
        "snapshot handle snap is not available"
    );
    assert_eq!(
        restore(&restore_of("1Gi"), &snapshot(true), &ours).unwrap_err(),
        "requested volume size 1073741824 is less than the size 2147483648 for the source snapshot snap"
    );
}

#[test]
fn a_volume_mode_change_needs_the_contents_permission() {
    let wanted = restore_of("2Gi");
    let block = content(DRIVER, "Block", None);
    let refused = restore(&wanted, &snapshot(true), &block).unwrap_err();
    assert!(
        refused.starts_with(
            "requested volume ns/r modifies the mode of the source volume but does not have permission to do so."
        ),
        "{refused}"
    );
    let start = "requested volume ns/r modifies the mode of the source volume but does not have permission to do so.";
    // Issue 33: upstream's key is snapshot.storage.kubernetes.io, and its three texts.
    assert_eq!(
        refused,
        format!(
            "{start} snapshot.storage.kubernetes.io/allow-volume-mode-change annotation is not present on snapshotcontent content"
        )
    );
    let allowed = content(DRIVER, "Block", Some("true"));
    assert!(restore(&wanted, &snapshot(true), &allowed).is_ok());
    let denied = content(DRIVER, "Block", Some("false"));
    assert_eq!(
        restore(&wanted, &snapshot(true), &denied).unwrap_err(),
        format!(
            "{start} snapshot.storage.kubernetes.io/allow-volume-mode-change is set to false on snapshotcontent content"
        )
    );
    let garbled = content(DRIVER, "Block", Some("maybe"));
    assert_eq!(
        restore(&wanted, &snapshot(true), &garbled).unwrap_err(),
        format!(
            "{start} failed to convert snapshot.storage.kubernetes.io/allow-volume-mode-change annotation value to boolean with error: strconv.ParseBool: parsing \"maybe\": invalid syntax"
        )
    );
    // Without --prevent-volume-mode-conversion the mode is not compared.
    let read = SnapshotRead::Read(&snapshot(true), Some(Ok(&block)));
    assert!(snapshot_source(&wanted, "snap", read, "fast", DRIVER, false).is_ok());
}

#[test]
fn a_source_is_held_only_by_pending_clones_of_its_own_namespace() {
    let source = pvc("ns", "src")
        .finalizer(crate::names::FINALIZER_CLONING_PROTECTION)
        .deleting()
        .build();
    assert!(holds_clone_protection(&source));
    let pending = pvc("ns", "copy")
        .data_source(None, "PersistentVolumeClaim", "src")
        .phase("Pending")
        .build();
    let bound = pvc("ns", "done")
        .data_source(None, "PersistentVolumeClaim", "src")
        .phase("Bound")
        .build();
    let elsewhere = pvc("other", "copy")
        .data_source(None, "PersistentVolumeClaim", "src")
        .phase("Pending")
        .build();
    assert!(clone_in_progress(&source, [&pending, &bound]));
    assert!(!clone_in_progress(&source, [&bound, &elsewhere]));
    let kept = pvc("ns", "src")
        .finalizer(crate::names::FINALIZER_CLONING_PROTECTION)
        .build();
    assert!(
        !holds_clone_protection(&kept),
        "not being deleted: nothing to release"
    );
}

#[test]
fn a_reference_grant_must_name_both_sides() {
    let grant = |from_ns: &str, to_kind: &str, to_name: Option<&str>| -> ReferenceGrant {
        serde_json::from_value(serde_json::json!({"spec": {
            "from": [{"group": "", "kind": "PersistentVolumeClaim", "namespace": from_ns}],
            "to": [{"group": SNAPSHOT_GROUP, "kind": to_kind, "name": to_name}]}}))
        .expect("grant")
    };
    let allows =
        |g: ReferenceGrant| grant_allows(&[g], "apps", SNAPSHOT_GROUP, "VolumeSnapshot", "s");
    assert!(allows(grant("apps", "VolumeSnapshot", None)));
    assert!(allows(grant("apps", "VolumeSnapshot", Some("s"))));
    assert!(allows(grant("apps", "VolumeSnapshot", Some(""))));
    assert!(!allows(grant("apps", "VolumeSnapshot", Some("other"))));
    assert!(
        !allows(grant("web", "VolumeSnapshot", None)),
        "another namespace's claims"
    );
    assert!(
        !allows(grant("apps", "PersistentVolumeClaim", None)),
        "another kind"
    );
    assert!(!grant_allows(
        &[],
        "apps",
        SNAPSHOT_GROUP,
        "VolumeSnapshot",
        "s"
    ));
}

/// Upstream refuses a source being deleted even when our own protection holds it, so such a clone
/// never finishes and the source stays Terminating; held by the finalizer, it is still cloned.
#[test]
fn a_source_held_by_the_clone_protection_finalizer_can_still_be_cloned() {
    let held = pvc("ns", "src")
        .class("fast")
        .request("1Gi")
        .volume_name("pv-src")
        .phase("Bound")
        .finalizer(crate::names::FINALIZER_CLONING_PROTECTION)
        .deleting()
        .build();
    let held_pv = pv("pv-src").claim(&held).phase("Bound").build();
    assert!(clone(&clone_of("1Gi"), &held, &held_pv).is_ok());
}
