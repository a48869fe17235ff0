use super::*;
use crate::testing::pvc;

#[test]
fn volume_names_are_prefix_and_uid() {
    let uid = "2d9ee1bf-5a5b-4dd5-b6b1-7c3a2f0b9c11";
    assert_eq!(
        make_volume_name("pvc", uid, None).unwrap(),
        format!("pvc-{uid}")
    );
    assert_eq!(
        make_volume_name("vol", uid, Some(16)).unwrap(),
        "vol-2d9ee1bf5a5b4dd5"
    );
    assert_eq!(
        make_volume_name("vol", uid, Some(64)).unwrap(),
        "vol-2d9ee1bf5a5b4dd5b6b17c3a2f0b9c11"
    );
    // "fail to make volume name"
    assert_eq!(
        make_volume_name("", uid, None).unwrap_err().to_string(),
        "volume name prefix cannot be of length 0"
    );
    assert_eq!(
        make_volume_name("pvc", "", None).unwrap_err().to_string(),
        "corrupted PVC object, it is missing UID"
    );
}

#[test]
fn requested_size_comes_from_the_claim() {
    assert_eq!(
        requested_bytes(&pvc("ns", "c").request("2Gi").build()),
        Ok(2 << 30)
    );
    assert_eq!(requested_bytes(&pvc("ns", "c").no_request().build()), Ok(0));
    let err = requested_bytes(&pvc("ns", "c").request("2 GB").build()).unwrap_err();
    assert!(
        err.to_string()
            .starts_with("invalid size \"2 GB\" in spec.resources.requests.storage of the claim: ")
    );
    assert!(err.to_string().ends_with("use a quantity such as 10Gi"));
}

fn modes(caps: &[VolumeCapability]) -> Vec<Mode> {
    caps.iter()
        .map(|c| Mode::try_from(c.access_mode.as_ref().unwrap().mode).unwrap())
        .collect()
}

/// Upstream's access-mode cases ("provision with access mode ...").
#[test]
fn access_modes_map_to_csi_modes() {
    let m = |list: &[&str], snmw: bool| {
        let list: Vec<String> = list.iter().map(|s| (*s).to_owned()).collect();
        modes(&volume_capabilities(&list, false, "", &[], snmw).unwrap())
    };
    assert_eq!(m(&["ReadWriteMany"], false), [Mode::MultiNodeMultiWriter]);
    assert_eq!(m(&["ReadOnlyMany"], false), [Mode::MultiNodeReaderOnly]);
    assert_eq!(m(&["ReadWriteOnce"], false), [Mode::SingleNodeWriter]);
    assert_eq!(m(&["ReadWriteOncePod"], false), [Mode::SingleNodeWriter]);
    assert_eq!(m(&["ReadWriteOnce"], true), [Mode::SingleNodeMultiWriter]);
    assert_eq!(
        m(&["ReadWriteOncePod"], true),
        [Mode::SingleNodeSingleWriter]
    );
    assert_eq!(m(&["ReadOnlyMany"], true), [Mode::MultiNodeReaderOnly]);
    // "provision with multiple access modes": one capability per mode, in order.
    assert_eq!(
        m(&["ReadWriteOnce", "ReadOnlyMany", "ReadWriteMany"], false),
        [
            Mode::SingleNodeWriter,
            Mode::MultiNodeReaderOnly,
            Mode::MultiNodeMultiWriter
        ]
    );
    let err = volume_capabilities(&["ReadMostly".to_owned()], false, "", &[], false);
    assert_eq!(
        err.unwrap_err().to_string(),
        "unsupported AccessMode combination: [ReadMostly]"
    );
    assert_eq!(
        volume_capabilities(&[], false, "", &[], false),
        Err(RequestError::NoAccessModes)
    );
}

#[test]
fn block_claims_get_block_capabilities_and_others_mount_with_options() {
    let rwo = ["ReadWriteOnce".to_owned()];
    let block = volume_capabilities(&rwo, true, "ext4", &["ro".to_owned()], false).unwrap();
    assert_eq!(
        block[0].access_type,
        Some(AccessType::Block(BlockVolume {}))
    );
    let mount = volume_capabilities(&rwo, false, "xfs", &["noatime".to_owned()], false).unwrap();
    assert_eq!(
        mount[0].access_type,
        Some(AccessType::Mount(MountVolume {
            fs_type: "xfs".to_owned(),
            mount_flags: vec!["noatime".to_owned()],
            volume_mount_group: String::new(),
        }))
    );
    assert!(is_block(&pvc("ns", "c").volume_mode_block().build()));
    assert!(!is_block(&pvc("ns", "c").volume_mode_filesystem().build()));
    assert!(!is_block(&pvc("ns", "c").build()));
}

#[test]
fn request_leaves_limit_and_secrets_empty_and_carries_the_rest() {
    let req = create_volume_request(RequestParts {
        name: "pvc-1".to_owned(),
        required_bytes: 1 << 30,
        content_source: Some(ContentSource::Snapshot {
            snapshot_id: "snap-1".to_owned(),
        }),
        mutable_parameters: Some([("iops".to_owned(), "300".to_owned())].into()),
        ..RequestParts::default()
    });
    assert_eq!(req.name, "pvc-1");
    assert_eq!(
        req.capacity_range,
        Some(CapacityRange {
            required_bytes: 1 << 30,
            limit_bytes: 0
        })
    );
    assert!(req.secrets.is_empty());
    assert_eq!(
        req.volume_content_source.unwrap().r#type,
        Some(Type::Snapshot(SnapshotSource {
            snapshot_id: "snap-1".to_owned()
        }))
    );
    assert_eq!(req.mutable_parameters["iops"], "300");
    assert_eq!(req.accessibility_requirements, None);
}
