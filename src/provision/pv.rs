//! The PersistentVolume for a created volume (reference §4.7): a template the plan builds before
//! CreateVolume, filled from the driver's answer ([`PvTemplate::fill`]) once the answer passes the
//! checks that must pass before a PV is written (§4.6): a missing volume, an empty id, too little
//! capacity or a missing content source are errors, and the volume is deleted again by the shell.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    CSIPersistentVolumeSource, ObjectReference, PersistentVolume, PersistentVolumeClaim,
    PersistentVolumeSpec, SecretReference,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::quantity::bytes_to_quantity;
use crate::csi::v1::{CreateVolumeResponse, Volume};
use crate::model::locate::{PerNodeKeys, Pin, pin_of};
use crate::model::secrets::{SecretRef, SecretRefs};
use crate::model::topology::volume_node_affinity;
use crate::names;

/// Everything about the PV that is known before CreateVolume (built by the plan).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct PvTemplate {
    /// PV name = volume name.
    pub(crate) name: String,
    /// `spec.csi.driver`.
    pub(crate) driver: String,
    /// `pv.kubernetes.io/provisioned-by`: the StorageClass provisioner.
    pub(crate) provisioned_by: String,
    /// Stored under `storage.kubernetes.io/csiProvisionerIdentity` in the volume attributes.
    pub(crate) provisioner_identity: String,
    /// `spec.claimRef`.
    pub(crate) claim_ref: ObjectReference,
    /// `spec.storageClassName`.
    pub(crate) class_name: String,
    /// `spec.accessModes` (the claim's).
    pub(crate) access_modes: Vec<String>,
    /// `spec.mountOptions` (the class's).
    pub(crate) mount_options: Option<Vec<String>>,
    /// `spec.persistentVolumeReclaimPolicy` (the class's; the API server defaults it to Delete).
    pub(crate) reclaim_policy: Option<String>,
    /// `spec.volumeMode` (the claim's, if set).
    pub(crate) volume_mode: Option<String>,
    /// Block volumes carry no fsType.
    pub(crate) block: bool,
    /// `spec.csi.fsType` for mount volumes (omitted when empty).
    pub(crate) fs_type: String,
    /// The resolved secret references of the class.
    pub(crate) secrets: SecretRefs,
    /// `spec.csi.readOnly`.
    pub(crate) read_only: bool,
    /// Whether to write `spec.nodeAffinity` from the driver's accessible topology.
    pub(crate) topology: bool,
    /// `spec.volumeAttributesClassName`.
    pub(crate) volume_attributes_class: Option<String>,
    /// Requested bytes (used when the driver reports capacity 0).
    pub(crate) required_bytes: i64,
    /// The claim has a data source, so the answer must report a content source.
    pub(crate) expects_content_source: bool,
    /// The node the volume lives on, as `(name, uid)` annotations: this instance's node in node
    /// mode, the selected node in controller mode (see `node_is_selection`).
    pub(crate) node: Option<(String, Option<String>)>,
    /// `node` is only where the claim asked to be (controller mode): recorded only when the
    /// driver's accessible topology pins the volume to it, since a driver may place a volume on
    /// another node the requisite allows (issue 28).
    pub(crate) node_is_selection: bool,
    /// CSI migration: the PV is written back in this in-tree plugin's form.
    pub(crate) in_tree: Option<crate::migration::Plugin>,
}

/// The PV of a volume the driver made: [`PvTemplate::fill`]'s answer.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct NewPv {
    /// The driver's volume id (PV `volumeHandle`; kept here because an in-tree PV has no CSI
    /// source to read it from).
    pub(crate) volume_id: String,
    /// The PV object to create.
    pub(crate) pv: PersistentVolume,
}

/// A CreateVolume answer that cannot become a PV. `Display` is upstream's text where upstream
/// has one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum AnswerError {
    /// `CreateVolumeResponse.volume` is missing (upstream panics).
    #[error(
        "CreateVolume for {name} succeeded without returning a volume, which violates the CSI spec: report this to the driver's maintainers"
    )]
    NoVolume {
        /// The volume name.
        name: String,
    },
    /// The volume id is empty, so the volume can be neither recorded nor deleted.
    #[error(
        "CreateVolume for {name} returned an empty volume_id, which violates the CSI spec: check the driver for a volume named {name} and report this to the driver's maintainers"
    )]
    EmptyVolumeId {
        /// The volume name.
        name: String,
    },
    /// The volume is smaller than requested.
    #[error("created volume capacity {capacity} less than requested capacity {requested}")]
    CapacityTooSmall {
        /// The id of the volume to delete again.
        volume_id: String,
        /// Reported bytes.
        capacity: i64,
        /// Requested bytes.
        requested: i64,
    },
    /// The claim has a data source but the driver did not say it used it.
    #[error("volume content source missing")]
    ContentSourceMissing {
        /// The id of the volume to delete again.
        volume_id: String,
    },
    /// CSI migration: the PV cannot be written back in in-tree form (upstream keeps retrying with
    /// the volume made; ours deletes it again).
    #[error("failed to translate the PV of volume {volume_id} to {in_tree}: {error}")]
    NotInTree {
        /// The id of the volume to delete again.
        volume_id: String,
        /// The in-tree plugin.
        in_tree: &'static str,
        /// The translation's error.
        error: String,
    },
    /// The answer cannot be stored in a PV safely (ours; upstream tries and fails or writes it).
    #[error(
        "CreateVolume for {name} returned {what}, which no PV can hold safely; the volume was deleted again: report this to the driver's maintainers"
    )]
    Unstorable {
        /// The volume name.
        name: String,
        /// The id of the volume to delete again.
        volume_id: String,
        /// What is wrong with the answer.
        what: String,
    },
}

