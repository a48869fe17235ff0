//! StorageClass parameters: stripping the reserved `csi.storage.k8s.io/` keys before they reach
//! the driver, fsType resolution, the `--extra-create-metadata` keys, and the deprecation warnings
//! upstream logs for the old unprefixed keys (reference §3.4).

use std::collections::{BTreeMap, HashMap};

use crate::gofmt;
use crate::model::secrets::SecretKind;
use crate::names;

/// Why the parameters of a StorageClass cannot be used. `Display` is upstream's text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum ParamError {
    /// A `csi.storage.k8s.io/` key this sidecar does not know (typo or a newer sidecar's key).
    #[error(
        "failed to strip CSI Parameters of prefixed keys: found unknown parameter key {} with reserved namespace csi.storage.k8s.io/",
        gofmt::quote(.0)
    )]
    UnknownPrefixedKey(String),
    /// Both the deprecated `fstype` (any case) and `csi.storage.k8s.io/fstype` are set.
    #[error(
        "fstype specified in parameters with both \"fstype\" and \"csi.storage.k8s.io/fstype\" keys"
    )]
    ConflictingFsType,
}

/// Whether `key` is one of the reserved keys the sidecar consumes itself.
pub(crate) fn is_known_prefixed_key(key: &str) -> bool {
    key == names::PARAM_FSTYPE
        || key == names::PARAM_SECRET_NAME
        || key == names::PARAM_SECRET_NAMESPACE
        || SecretKind::ALL.iter().any(|kind| {
            let (name, namespace) = kind.keys_in_params();
            key == name || key == namespace
        })
}

/// The parameters passed to CreateVolume: every key except the known reserved ones. Deprecated
/// unprefixed keys (`fstype`, `csiProvisionerSecretName`, ...) are passed on, as upstream does.
pub(crate) fn strip_prefixed_parameters(
    params: &BTreeMap<String, String>,
) -> Result<HashMap<String, String>, ParamError> {
    let mut out = HashMap::with_capacity(params.len());
    for (key, value) in params {
        if key.starts_with(names::PARAM_PREFIX) {
            if !is_known_prefixed_key(key) {
                return Err(ParamError::UnknownPrefixedKey(key.clone()));
            }
        } else {
            out.insert(key.clone(), value.clone());
        }
    }
    Ok(out)
}

/// The filesystem type for mount volumes: `csi.storage.k8s.io/fstype`, else the deprecated
/// `fstype` (matched case-insensitively), else `default_fs_type` (`--default-fstype`); `""` means
/// "let the driver choose".
pub(crate) fn resolve_fs_type(
    params: &BTreeMap<String, String>,
    default_fs_type: &str,
) -> Result<String, ParamError> {
    let mut found = params
        .iter()
        .filter(|(k, _)| *k == names::PARAM_FSTYPE || k.eq_ignore_ascii_case("fstype"));
    let fs_type = match (found.next(), found.next()) {
        (Some(_), Some(_)) => return Err(ParamError::ConflictingFsType),
        (Some((_, v)), None) => v.clone(),
        (None, _) => String::new(),
    };
    Ok(if fs_type.is_empty() {
        default_fs_type.to_owned()
    } else {
        fs_type
    })
}

/// Adds the `--extra-create-metadata` keys (claim name and namespace, PV name).
pub(crate) fn add_extra_create_metadata(
    params: &mut HashMap<String, String>,
    claim_name: &str,
    claim_namespace: &str,
    pv_name: &str,
) {
    params.insert(names::PARAM_PVC_NAME.to_owned(), claim_name.to_owned());
    params.insert(
        names::PARAM_PVC_NAMESPACE.to_owned(),
        claim_namespace.to_owned(),
    );
    params.insert(names::PARAM_PV_NAME.to_owned(), pv_name.to_owned());
}

/// Upstream's deprecation warnings for the deprecated keys present in `params`, for the shell to
/// log (at most once per StorageClass, to keep logs readable).
pub(crate) fn deprecation_warnings(params: &BTreeMap<String, String>) -> Vec<String> {
    let mut warnings = Vec::new();
    for key in params.keys() {
        if key.eq_ignore_ascii_case("fstype") {
            // Upstream names the lowercase key whatever case was used.
            warnings.push(deprecation_warning("fstype", names::PARAM_FSTYPE));
        }
    }
    for kind in SecretKind::ALL {
        let Some((old_name, old_namespace)) = kind.deprecated_keys_in_params() else {
            continue;
        };
        let (new_name, new_namespace) = kind.keys_in_params();
        for (old, new) in [(old_name, new_name), (old_namespace, new_namespace)] {
            if params.contains_key(old) {
                warnings.push(deprecation_warning(old, new));
            }
        }
    }
    warnings
}

fn deprecation_warning(old: &str, new: &str) -> String {
    format!(
        "\"{old}\" is deprecated and will be removed in a future release, please use \"{new}\" instead"
    )
}

#[cfg(test)]
mod tests {
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
        let err =
            strip_prefixed_parameters(&params(&[("csi.storage.k8s.io/bim", "baz")])).unwrap_err();
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
        let err =
            resolve_fs_type(&params(&[("fstype", "a"), (PARAM_FSTYPE, "b")]), "").unwrap_err();
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
}
