use super::*;
use crate::names::*;
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

fn params(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

fn sorted(map: HashMap<String, String>) -> Vec<(String, String)> {
    let mut v: Vec<_> = map.into_iter().collect();
    v.sort();
    v
}

/// Upstream `TestStripPrefixedCSIParams`.
#[test]
fn prefixed_parameters_are_stripped_as_upstream() {
    let all_known: Vec<(&str, &str)> = [
        PARAM_FSTYPE,
        PARAM_SECRET_NAME,
        PARAM_SECRET_NAMESPACE,
        PARAM_PROVISIONER_SECRET_NAME,
        PARAM_PROVISIONER_SECRET_NAMESPACE,
        PARAM_CONTROLLER_PUBLISH_SECRET_NAME,
        PARAM_CONTROLLER_PUBLISH_SECRET_NAMESPACE,
        PARAM_NODE_STAGE_SECRET_NAME,
        PARAM_NODE_STAGE_SECRET_NAMESPACE,
        PARAM_NODE_PUBLISH_SECRET_NAME,
        PARAM_NODE_PUBLISH_SECRET_NAMESPACE,
        PARAM_CONTROLLER_EXPAND_SECRET_NAME,
        PARAM_CONTROLLER_EXPAND_SECRET_NAMESPACE,
        PARAM_NODE_EXPAND_SECRET_NAME,
        PARAM_NODE_EXPAND_SECRET_NAMESPACE,
        PARAM_CONTROLLER_MODIFY_SECRET_NAME,
        PARAM_CONTROLLER_MODIFY_SECRET_NAMESPACE,
    ]
    .into_iter()
    .map(|k| (k, "csiBar"))
    .collect();
    let deprecated: Vec<(&str, &str)> = [
        "fstype",
        PARAM_DEPRECATED_PROVISIONER_SECRET_NAME,
        PARAM_DEPRECATED_PROVISIONER_SECRET_NAMESPACE,
        PARAM_DEPRECATED_CONTROLLER_PUBLISH_SECRET_NAME,
        PARAM_DEPRECATED_CONTROLLER_PUBLISH_SECRET_NAMESPACE,
        PARAM_DEPRECATED_NODE_STAGE_SECRET_NAME,
        PARAM_DEPRECATED_NODE_STAGE_SECRET_NAMESPACE,
        PARAM_DEPRECATED_NODE_PUBLISH_SECRET_NAME,
        PARAM_DEPRECATED_NODE_PUBLISH_SECRET_NAMESPACE,
    ]
    .into_iter()
    .map(|k| (k, "csiBar"))
    .collect();
    let owned = |v: &[(&str, &str)]| -> Vec<(String, String)> {
        let mut v: Vec<_> = v
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        v.sort();
        v
    };

    // "no prefix"
    let p = params(&[("csiFoo", "csiBar")]);
    assert_eq!(
        sorted(strip_prefixed_parameters(&p).unwrap()),
        owned(&[("csiFoo", "csiBar")])
    );
    // "one prefixed"
    let p = params(&[
        (PARAM_CONTROLLER_PUBLISH_SECRET_NAME, "csiBar"),
        ("csiFoo", "x"),
    ]);
    assert_eq!(
        sorted(strip_prefixed_parameters(&p).unwrap()),
        owned(&[("csiFoo", "x")])
    );
    // "prefix in value"
    let p = params(&[("foo", PARAM_FSTYPE)]);
    assert_eq!(
        sorted(strip_prefixed_parameters(&p).unwrap()),
        owned(&[("foo", PARAM_FSTYPE)])
    );
    // "all known prefixed"
    assert!(
        strip_prefixed_parameters(&params(&all_known))
            .unwrap()
            .is_empty()
    );
    // "all known deprecated params not stripped"
    assert_eq!(
        sorted(strip_prefixed_parameters(&params(&deprecated)).unwrap()),
        owned(&deprecated)
    );
    // "unknown prefixed var"
    let err = strip_prefixed_parameters(&params(&[("csi.storage.k8s.io/bim", "baz")])).unwrap_err();
    assert_eq!(
        err.to_string(),
        "failed to strip CSI Parameters of prefixed keys: found unknown parameter key \"csi.storage.k8s.io/bim\" with reserved namespace csi.storage.k8s.io/"
    );
    // "empty"
    assert!(
        strip_prefixed_parameters(&BTreeMap::new())
            .unwrap()
            .is_empty()
    );
}

/// Upstream `TestFSTypeProvision` and the "multiple fsType provision" case.
#[test]
fn fs_type_comes_from_the_class_then_the_default() {
    assert_eq!(resolve_fs_type(&params(&[]), "ext4").unwrap(), "ext4");
    assert_eq!(
        resolve_fs_type(&params(&[(PARAM_FSTYPE, "xfs")]), "ext4").unwrap(),
        "xfs"
    );
    assert_eq!(resolve_fs_type(&params(&[]), "").unwrap(), "");
    assert_eq!(
        resolve_fs_type(&params(&[(PARAM_FSTYPE, "xfs")]), "").unwrap(),
        "xfs"
    );
    assert_eq!(
        resolve_fs_type(&params(&[("fsType", "btrfs")]), "ext4").unwrap(),
        "btrfs"
    );
    assert_eq!(
        resolve_fs_type(&params(&[(PARAM_FSTYPE, "")]), "ext4").unwrap(),
        "ext4"
    );
    let err = resolve_fs_type(&params(&[("fstype", "a"), (PARAM_FSTYPE, "b")]), "").unwrap_err();
    assert_eq!(
        err.to_string(),
        "fstype specified in parameters with both \"fstype\" and \"csi.storage.k8s.io/fstype\" keys"
    );
    assert_eq!(
        resolve_fs_type(&params(&[("FSTYPE", "a"), ("fstype", "b")]), ""),
        Err(ParamError::ConflictingFsType)
    );
}

#[test]
fn extra_metadata_adds_the_three_keys() {
    let mut p = HashMap::new();
    add_extra_create_metadata(&mut p, "data", "apps", "pvc-1");
    assert_eq!(
        sorted(p),
        vec![
            (PARAM_PV_NAME.to_owned(), "pvc-1".to_owned()),
            (PARAM_PVC_NAME.to_owned(), "data".to_owned()),
            (PARAM_PVC_NAMESPACE.to_owned(), "apps".to_owned()),
        ]
    );
}

#[test]
fn deprecated_keys_produce_upstreams_warning() {
    let w = deprecation_warnings(&params(&[
        ("fsType", "ext4"),
        (PARAM_DEPRECATED_PROVISIONER_SECRET_NAME, "s"),
    ]));
    assert_eq!(
        w,
        vec![
            "\"fstype\" is deprecated and will be removed in a future release, please use \"csi.storage.k8s.io/fstype\" instead",
            "\"csiProvisionerSecretName\" is deprecated and will be removed in a future release, please use \"csi.storage.k8s.io/provisioner-secret-name\" instead",
        ]
    );
    assert!(deprecation_warnings(&params(&[(PARAM_FSTYPE, "x")])).is_empty());
}