/// Most bytes of volume context a PV takes: far below the API server's 1.5 MiB object limit, far
/// above what drivers send (a few hundred bytes).
pub(crate) const MAX_VOLUME_CONTEXT_BYTES: usize = 256 * 1024;

/// What makes an answer unstorable, if anything: control characters in the volume id (they would
/// forge log lines and break tools reading the handle), or a volume context over
/// [`MAX_VOLUME_CONTEXT_BYTES`].
fn unstorable(volume: &Volume) -> Option<String> {
    if volume.volume_id.chars().any(char::is_control) {
        return Some(format!(
            "a volume id with control characters ({:?})",
            volume.volume_id
        ));
    }
    let context: usize = volume
        .volume_context
        .iter()
        .map(|(k, v)| k.len() + v.len())
        .sum();
    (context > MAX_VOLUME_CONTEXT_BYTES).then(|| {
        format!(
            "a volume context of {context} bytes (at most {MAX_VOLUME_CONTEXT_BYTES} are accepted)"
        )
    })
}

impl AnswerError {
    /// The volume the shell must delete before reporting the error (upstream's cleanup).
    pub(crate) fn volume_to_delete(&self) -> Option<&str> {
        match self {
            AnswerError::CapacityTooSmall { volume_id, .. }
            | AnswerError::ContentSourceMissing { volume_id }
            | AnswerError::NotInTree { volume_id, .. }
            | AnswerError::Unstorable { volume_id, .. } => Some(volume_id),
            AnswerError::NoVolume { .. } | AnswerError::EmptyVolumeId { .. } => None,
        }
    }

    /// Upstream's message when deleting the volume again failed as well.
    pub(crate) fn with_failed_cleanup(&self, pv_name: &str, cleanup_error: &str) -> String {
        // Upstream capitalises only the capacity case.
        let cleanup = match self {
            AnswerError::ContentSourceMissing { .. } => "cleanup",
            _ => "Cleanup",
        };
        format!("{self}. {cleanup} of volume {pv_name} failed, volume is orphaned: {cleanup_error}")
    }
}

impl PvTemplate {
    /// The template filled from the driver's answer: the PV to create (the CSI PV, written back
    /// in in-tree form for a migrated class), or why the answer cannot become one. The answer is
    /// checked against the request first.
    pub(crate) fn fill(&self, response: &CreateVolumeResponse) -> Result<NewPv, AnswerError> {
        let name = self.name.clone();
        let volume = response
            .volume
            .as_ref()
            .ok_or(AnswerError::NoVolume { name: name.clone() })?;
        if volume.volume_id.is_empty() {
            return Err(AnswerError::EmptyVolumeId { name });
        }
        if let Some(what) = unstorable(volume) {
            return Err(AnswerError::Unstorable {
                name,
                volume_id: volume.volume_id.clone(),
                what,
            });
        }
        let capacity_bytes = match volume.capacity_bytes {
            // CSI: 0 means unknown; the API server needs a size, so record the request.
            0 => self.required_bytes,
            c if c < self.required_bytes => {
                return Err(AnswerError::CapacityTooSmall {
                    volume_id: volume.volume_id.clone(),
                    capacity: c,
                    requested: self.required_bytes,
                });
            }
            c => c,
        };
        if self.expects_content_source && volume.content_source.is_none() {
            return Err(AnswerError::ContentSourceMissing {
                volume_id: volume.volume_id.clone(),
            });
        }
        let pv = self.csi_pv(volume, capacity_bytes);
        let pv = match self.in_tree {
            None => pv,
            Some(plugin) => plugin
                .csi_to_in_tree(&pv)
                .map_err(|error| AnswerError::NotInTree {
                    volume_id: volume.volume_id.clone(),
                    in_tree: plugin.in_tree_name(),
                    error,
                })?,
        };
        Ok(NewPv {
            volume_id: volume.volume_id.clone(),
            pv,
        })
    }
}

