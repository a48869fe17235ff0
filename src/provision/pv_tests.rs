//! Tests for `provision::pv`: the PV upstream writes, answers accepted and refused.

use super::*;
use crate::csi::v1::{Topology, VolumeContentSource};
use crate::testing::{DRIVER, pvc};

fn template() -> PvTemplate {
    let claim = pvc("ns", "data")
        .uid("uid-1")
        .resource_version("42")
        .build();
    PvTemplate {
        name: "pvc-uid-1".to_owned(),
        driver: DRIVER.to_owned(),
        provisioned_by: DRIVER.to_owned(),
        provisioner_identity: "1700000000000-1234-mock.csi.test".to_owned(),
        claim_ref: claim_ref(&claim),
        class_name: "fast".to_owned(),
        access_modes: vec!["ReadWriteOnce".to_owned()],
        mount_options: None,
        reclaim_policy: None,
        volume_mode: None,
        block: false,
        fs_type: String::new(),
        secrets: SecretRefs::default(),
        read_only: false,
        topology: false,
        volume_attributes_class: None,
        required_bytes: 1 << 30,
        expects_content_source: false,
        node: None,
        node_is_selection: false,
        in_tree: None,
    }
}

fn answer(capacity: i64, id: &str) -> CreateVolumeResponse {
    CreateVolumeResponse {
        volume: Some(Volume {
            capacity_bytes: capacity,
            volume_id: id.to_owned(),
            volume_context: [("k".to_owned(), "v".to_owned())].into(),
            content_source: None,
            accessible_topology: vec![],
        }),
    }
}

#[test]
fn normal_provision_writes_upstreams_pv() {
    let t = template();
    let new = t.fill(&answer(1 << 30, "vol-1")).unwrap();
    assert_eq!(new.volume_id, "vol-1");
    let pv = new.pv;
    let ann = pv.metadata.annotations.as_ref().unwrap();
    assert_eq!(pv.metadata.name.as_deref(), Some("pvc-uid-1"));
    assert_eq!(ann[names::ANN_PROVISIONED_BY], DRIVER);
    assert_eq!(ann[names::ANN_DELETION_SECRET_NAME], "");
    assert_eq!(ann[names::ANN_DELETION_SECRET_NAMESPACE], "");
    assert!(!ann.contains_key(names::ANN_MODIFY_SECRET_NAME));
    assert_eq!(
        pv.metadata.finalizers,
        Some(vec![names::FINALIZER_PV_DELETION_PROTECTION.to_owned()])
    );
    let spec = pv.spec.unwrap();
    assert_eq!(spec.capacity.unwrap()["storage"].0, "1Gi");
    let csi = spec.csi.unwrap();
    assert_eq!(csi.volume_handle, "vol-1");
    assert_eq!(csi.driver, DRIVER);
    assert_eq!(csi.fs_type, None);
    assert_eq!(csi.read_only, None);
    let attrs = csi.volume_attributes.unwrap();
    assert_eq!(
        attrs[names::VOLUME_ATTR_PROVISIONER_IDENTITY],
        "1700000000000-1234-mock.csi.test"
    );
    assert_eq!(attrs["k"], "v");
    let claim_ref = spec.claim_ref.unwrap();
    assert_eq!(claim_ref.uid.as_deref(), Some("uid-1"));
    assert_eq!(claim_ref.resource_version.as_deref(), Some("42"));
    assert_eq!(claim_ref.kind.as_deref(), Some("PersistentVolumeClaim"));
    assert_eq!(spec.storage_class_name.as_deref(), Some("fast"));
    assert_eq!(spec.persistent_volume_reclaim_policy, None);
    assert_eq!(spec.node_affinity, None);
}

