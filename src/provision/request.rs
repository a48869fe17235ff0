//! The CreateVolume request of a claim (reference §4.3-4.4): the deterministic volume name, the
//! capacity from the claim's request, one volume capability per access mode, the stripped
//! StorageClass parameters, the content source and the VolumeAttributesClass parameters. The
//! provisioner secret's data is filled in by the shell after fetching the secret.
//!
//! The parameters too (reference §3.4): the reserved `csi.storage.k8s.io/` keys stripped before
//! they reach the driver, fsType resolution, the `--extra-create-metadata` keys, and the
//! deprecation warnings upstream logs for the old unprefixed keys.

use std::collections::{BTreeMap, HashMap};

use k8s_openapi::api::core::v1::PersistentVolumeClaim;

use super::quantity::{QuantityError, parse_quantity};
use crate::csi::v1::volume_capability::access_mode::Mode;
use crate::csi::v1::volume_capability::{AccessMode, AccessType, BlockVolume, MountVolume};
use crate::csi::v1::volume_content_source::{SnapshotSource, Type, VolumeSource};
use crate::csi::v1::{
    CapacityRange, CreateVolumeRequest, TopologyRequirement, VolumeCapability, VolumeContentSource,
};
use crate::gofmt;
use crate::model::secrets::SecretKind;
use crate::names;

/// Why a claim's request cannot be built. `Display` is upstream's text where upstream has one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum RequestError {
    /// `--volume-name-prefix` is empty.
    #[error("volume name prefix cannot be of length 0")]
    EmptyPrefix,
    /// The claim has no UID.
    #[error("corrupted PVC object, it is missing UID")]
    MissingUid,
    /// `spec.resources.requests.storage` is not a valid size.
    #[error(
        "invalid size {value:?} in spec.resources.requests.storage of the claim: {source}; use a quantity such as 10Gi"
    )]
    InvalidSize {
        /// The value as written.
        value: String,
        /// What is wrong with it.
        source: QuantityError,
    },
    /// An access mode CSI cannot express.
    #[error("unsupported AccessMode combination: [{0}]")]
    UnsupportedAccessMode(String),
    /// The claim lists no access mode.
    #[error(
        "the claim has no spec.accessModes: set at least one of ReadWriteOnce, ReadOnlyMany, ReadWriteMany, ReadWriteOncePod"
    )]
    NoAccessModes,
}

/// The PV and volume name: `<prefix>-<uid>`, or with `uuid_length` (`--volume-name-uuid-length`)
/// the UID without dashes cut to that many characters. Deterministic, so a retry after a crash
/// asks the driver for the same volume. A length beyond the 32 characters of a UID keeps the whole
/// UID (upstream panics).
pub(crate) fn make_volume_name(
    prefix: &str,
    uid: &str,
    uuid_length: Option<usize>,
) -> Result<String, RequestError> {
    if prefix.is_empty() {
        return Err(RequestError::EmptyPrefix);
    }
    if uid.is_empty() {
        return Err(RequestError::MissingUid);
    }
    Ok(match uuid_length {
        None => format!("{prefix}-{uid}"),
        Some(len) => {
            let stripped: String = uid.chars().filter(|c| *c != '-').collect();
            let cut: String = stripped.chars().take(len).collect();
            format!("{prefix}-{cut}")
        }
    })
}

/// Bytes requested by the claim (`spec.resources.requests.storage`, rounded up); 0 when unset,
/// as upstream.
pub(crate) fn requested_bytes(claim: &PersistentVolumeClaim) -> Result<i64, RequestError> {
    let Some(value) = claim
        .spec
        .as_ref()
        .and_then(|s| s.resources.as_ref())
        .and_then(|r| r.requests.as_ref())
        .and_then(|r| r.get("storage"))
    else {
        return Ok(0);
    };
    parse_quantity(&value.0).map_err(|source| RequestError::InvalidSize {
        value: value.0.clone(),
        source,
    })
}

/// Whether the claim asks for a raw block device (`spec.volumeMode: Block`).
pub(crate) fn is_block(claim: &PersistentVolumeClaim) -> bool {
    claim.spec.as_ref().and_then(|s| s.volume_mode.as_deref()) == Some("Block")
}

