//! The CreateVolume request of a claim (reference §4.3-4.4): the deterministic volume name, the
//! capacity from the claim's request, one volume capability per access mode, the stripped
//! StorageClass parameters, the content source and the VolumeAttributesClass parameters. The
//! provisioner secret's data is filled in by the shell after fetching the secret.

use std::collections::{BTreeMap, HashMap};

use k8s_openapi::api::core::v1::PersistentVolumeClaim;

use super::quantity::{QuantityError, parse_quantity};
use crate::csi::v1::volume_capability::access_mode::Mode;
use crate::csi::v1::volume_capability::{AccessMode, AccessType, BlockVolume, MountVolume};
use crate::csi::v1::volume_content_source::{SnapshotSource, Type, VolumeSource};
use crate::csi::v1::{
    CapacityRange, CreateVolumeRequest, TopologyRequirement, VolumeCapability, VolumeContentSource,
};

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

#[cfg(test)]
#[path = "request_tests.rs"]
mod tests;