#[test]
fn class_settings_secrets_and_mode_reach_the_pv() {
    let mut t = template();
    t.mount_options = Some(vec!["noatime".to_owned()]);
    t.reclaim_policy = Some("Retain".to_owned());
    t.fs_type = "xfs".to_owned();
    t.read_only = true;
    t.volume_attributes_class = Some("gold".to_owned());
    t.secrets.provisioner = Some(SecretRef::new("prov", "ns1"));
    t.secrets.node_stage = Some(SecretRef::new("stage", "ns2"));
    t.secrets.controller_modify = Some(SecretRef::new("mod", "ns3"));
    t.node = Some(("n1".to_owned(), Some("uid-n1".to_owned())));
    let pv = t.fill(&answer(2 << 30, "vol-1")).unwrap().pv;
    let ann = pv.metadata.annotations.unwrap();
    assert_eq!(ann[names::ANN_DELETION_SECRET_NAME], "prov");
    assert_eq!(ann[names::ANN_DELETION_SECRET_NAMESPACE], "ns1");
    assert_eq!(ann[names::ANN_MODIFY_SECRET_NAME], "mod");
    assert_eq!(ann[names::ANN_MODIFY_SECRET_NAMESPACE], "ns3");
    assert_eq!(ann[names::ANN_NODE_NAME], "n1");
    assert_eq!(ann[names::ANN_NODE_UID], "uid-n1");
    let spec = pv.spec.unwrap();
    assert_eq!(spec.mount_options, Some(vec!["noatime".to_owned()]));
    assert_eq!(
        spec.persistent_volume_reclaim_policy.as_deref(),
        Some("Retain")
    );
    assert_eq!(spec.volume_attributes_class_name.as_deref(), Some("gold"));
    assert_eq!(spec.capacity.unwrap()["storage"].0, "2Gi");
    let csi = spec.csi.unwrap();
    assert_eq!(csi.fs_type.as_deref(), Some("xfs"));
    assert_eq!(csi.read_only, Some(true));
    assert_eq!(
        csi.node_stage_secret_ref,
        Some(SecretReference {
            name: Some("stage".to_owned()),
            namespace: Some("ns2".to_owned())
        })
    );
    assert_eq!(csi.node_publish_secret_ref, None);
    assert_eq!(csi.controller_publish_secret_ref, None);
}

#[test]
fn block_volumes_carry_no_fs_type() {
    let mut t = template();
    t.block = true;
    t.fs_type = "ext4".to_owned();
    t.volume_mode = Some("Block".to_owned());
    let spec = t.fill(&answer(0, "v")).unwrap().pv.spec.unwrap();
    assert_eq!(spec.volume_mode.as_deref(), Some("Block"));
    assert_eq!(spec.csi.unwrap().fs_type, None);
}

#[test]
fn topology_answer_becomes_node_affinity_only_with_topology() {
    let mut t = template();
    let mut resp = answer(0, "v");
    resp.volume.as_mut().unwrap().accessible_topology = vec![Topology {
        segments: [("zone".to_owned(), "z1".to_owned())].into(),
    }];
    assert_eq!(t.fill(&resp).unwrap().pv.spec.unwrap().node_affinity, None);
    t.topology = true;
    let expected = crate::testing::pv("x")
        .node_affinity([("zone", "z1")])
        .build();
    assert_eq!(
        t.fill(&resp).unwrap().pv.spec.unwrap().node_affinity,
        expected.spec.unwrap().node_affinity
    );
}

/// Issue 28: in controller mode the selected node is recorded only where the driver put the
/// volume; a volume placed on another node gets no record (its affinity says where it is).
#[test]
fn a_selected_node_is_recorded_only_when_the_volume_lives_there() {
    let mut t = template();
    t.topology = true;
    t.node_is_selection = true;
    t.node = Some(("node-2".to_owned(), Some("uid-2".to_owned())));
    let on = |t: &PvTemplate, node: &str| {
        let mut resp = answer(0, "v");
        resp.volume.as_mut().unwrap().accessible_topology = vec![Topology {
            segments: [("topo/node".to_owned(), node.to_owned())].into(),
        }];
        t.fill(&resp).unwrap().pv
    };
    let elsewhere = on(&t, "node-1").metadata.annotations.unwrap();
    assert!(!elsewhere.contains_key(names::ANN_NODE_NAME));
    assert!(!elsewhere.contains_key(names::ANN_NODE_UID));
    let there = on(&t, "node-2").metadata.annotations.unwrap();
    assert_eq!(there[names::ANN_NODE_NAME], "node-2");
    assert_eq!(there[names::ANN_NODE_UID], "uid-2");
    // Node mode: the instance's own node, where its driver made the volume.
    t.node_is_selection = false;
    t.node = Some(("node-9".to_owned(), None));
    let own = on(&t, "node-1").metadata.annotations.unwrap();
    assert_eq!(own[names::ANN_NODE_NAME], "node-9");
}

