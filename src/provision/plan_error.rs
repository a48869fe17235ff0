//! Why a claim cannot be provisioned as it is ([`PlanError`]): the `ProvisioningFailed` event
//! messages, upstream's text wherever upstream has one, and what upstream's state would be.

use super::params::ParamError;
use super::request::RequestError;
use super::topology::TopologyError;
use crate::gofmt;
use crate::model::secrets::SecretError;

/// A driver capability a claim needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Capability {
    /// Plugin CONTROLLER_SERVICE.
    ControllerService,
    /// CREATE_DELETE_VOLUME.
    CreateDeleteVolume,
    /// CREATE_DELETE_SNAPSHOT (restore from a snapshot).
    CreateDeleteSnapshot,
    /// CLONE_VOLUME.
    CloneVolume,
    /// MODIFY_VOLUME (a VolumeAttributesClass).
    ModifyVolume,
}

/// Bad input. `Display` is the `ProvisioningFailed` event message (upstream's text where it has one).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum PlanError {
    /// No class named.
    #[error(
        "the claim names no StorageClass: set spec.storageClassName to a class provisioned by {driver}"
    )]
    NoClassName {
        /// Our driver.
        driver: String,
    },
    /// The class does not exist.
    #[error(
        "storageclass.storage.k8s.io {} not found: create the StorageClass or correct spec.storageClassName of the claim",
        gofmt::quote(.0)
    )]
    ClassNotFound(String),
    /// The class belongs to another provisioner.
    #[error(
        "StorageClass {class:?} is provisioned by {provisioner:?}, not by {driver:?}: the claim's storage-provisioner annotation and its class disagree; correct spec.storageClassName"
    )]
    ClassOfOtherDriver {
        /// Class name.
        class: String,
        /// The class's provisioner.
        provisioner: String,
        /// Our driver.
        driver: String,
    },
    /// The driver lacks a capability.
    #[error("{}", capability_message(*.0))]
    MissingCapability(Capability),
    /// `spec.selector` is set.
    #[error("claim Selector is not supported")]
    Selector,
    /// `spec.dataSource(Ref)` has an empty name.
    #[error("the PVC source not found for PVC {0}")]
    EmptySourceName(String),
    /// A VolumeSnapshot source of another API group.
    #[error(
        "the PVC source does not belong to the right APIGroup. Expected snapshot.storage.k8s.io, Got {0}"
    )]
    SnapshotApiGroup(String),
    /// `dataSourceRef.namespace` with the gate off.
    #[error(
        "dataSourceRef namespace specified but the CrossNamespaceVolumeDataSource feature is disabled"
    )]
    CrossNamespaceDisabled,
    /// CSI migration: the in-tree class cannot be translated for the driver (upstream's text).
    #[error("failed to translate storage class: {0}")]
    ClassTranslation(String),
    /// A cross-namespace source no ReferenceGrant allows.
    #[error("{0}")]
    SourceDenied(String),
    /// The data source could not be resolved to a handle.
    #[error("error getting handle for DataSource Type {kind} by Name {name}: {reason}")]
    SourceUnresolved {
        /// Source kind.
        kind: String,
        /// Source name.
        name: String,
        /// Why.
        reason: String,
    },
    /// Volume name, size or access modes.
    #[error(transparent)]
    Request(#[from] RequestError),
    /// StorageClass parameters.
    #[error(transparent)]
    Params(#[from] ParamError),
    /// Secret references.
    #[error(transparent)]
    Secret(#[from] SecretError),
    /// Topology.
    #[error("error generating accessibility requirements: {0}")]
    Topology(TopologyError),
    /// The VolumeAttributesClass does not exist.
    #[error("volumeattributesclasses.storage.k8s.io {} not found", gofmt::quote(.0))]
    VacNotFound(String),
    /// The VolumeAttributesClass lookup failed.
    #[error("{0}")]
    VacLookupFailed(String),
    /// The VolumeAttributesClass is another driver's.
    #[error(
        "VAC {name} referenced in PVC is for driver {vac_driver} which does not match driver name {driver}"
    )]
    VacOtherDriver {
        /// VAC name.
        name: String,
        /// Its driver.
        vac_driver: String,
        /// Our driver.
        driver: String,
    },
}

fn capability_message(c: Capability) -> &'static str {
    match c {
        Capability::ControllerService => {
            "CSI driver does not support dynamic provisioning: plugin CONTROLLER_SERVICE capability is not reported"
        }
        Capability::CreateDeleteVolume => {
            "CSI driver does not support dynamic provisioning: controller CREATE_DELETE_VOLUME capability is not reported"
        }
        Capability::CreateDeleteSnapshot => {
            "CSI driver does not support snapshot restore: controller CREATE_DELETE_SNAPSHOT capability is not reported"
        }
        Capability::CloneVolume => {
            "CSI driver does not support clone operations: controller CLONE_VOLUME capability is not reported"
        }
        Capability::ModifyVolume => {
            "CSI driver does not support VolumeAttributesClass: controller MODIFY_VOLUME capability is not reported"
        }
    }
}

impl PlanError {
    /// Upstream's provisioning state for the error (metrics and logs): input errors are
    /// `Finished`, lookups that may succeed later are `NoChange`.
    #[cfg(test)]
    pub(crate) fn state(&self) -> super::classify::ProvisioningState {
        match self {
            PlanError::SourceUnresolved { .. }
            | PlanError::Secret(_)
            | PlanError::Topology(_)
            | PlanError::VacNotFound(_)
            | PlanError::VacLookupFailed(_) => super::classify::ProvisioningState::NoChange,
            _ => super::classify::ProvisioningState::Finished,
        }
    }

    /// Whether upstream emits its Normal `Provisioning` event before this error (errors found by
    /// the CSI part rather than the generic controller): emit it too, for identical event streams.
    pub(crate) fn follows_provisioning_event(&self) -> bool {
        !matches!(
            self,
            PlanError::NoClassName { .. }
                | PlanError::ClassNotFound(_)
                | PlanError::ClassOfOtherDriver { .. }
        )
    }
}