/// The CSI access mode of one Kubernetes access mode. With the driver's
/// `SINGLE_NODE_MULTI_WRITER` capability, RWO and RWOP map to the finer-grained modes.
pub(crate) fn csi_access_mode(
    mode: &str,
    single_node_multi_writer: bool,
) -> Result<Mode, RequestError> {
    Ok(match (mode, single_node_multi_writer) {
        ("ReadWriteOnce", false) => Mode::SingleNodeWriter,
        ("ReadWriteOnce", true) => Mode::SingleNodeMultiWriter,
        ("ReadWriteOncePod", false) => Mode::SingleNodeWriter,
        ("ReadWriteOncePod", true) => Mode::SingleNodeSingleWriter,
        ("ReadOnlyMany", _) => Mode::MultiNodeReaderOnly,
        ("ReadWriteMany", _) => Mode::MultiNodeMultiWriter,
        (other, _) => return Err(RequestError::UnsupportedAccessMode(other.to_owned())),
    })
}

/// One capability per access mode: `block{}` for block claims, otherwise
/// `mount{fs_type, mount_flags}` with the StorageClass mount options.
pub(crate) fn volume_capabilities(
    access_modes: &[String],
    block: bool,
    fs_type: &str,
    mount_flags: &[String],
    single_node_multi_writer: bool,
) -> Result<Vec<VolumeCapability>, RequestError> {
    if access_modes.is_empty() {
        return Err(RequestError::NoAccessModes);
    }
    access_modes
        .iter()
        .map(|mode| {
            let access_type = if block {
                AccessType::Block(BlockVolume {})
            } else {
                AccessType::Mount(MountVolume {
                    fs_type: fs_type.to_owned(),
                    mount_flags: mount_flags.to_vec(),
                    volume_mount_group: String::new(),
                })
            };
            Ok(VolumeCapability {
                access_type: Some(access_type),
                access_mode: Some(AccessMode {
                    mode: csi_access_mode(mode, single_node_multi_writer)? as i32,
                }),
            })
        })
        .collect()
}

/// Where a new volume's content comes from, once the shell has resolved the claim's data source
/// (snapshot and clone sources are validated elsewhere; this is only the wire form).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ContentSource {
    /// Restore from `VolumeSnapshotContent.status.snapshotHandle`.
    Snapshot {
        /// The snapshot handle.
        snapshot_id: String,
    },
    /// Clone of the source claim's PV (`spec.csi.volumeHandle`).
    Volume {
        /// The source volume handle.
        volume_id: String,
    },
}

impl ContentSource {
    /// The CSI message.
    pub(crate) fn to_csi(&self) -> VolumeContentSource {
        VolumeContentSource {
            r#type: Some(match self {
                ContentSource::Snapshot { snapshot_id } => Type::Snapshot(SnapshotSource {
                    snapshot_id: snapshot_id.clone(),
                }),
                ContentSource::Volume { volume_id } => Type::Volume(VolumeSource {
                    volume_id: volume_id.clone(),
                }),
            }),
        }
    }
}

/// Everything a CreateVolume request is made of, already resolved.
#[derive(Debug, Clone, Default)]
pub(crate) struct RequestParts {
    /// The volume name.
    pub(crate) name: String,
    /// Requested bytes (`capacity_range.required_bytes`; `limit_bytes` stays unset).
    pub(crate) required_bytes: i64,
    /// One per access mode.
    pub(crate) capabilities: Vec<VolumeCapability>,
    /// StorageClass parameters without reserved keys, plus extra metadata.
    pub(crate) parameters: HashMap<String, String>,
    /// The data source, if any.
    pub(crate) content_source: Option<ContentSource>,
    /// Only when the driver supports topology.
    pub(crate) accessibility: Option<TopologyRequirement>,
    /// VolumeAttributesClass parameters (gate on and a class named by the claim).
    pub(crate) mutable_parameters: Option<BTreeMap<String, String>>,
}

/// The request, without secrets (the shell adds the provisioner secret's data).
pub(crate) fn create_volume_request(parts: RequestParts) -> CreateVolumeRequest {
    CreateVolumeRequest {
        name: parts.name,
        capacity_range: Some(CapacityRange {
            required_bytes: parts.required_bytes,
            limit_bytes: 0,
        }),
        volume_capabilities: parts.capabilities,
        parameters: parts.parameters,
        secrets: HashMap::new(),
        volume_content_source: parts.content_source.as_ref().map(ContentSource::to_csi),
        accessibility_requirements: parts.accessibility,
        mutable_parameters: parts
            .mutable_parameters
            .map(|p| p.into_iter().collect())
            .unwrap_or_default(),
    }
}

// === StorageClass parameters ===

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
#[path = "request_tests.rs"]
mod tests;