/// "provision with size 0" and "fail vol with less capacity".
#[test]
fn capacity_zero_means_the_request_and_less_is_an_error() {
    let t = template();
    let storage = |new: NewPv| new.pv.spec.unwrap().capacity.unwrap()["storage"].0.clone();
    assert_eq!(
        storage(t.fill(&answer(0, "v")).unwrap()),
        bytes_to_quantity(1 << 30)
    );
    let err = t.fill(&answer(100, "vol-small")).unwrap_err();
    assert_eq!(
        err.to_string(),
        "created volume capacity 100 less than requested capacity 1073741824"
    );
    assert_eq!(err.volume_to_delete(), Some("vol-small"));
    assert_eq!(
        err.with_failed_cleanup("pvc-uid-1", "rpc error: boom"),
        "created volume capacity 100 less than requested capacity 1073741824. Cleanup of volume pvc-uid-1 failed, volume is orphaned: rpc error: boom"
    );
    assert_eq!(
        storage(t.fill(&answer((1 << 30) + 1, "v")).unwrap()),
        bytes_to_quantity((1 << 30) + 1)
    );
}

#[test]
fn broken_answers_are_errors_not_panics() {
    let t = template();
    let err = t.fill(&CreateVolumeResponse { volume: None }).unwrap_err();
    assert_eq!(err.volume_to_delete(), None);
    assert!(err.to_string().contains("pvc-uid-1"));
    let err = t.fill(&answer(1 << 30, "")).unwrap_err();
    assert!(matches!(err, AnswerError::EmptyVolumeId { .. }));
    assert_eq!(err.volume_to_delete(), None);
    // Unstorable answers: the volume goes again, the message says what was wrong.
    let err = t.fill(&answer(1 << 30, "vol-1\n\u{1b}[31m")).unwrap_err();
    assert_eq!(err.volume_to_delete(), Some("vol-1\n\u{1b}[31m"));
    assert!(
        err.to_string()
            .contains(r#"control characters ("vol-1\n\u{1b}[31m")"#),
        "{err}"
    );
    let mut big = answer(1 << 30, "vol-2");
    let context = &mut big.volume.as_mut().unwrap().volume_context;
    context.insert("blob".into(), "x".repeat(MAX_VOLUME_CONTEXT_BYTES));
    let err = t.fill(&big).unwrap_err();
    assert_eq!(err.volume_to_delete(), Some("vol-2"));
    assert!(
        err.to_string()
            .contains("bytes (at most 262144 are accepted)"),
        "{err}"
    );
}

#[test]
fn a_cloned_or_restored_volume_must_report_its_source() {
    let mut t = template();
    t.expects_content_source = true;
    let err = t.fill(&answer(1 << 30, "v")).unwrap_err();
    assert_eq!(err.to_string(), "volume content source missing");
    assert_eq!(
        err.with_failed_cleanup("p", "e"),
        "volume content source missing. cleanup of volume p failed, volume is orphaned: e"
    );
    let mut resp = answer(1 << 30, "v");
    resp.volume.as_mut().unwrap().content_source = Some(VolumeContentSource { r#type: None });
    assert!(t.fill(&resp).is_ok());
}

#[test]
fn an_existing_pv_is_the_same_volume_only_with_the_same_known_handle() {
    use crate::testing::pv;
    let held = pv("pvc-1").handle("vol-1").build();
    assert!(pv_holds_volume(Some(&held), Some("vol-1")));
    assert!(!pv_holds_volume(Some(&held), Some("vol-2")));
    assert!(!pv_holds_volume(Some(&held), None), "an unknown handle");
    assert!(!pv_holds_volume(None, Some("vol-1")), "no PV read");
    assert!(!pv_holds_volume(
        Some(&pv("pvc-1").no_csi().build()),
        Some("vol-1")
    ));
}
