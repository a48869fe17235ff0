//! The CSI part of provisioning (upstream `prepareProvision`): from a claim its class accepted to
//! the plan ([`ProvisionPlan`]: the CreateVolume request and the PV template), one named step per
//! check, in upstream's order, or why it cannot be provisioned as it is ([`PlanError`]: the
//! `ProvisioningFailed` event messages, upstream's text wherever upstream has one, and what
//! upstream's state would be).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::api::storage::v1::{StorageClass, VolumeAttributesClass};

use super::{
    Facts, IgnoreReason, ProvisionSettings, claim_volume_name, in_tree_plugin, requested_vac,
    translated_class,
};
use crate::csi::v1::CreateVolumeRequest;
use crate::csi::v1::TopologyRequirement;
use crate::csi::v1::volume_capability::access_mode::Mode;
use crate::gofmt;
use crate::model::claim::{claim_class_name, selected_node};
use crate::model::secrets::{ClaimIdentity, TemplateContext, resolve_all};
use crate::model::secrets::{SecretError, SecretRef};
use crate::provision::classify::may_reschedule;
use crate::provision::pv::{PvTemplate, claim_ref};
use crate::provision::request::{
    self, ContentSource, ParamError, RequestError, RequestParts, create_volume_request, is_block,
    requested_bytes,
};
use crate::provision::source::{SourceLookup, SourceRef, SourceToRead, source_ref};
use crate::provision::topology::{
    TopologyError, TopologyParams, generate_accessibility_requirements,
};

