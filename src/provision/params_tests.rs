use super::*;
use crate::names::*;

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
