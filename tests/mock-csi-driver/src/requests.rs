//! What a CreateVolume request asked for, as recorded with `--record-requests`: the differential
//! suite compares the requests two provisioners send for the same claim, not only the volumes
//! that result. Secret values are never kept, only their keys.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::csi::v1::volume_capability::{AccessType, access_mode};
use crate::csi::v1::{CreateVolumeRequest, Topology, VolumeCapability, volume_content_source};
use crate::rules;
use crate::store::ContentSource;

/// One volume capability: access mode and type, with the mount's fsType and flags.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct RecordedCapability {
    /// `SINGLE_NODE_WRITER`, `MULTI_NODE_MULTI_WRITER`, ... (`UNKNOWN` when unset).
    pub access_mode: String,
    /// `mount`, `block` or `none`.
    pub access_type: String,
    /// Mount only: the fsType asked for (empty when none).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub fs_type: String,
    /// Mount only: the mount flags, in request order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mount_flags: Vec<String>,
    /// Mount only: the volume mount group.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub volume_mount_group: String,
}

/// One CreateVolume request as received.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct RecordedCreate {
    /// The volume name (the idempotency key).
    pub name: String,
    /// `capacity_range.required_bytes` (0 when unset).
    pub required_bytes: i64,
    /// `capacity_range.limit_bytes` (0 when unset).
    pub limit_bytes: i64,
    /// Capabilities in request order.
    pub capabilities: Vec<RecordedCapability>,
    /// Parameters.
    pub parameters: BTreeMap<String, String>,
    /// Mutable parameters.
    pub mutable_parameters: BTreeMap<String, String>,
    /// Keys of the secrets sent, sorted.
    pub secret_keys: Vec<String>,
    /// Requisite topology segments, in request order.
    pub requisite: Vec<BTreeMap<String, String>>,
    /// Preferred topology segments, in request order.
    pub preferred: Vec<BTreeMap<String, String>>,
    /// The content source asked for.
    pub content_source: Option<ContentSource>,
}

impl RecordedCreate {
    /// The record of `req`.
    pub fn of(req: &CreateVolumeRequest) -> Self {
        let range = req.capacity_range.as_ref();
        let segments = |t: &[Topology]| -> Vec<BTreeMap<String, String>> {
            t.iter().map(|s| rules::sorted(&s.segments)).collect()
        };
        let topology = req.accessibility_requirements.as_ref();
        RecordedCreate {
            name: req.name.clone(),
            required_bytes: range.map_or(0, |r| r.required_bytes),
            limit_bytes: range.map_or(0, |r| r.limit_bytes),
            capabilities: req.volume_capabilities.iter().map(capability).collect(),
            parameters: rules::sorted(&req.parameters),
            mutable_parameters: rules::sorted(&req.mutable_parameters),
            secret_keys: rules::secret_keys(&req.secrets),
            requisite: topology.map_or_else(Vec::new, |t| segments(&t.requisite)),
            preferred: topology.map_or_else(Vec::new, |t| segments(&t.preferred)),
            content_source: req
                .volume_content_source
                .as_ref()
                .and_then(|s| s.r#type.as_ref())
                .map(|t| match t {
                    volume_content_source::Type::Snapshot(s) => {
                        ContentSource::Snapshot(s.snapshot_id.clone())
                    }
                    volume_content_source::Type::Volume(v) => {
                        ContentSource::Volume(v.volume_id.clone())
                    }
                }),
        }
    }
}

fn capability(c: &VolumeCapability) -> RecordedCapability {
    let access_mode = c
        .access_mode
        .as_ref()
        .and_then(|m| access_mode::Mode::try_from(m.mode).ok())
        .map_or("UNKNOWN", |m| m.as_str_name())
        .to_owned();
    let mut out = RecordedCapability {
        access_mode,
        access_type: "none".into(),
        fs_type: String::new(),
        mount_flags: Vec::new(),
        volume_mount_group: String::new(),
    };
    match &c.access_type {
        Some(AccessType::Mount(m)) => {
            out.access_type = "mount".into();
            out.fs_type = m.fs_type.clone();
            out.mount_flags = m.mount_flags.clone();
            out.volume_mount_group = m.volume_mount_group.clone();
        }
        Some(AccessType::Block(_)) => out.access_type = "block".into(),
        None => {}
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::csi::v1::volume_capability::{AccessMode, MountVolume};
    use crate::csi::v1::{CapacityRange, TopologyRequirement};
    use std::collections::HashMap;

    #[test]
    fn a_request_is_recorded_with_keys_of_secrets_only() {
        let req = CreateVolumeRequest {
            name: "pvc-1".into(),
            capacity_range: Some(CapacityRange {
                required_bytes: 5,
                limit_bytes: 0,
            }),
            volume_capabilities: vec![VolumeCapability {
                access_mode: Some(AccessMode {
                    mode: access_mode::Mode::SingleNodeWriter as i32,
                }),
                access_type: Some(AccessType::Mount(MountVolume {
                    fs_type: "ext4".into(),
                    mount_flags: vec!["ro".into()],
                    ..Default::default()
                })),
            }],
            secrets: HashMap::from([("password".to_string(), "s3cret".to_string())]),
            accessibility_requirements: Some(TopologyRequirement {
                requisite: vec![Topology {
                    segments: HashMap::from([("k".to_string(), "a".to_string())]),
                }],
                preferred: vec![],
            }),
            ..Default::default()
        };
        let r = RecordedCreate::of(&req);
        assert_eq!(r.required_bytes, 5);
        assert_eq!(r.capabilities[0].access_mode, "SINGLE_NODE_WRITER");
        assert_eq!(r.capabilities[0].fs_type, "ext4");
        assert_eq!(r.secret_keys, vec!["password".to_string()]);
        assert_eq!(r.requisite[0]["k"], "a");
        assert!(!serde_json::to_string(&r).unwrap().contains("s3cret"));
    }
}