/// Everything the shell needs to provision.
#[derive(Debug, Clone)]
pub(crate) struct ProvisionPlan {
    /// The volume (and PV) name.
    pub(crate) volume_name: String,
    /// CreateVolume request without secrets; add the provisioner secret's data before sending.
    pub(crate) request: CreateVolumeRequest,
    /// The secret whose data goes into `request.secrets` (upstream: a fetch error is NoChange,
    /// `error getting secret <name> in namespace <ns>: <err>`).
    pub(crate) provisioner_secret: Option<SecretRef>,
    /// The PV, minus what the driver answers ([`PvTemplate::fill`] adds it).
    pub(crate) pv: PvTemplate,
    /// Whether `ResourceExhausted` means reschedule ([`crate::provision::classify::provisioning_state`]).
    pub(crate) may_reschedule: bool,
    /// UID of the StorageClass, for the infeasible hold-back ([`crate::retry::InfeasibleHold`]).
    pub(crate) class_uid: String,
    /// Upstream's deprecation warnings for the class's parameters (log them once per class).
    pub(crate) warnings: Vec<String>,
    /// The class's retry policy: stop after this many final failures (`provision::classify`).
    pub(crate) max_failures: Option<u32>,
    /// The class's name, for the retry policy's event.
    pub(crate) class_name: String,
    /// The data source the volume is made from: protected by its finalizer before CreateVolume,
    /// a snapshot's released once the PV exists (`controller::data_source`).
    pub(crate) source: Option<SourceRef>,
}

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
    pub(crate) fn state(&self) -> crate::provision::classify::ProvisioningState {
        match self {
            PlanError::SourceUnresolved { .. }
            | PlanError::Secret(_)
            | PlanError::Topology(_)
            | PlanError::VacNotFound(_)
            | PlanError::VacLookupFailed(_) => {
                crate::provision::classify::ProvisioningState::NoChange
            }
            _ => crate::provision::classify::ProvisioningState::Finished,
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

/// Why [`plan`] stopped.
pub(super) enum Stop {
    Fail(PlanError),
    Ignore(IgnoreReason),
    Reschedule(TopologyError),
    /// The data source is not read yet: the shell reads it and decides again (the error: what
    /// the decision says while it is unread).
    ReadSource(Box<(SourceToRead, PlanError)>),
}

impl<E: Into<PlanError>> From<E> for Stop {
    fn from(e: E) -> Self {
        Stop::Fail(e.into())
    }
}

/// The claim's data source (dataSource, else dataSourceRef) as `(kind, api_group, name)`.
pub(super) fn data_source(
    pvc: &PersistentVolumeClaim,
    settings: &ProvisionSettings,
) -> Result<Option<(String, String, String)>, PlanError> {
    let Some(spec) = pvc.spec.as_ref() else {
        return Ok(None);
    };
    let (kind, group, name) = match (&spec.data_source, &spec.data_source_ref) {
        (Some(ds), _) => (&ds.kind, &ds.api_group, &ds.name),
        (None, Some(r)) => {
            if r.namespace.as_deref().is_some_and(|ns| !ns.is_empty())
                && !settings.cross_namespace_data_source
            {
                return Err(PlanError::CrossNamespaceDisabled);
            }
            (&r.kind, &r.api_group, &r.name)
        }
        (None, None) => return Ok(None),
    };
    Ok(Some((
        kind.clone(),
        group.clone().unwrap_or_default(),
        name.clone(),
    )))
}

/// The CSI part of provisioning (upstream `prepareProvision`), in upstream's order.
pub(super) fn plan(
    pvc: &PersistentVolumeClaim,
    settings: &ProvisionSettings,
    facts: &Facts,
    class: &StorageClass,
) -> Result<ProvisionPlan, Stop> {
    let claim_name = pvc.metadata.name.as_deref().unwrap_or_default();
    let claim_namespace = pvc.metadata.namespace.as_deref().unwrap_or_default();
    let spec = pvc.spec.clone().unwrap_or_default();

    let source = data_source(pvc, settings)?;
    // CSI migration: a class of the in-tree plugin our driver took over is translated for the
    // driver (parameters, topologies); everything below reads the translated class, except what
    // upstream takes from the class as it is (`provisioned-by`, the reclaim policy).
    let in_tree = in_tree_plugin(class, &settings.driver);
    let original = class;
    let translated = translated_class(class, &settings.driver)?;
    let class: &StorageClass = &translated;
    let vac_name = requested_vac(pvc, settings).map(str::to_owned);
    check_capabilities(claim_name, source.as_ref(), vac_name.is_some(), settings)?;
    if spec.selector.is_some() {
        return Err(PlanError::Selector.into());
    }

    let volume_name = claim_volume_name(pvc, settings)?;
    let class_params = class.parameters.clone().unwrap_or_default();
    let fs_type = request::resolve_fs_type(&class_params, &settings.default_fs_type)?;
    let required_bytes = requested_bytes(pvc)?;
    let block = is_block(pvc);
    let access_modes = spec.access_modes.clone().unwrap_or_default();
    let mount_options = class.mount_options.clone();
    let capabilities = request::volume_capabilities(
        &access_modes,
        block,
        &fs_type,
        mount_options.as_deref().unwrap_or_default(),
        settings.controller.single_node_multi_writer,
    )?;
    let content_source = content_source(pvc, source.as_ref(), &facts.source, class)?;
    let node = selected_node(pvc);
    let accessibility = accessibility(settings, facts, class, claim_name, node)?;

    let empty = BTreeMap::new();
    let template_ctx = TemplateContext {
        pv_name: &volume_name,
        claim: Some(ClaimIdentity {
            name: claim_name,
            namespace: claim_namespace,
            annotations: Some(pvc.metadata.annotations.as_ref().unwrap_or(&empty)),
        }),
    };
    let secrets = resolve_all(&class_params, &template_ctx)?;

    let mut parameters = request::strip_prefixed_parameters(&class_params)?;
    if settings.extra_create_metadata {
        request::add_extra_create_metadata(
            &mut parameters,
            claim_name,
            claim_namespace,
            &volume_name,
        );
    }
    let mutable_parameters = mutable_parameters(vac_name.as_deref(), facts.vac.as_ref(), settings)?;

    // Upstream: the PV is read-only only for a single ReadOnlyMany capability and the flag.
    let read_only = settings.controller_publish_read_only
        && capabilities.len() == 1
        && capabilities[0].access_mode.as_ref().map(|m| m.mode)
            == Some(Mode::MultiNodeReaderOnly as i32);

    let request = create_volume_request(RequestParts {
        name: volume_name.clone(),
        required_bytes,
        capabilities,
        parameters,
        content_source,
        accessibility,
        mutable_parameters,
    });

    let pv = PvTemplate {
        name: volume_name.clone(),
        driver: settings.driver.clone(),
        provisioned_by: original.provisioner.clone(),
        provisioner_identity: settings.provisioner_identity.clone(),
        claim_ref: claim_ref(pvc),
        class_name: claim_class_name(pvc).unwrap_or_default().to_owned(),
        access_modes,
        mount_options,
        reclaim_policy: class.reclaim_policy.clone(),
        volume_mode: spec.volume_mode.clone(),
        block,
        fs_type,
        secrets: secrets.clone(),
        read_only,
        topology: settings.topology,
        volume_attributes_class: vac_name,
        required_bytes,
        expects_content_source: source.is_some(),
        node: recorded_node(settings, facts, node),
        node_is_selection: settings.node.is_none(),
        in_tree,
    };

    let mut warnings = request::deprecation_warnings(&class_params);
    let max_failures = crate::provision::classify::max_failures(class).unwrap_or_else(|e| {
        warnings.push(e);
        None
    });
    Ok(ProvisionPlan {
        volume_name,
        request,
        provisioner_secret: secrets.provisioner,
        pv,
        may_reschedule: may_reschedule(settings.topology, node),
        class_uid: class.metadata.uid.clone().unwrap_or_default(),
        warnings,
        max_failures,
        class_name: class.metadata.name.clone().unwrap_or_default(),
        source: source_ref(pvc),
    })
}

/// The capabilities the claim needs (a data source's kind, a VolumeAttributesClass) are the
/// driver's; a data source of another kind is an external populator's business.
fn check_capabilities(
    claim_name: &str,
    source: Option<&(String, String, String)>,
    wants_vac: bool,
    settings: &ProvisionSettings,
) -> Result<(), Stop> {
    let mut needs = vec![
        Capability::ControllerService,
        Capability::CreateDeleteVolume,
    ];
    if let Some((kind, group, name)) = source {
        if name.is_empty() {
            return Err(PlanError::EmptySourceName(claim_name.to_owned()).into());
        }
        match kind.as_str() {
            "VolumeSnapshot" if group != "snapshot.storage.k8s.io" => {
                return Err(PlanError::SnapshotApiGroup(group.clone()).into());
            }
            "VolumeSnapshot" => needs.push(Capability::CreateDeleteSnapshot),
            "PersistentVolumeClaim" => needs.push(Capability::CloneVolume),
            other => {
                return Err(Stop::Ignore(IgnoreReason::ExternalPopulator(
                    other.to_owned(),
                )));
            }
        }
    }
    if wants_vac {
        needs.push(Capability::ModifyVolume);
    }
    for cap in needs {
        let present = match cap {
            Capability::ControllerService => settings.plugin.controller_service,
            Capability::CreateDeleteVolume => settings.controller.create_delete_volume,
            Capability::CreateDeleteSnapshot => settings.controller.create_delete_snapshot,
            Capability::CloneVolume => settings.controller.clone_volume,
            Capability::ModifyVolume => settings.controller.modify_volume,
        };
        if !present {
            return Err(PlanError::MissingCapability(cap).into());
        }
    }
    Ok(())
}

/// The request's content source, as the shell resolved the claim's data source; one not read yet
/// is asked for, to be checked against `class` (the class the plan reads).
fn content_source(
    pvc: &PersistentVolumeClaim,
    source: Option<&(String, String, String)>,
    lookup: &SourceLookup,
    class: &StorageClass,
) -> Result<Option<ContentSource>, Stop> {
    let Some((kind, _, name)) = source else {
        return Ok(None);
    };
    match lookup {
        SourceLookup::Resolved(cs) => Ok(Some(cs.clone())),
        SourceLookup::Failed(reason) => Err(source_error(kind, name, reason).into()),
        SourceLookup::Denied(reason) => Err(PlanError::SourceDenied(reason.clone()).into()),
        SourceLookup::NotResolved => {
            let unread = source_error(kind, name, "the data source was not read");
            match source_ref(pvc) {
                Some(source) => Err(Stop::ReadSource(Box::new((
                    SourceToRead {
                        source,
                        class_name: class.metadata.name.clone().unwrap_or_default(),
                        driver: class.provisioner.clone(),
                    },
                    unread,
                )))),
                // A source this sidecar does not know how to read.
                None => Err(unread.into()),
            }
        }
    }
}

/// The accessibility requirement: the one pinned by an earlier attempt, else generated from the
/// class and the cluster (a missing selected node asks the scheduler to pick again).
fn accessibility(
    settings: &ProvisionSettings,
    facts: &Facts,
    class: &StorageClass,
    claim_name: &str,
    node: Option<&str>,
) -> Result<Option<TopologyRequirement>, Stop> {
    if !settings.topology {
        return Ok(None);
    }
    if let Some(pinned) = &facts.pinned_topology {
        return Ok(Some(pinned.clone()));
    }
    let params = TopologyParams {
        driver: &settings.driver,
        claim_name,
        allowed_topologies: class.allowed_topologies.as_deref().unwrap_or_default(),
        selected_node: node,
        strict: settings.strict_topology,
        immediate: settings.immediate_topology,
    };
    match generate_accessibility_requirements(&params, facts.topology.as_ref()) {
        Ok(req) => Ok(req),
        Err(e) if e.is_reschedule() => Err(Stop::Reschedule(e)),
        Err(e) => Err(PlanError::Topology(e).into()),
    }
}

/// The VolumeAttributesClass parameters, when the claim names one (it must be our driver's).
fn mutable_parameters(
    vac_name: Option<&str>,
    vac: Option<&Result<Option<VolumeAttributesClass>, String>>,
    settings: &ProvisionSettings,
) -> Result<Option<BTreeMap<String, String>>, PlanError> {
    let Some(name) = vac_name else {
        return Ok(None);
    };
    match vac {
        Some(Ok(Some(vac))) if vac.driver_name != settings.driver => {
            Err(PlanError::VacOtherDriver {
                name: name.to_owned(),
                vac_driver: vac.driver_name.clone(),
                driver: settings.driver.clone(),
            })
        }
        Some(Ok(Some(vac))) => Ok(Some(vac.parameters.clone().unwrap_or_default())),
        // Not found, or not looked up.
        Some(Ok(None)) | None => Err(PlanError::VacNotFound(name.to_owned())),
        Some(Err(e)) => Err(PlanError::VacLookupFailed(e.clone())),
    }
}

/// The node recorded on the PV: ours in node mode, else the selected one (with its UID).
fn recorded_node(
    settings: &ProvisionSettings,
    facts: &Facts,
    node: Option<&str>,
) -> Option<(String, Option<String>)> {
    let uid = facts.selected_node_uid.clone();
    match (&settings.node, node) {
        (Some(mode), _) => Some((mode.me.name.clone(), uid)),
        (None, Some(n)) => Some((n.to_owned(), uid)),
        (None, None) => None,
    }
}

fn source_error(kind: &str, name: &str, reason: &str) -> PlanError {
    PlanError::SourceUnresolved {
        kind: kind.to_owned(),
        name: name.to_owned(),
        reason: reason.to_owned(),
    }
}
