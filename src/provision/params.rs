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
#[path = "params_tests.rs"]
mod tests;