/// The claimRef upstream writes: kind, apiVersion, namespace, name, uid and resourceVersion.
pub(crate) fn claim_ref(claim: &PersistentVolumeClaim) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".to_owned()),
        kind: Some("PersistentVolumeClaim".to_owned()),
        namespace: claim.metadata.namespace.clone(),
        name: claim.metadata.name.clone(),
        uid: claim.metadata.uid.clone(),
        resource_version: claim.metadata.resource_version.clone(),
        ..ObjectReference::default()
    }
}

fn secret_ref(r: &Option<SecretRef>) -> Option<SecretReference> {
    r.as_ref().map(SecretReference::from)
}

impl PvTemplate {
    /// The CSI PV for the checked answer `volume`, recording `capacity_bytes`.
    fn csi_pv(&self, volume: &Volume, capacity_bytes: i64) -> PersistentVolume {
        let t = self;
        let mut annotations = BTreeMap::new();
        annotations.insert(
            names::ANN_PROVISIONED_BY.to_owned(),
            t.provisioned_by.clone(),
        );
        // Always present (possibly empty): their presence tells the deleter not to consult the
        // class.
        let deletion = t.secrets.provisioner.clone().unwrap_or(SecretRef {
            name: String::new(),
            namespace: String::new(),
        });
        annotations.insert(names::ANN_DELETION_SECRET_NAME.to_owned(), deletion.name);
        annotations.insert(
            names::ANN_DELETION_SECRET_NAMESPACE.to_owned(),
            deletion.namespace,
        );
        if let Some(modify) = &t.secrets.controller_modify {
            annotations.insert(
                names::ANN_MODIFY_SECRET_NAME.to_owned(),
                modify.name.clone(),
            );
            annotations.insert(
                names::ANN_MODIFY_SECRET_NAMESPACE.to_owned(),
                modify.namespace.clone(),
            );
        }
        let node_affinity = if t.topology {
            volume_node_affinity(&volume.accessible_topology)
        } else {
            None
        };
        let recorded = t.node.as_ref().filter(|(node, _)| {
            !t.node_is_selection
                || matches!(
                    pin_of(node_affinity.as_ref(), &PerNodeKeys::default(), Some(node)),
                    Pin::Node(query) if query.names(node)
                )
        });
        if let Some((node, uid)) = recorded {
            annotations.insert(names::ANN_NODE_NAME.to_owned(), node.clone());
            if let Some(uid) = uid {
                annotations.insert(names::ANN_NODE_UID.to_owned(), uid.clone());
            }
        }

        let mut attributes = BTreeMap::new();
        attributes.insert(
            names::VOLUME_ATTR_PROVISIONER_IDENTITY.to_owned(),
            t.provisioner_identity.clone(),
        );
        attributes.extend(volume.volume_context.clone());

        let mut capacity = BTreeMap::new();
        capacity.insert(
            "storage".to_owned(),
            Quantity(bytes_to_quantity(capacity_bytes)),
        );

        PersistentVolume {
            metadata: ObjectMeta {
                name: Some(t.name.clone()),
                annotations: Some(annotations),
                finalizers: Some(vec![names::FINALIZER_PV_DELETION_PROTECTION.to_owned()]),
                ..ObjectMeta::default()
            },
            spec: Some(PersistentVolumeSpec {
                access_modes: Some(t.access_modes.clone()),
                mount_options: t.mount_options.clone(),
                capacity: Some(capacity),
                csi: Some(CSIPersistentVolumeSource {
                    driver: t.driver.clone(),
                    volume_handle: volume.volume_id.clone(),
                    volume_attributes: Some(attributes),
                    read_only: t.read_only.then_some(true),
                    fs_type: (!t.block && !t.fs_type.is_empty()).then(|| t.fs_type.clone()),
                    controller_publish_secret_ref: secret_ref(&t.secrets.controller_publish),
                    node_stage_secret_ref: secret_ref(&t.secrets.node_stage),
                    node_publish_secret_ref: secret_ref(&t.secrets.node_publish),
                    controller_expand_secret_ref: secret_ref(&t.secrets.controller_expand),
                    node_expand_secret_ref: secret_ref(&t.secrets.node_expand),
                }),
                persistent_volume_reclaim_policy: t.reclaim_policy.clone(),
                node_affinity,
                volume_mode: t.volume_mode.clone(),
                claim_ref: Some(t.claim_ref.clone()),
                storage_class_name: Some(t.class_name.clone()),
                volume_attributes_class_name: t.volume_attributes_class.clone(),
                ..PersistentVolumeSpec::default()
            }),
            status: None,
        }
    }
}

/// Whether the PV found under a volume's name (an AlreadyExists answer) holds the volume of
/// `handle`: then the create is a success for that volume; otherwise the name holds another volume.
/// Unknown (`None`) on either side is never the same volume.
pub(crate) fn pv_holds_volume(existing: Option<&PersistentVolume>, handle: Option<&str>) -> bool {
    let held = existing
        .and_then(|p| p.spec.as_ref()?.csi.as_ref())
        .map(|c| c.volume_handle.as_str());
    held.is_some() && held == handle
}

#[cfg(test)]
#[path = "pv_tests.rs"]
mod tests;
