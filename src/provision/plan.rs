//! The claim decision: given a PVC and everything the shell read from its caches, what to do now
//! ([`decide_claim`] → [`ClaimDecision`]). Pure: no API calls, no clocks, no CSI.
//!
//! Checks run in upstream's order (reference §4.2-4.3), so the first problem reported is the one
//! upstream reports. Silent outcomes are [`ClaimDecision::Ignore`]; bad input is
//! [`ClaimDecision::Fail`] (a `ProvisioningFailed` event, retried with backoff).
//!
//! # Facts, then one decision
//!
//! The shell gathers everything once into [`Facts`] (caches, plus the few live reads it needs: a
//! VolumeAttributesClass, in node mode what the selected node recorded), and reads what the
//! decision asks for ([`source_to_read`]: the data source) before deciding again.
//! Node-mode ownership is one of those facts ([`NodeFacts`]), computed once by
//! `node_mode::ownership`. The durable intent is not: the intent log (`provision::controller::intents`)
//! records it before CreateVolume, and its resolver alone cleans up after claims that no longer
//! want their volume, whichever store holds the record.
//!
//! The shell must never run a claim's CreateVolume and a PV's DeleteVolume for the same volume
//! name at the same time (`runtime::VolumeLocks`).
//!
//! # The plan
//!
//! The CSI part of provisioning (upstream `prepareProvision`): from a claim its class accepted to
//! the plan ([`ProvisionPlan`]: the CreateVolume request and the PV template), one named step per
//! check, in upstream's order, or why it cannot be provisioned as it is ([`PlanError`]: the
//! `ProvisioningFailed` event messages, upstream's text wherever upstream has one, and what
//! upstream's state would be).

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::api::storage::v1::{StorageClass, VolumeAttributesClass};

use super::classify::may_reschedule;
use super::pv::{PvTemplate, claim_ref};
use super::request::{
    self, ContentSource, ParamError, RequestError, RequestParts, create_volume_request, is_block,
    make_volume_name, requested_bytes,
};
use super::source::{SourceLookup, SourceRef, SourceToRead, holds_clone_protection, source_ref};
use super::topology::{
    TopologyError, TopologyParams, TopologyView, generate_accessibility_requirements,
};
use crate::csi::probe::{ControllerCapabilities, PluginCapabilities};
use crate::csi::v1::volume_capability::access_mode::Mode;
use crate::csi::v1::{CreateVolumeRequest, TopologyRequirement};
use crate::gofmt;
use crate::migration::Plugin;
use crate::model::claim::{claim_class_name, is_ours, provisioner, selected_node};
use crate::model::meta::non_empty_annotation;
use crate::model::secrets::{ClaimIdentity, SecretError, SecretRef, TemplateContext, resolve_all};
use crate::model::topology::{ClearSelectedNode, CsiNodeLookup, selected_node_check};
use crate::names;
use crate::node_mode::ownership::{ClaimOwnership, NodeIdentity, NotOwned};
use capacity_check::capacity_check;
pub(crate) use capacity_check::{CapacityCheck, CapacityVerdict};

mod capacity_check;

/// Process-wide settings (from flags, gates and the driver handshake).
#[derive(Debug, Clone, Default)]
#[allow(clippy::struct_excessive_bools)]
pub(crate) struct ProvisionSettings {
    /// Our driver name (GetPluginInfo).
    pub(crate) driver: String,
    /// Provisioner identity written into every PV's volume attributes.
    pub(crate) provisioner_identity: String,
    /// `--volume-name-prefix`.
    pub(crate) volume_name_prefix: String,
    /// `--volume-name-uuid-length` (`None` for the default -1).
    pub(crate) volume_name_uuid_length: Option<usize>,
    /// `--default-fstype` (`""` when unset).
    pub(crate) default_fs_type: String,
    /// `--extra-create-metadata`.
    pub(crate) extra_create_metadata: bool,
    /// `--strict-topology`.
    pub(crate) strict_topology: bool,
    /// `--immediate-topology`.
    pub(crate) immediate_topology: bool,
    /// `--controller-publish-readonly`.
    pub(crate) controller_publish_read_only: bool,
    /// `Topology` gate on and the plugin reports VOLUME_ACCESSIBILITY_CONSTRAINTS.
    pub(crate) topology: bool,
    /// `VolumeAttributesClass` gate (after start-up auto-disabling).
    pub(crate) volume_attributes_class: bool,
    /// `CrossNamespaceVolumeDataSource` gate.
    pub(crate) cross_namespace_data_source: bool,
    /// Plugin capabilities.
    pub(crate) plugin: PluginCapabilities,
    /// Controller capabilities.
    pub(crate) controller: ControllerCapabilities,
    /// Node-deployment mode, when on.
    pub(crate) node: Option<NodeMode>,
}

/// Node-deployment settings.
#[derive(Debug, Clone, Default)]
pub(crate) struct NodeMode {
    /// Our node (`NODE_NAME`) and its NodeGetInfo segments.
    pub(crate) me: NodeIdentity,
    /// `--node-deployment-immediate-binding`.
    pub(crate) immediate_binding: bool,
}

/// What the shell gathered for one claim, once (`controller::gather`), as the decision
/// reads it: the caches, plus the few live reads only some claims need (a VolumeAttributesClass,
/// the data source the decision asks for, in node mode what the selected node recorded).
pub(crate) struct Facts {
    /// The StorageClass named by [`claim_class_name`], from the cache.
    pub(crate) class: Option<Arc<StorageClass>>,
    /// Whether a PV named [`claim_volume_name`] exists (cache; see the module doc on lag).
    pub(crate) pv_exists: bool,
    /// Nodes and CSINodes (the caches, read when a requirement is generated; node mode: its
    /// fixed view of its own node).
    pub(crate) topology: Arc<dyn TopologyView + Send + Sync>,
    /// Whether the selected node runs our driver, when known (`node_mode::ownership` decides who
    /// may clear a selected node; `Unknown` otherwise, see [`selected_node_to_check`]).
    pub(crate) selected_node_driver: CsiNodeLookup,
    /// UID of the selected Node, when cached (recorded on the PV).
    pub(crate) selected_node_uid: Option<String>,
    /// The accessibility requirement pinned for this claim by an earlier attempt whose
    /// CreateVolume may still be in progress ([`super::controller::ClaimMemory::pinned`]): sent again
    /// as is, without looking at nodes, so a retry is identical even if the node is gone
    /// (upstream's per-PVC topology cache). While one is pinned, `selected_node_driver` is
    /// `Unknown` too: the node is settled until the attempt ends.
    pub(crate) pinned_topology: Option<TopologyRequirement>,
    /// The VolumeAttributesClass named by the claim ([`vac_to_look_up`]): `None` when not looked
    /// up, else the GET's answer (`Ok(None)`: it does not exist; `Err`: the error text).
    pub(crate) vac: Option<Result<Option<VolumeAttributesClass>, String>>,
    /// The claim's data source, read once the decision asked for it ([`source_to_read`]).
    pub(crate) source: SourceLookup,
    /// Node mode: who serves the claim (`None` in controller mode).
    pub(crate) node: Option<NodeFacts>,
    /// A clone source being deleted ([`holds_clone_protection`]): whether a pending claim still
    /// clones it (`source::clone_in_progress` over the claim cache); `false` for any other claim.
    pub(crate) clones_pending: bool,
}

/// Node mode: the claim's ownership, computed once by the shell (`node_mode::ownership`).
#[derive(Debug, Clone)]
pub(crate) struct NodeFacts {
    /// Who serves the claim.
    pub(crate) ownership: ClaimOwnership,
    /// When `ownership` says to clear the selected node: the volume name that node recorded for
    /// the claim (a CreateVolume was sent there, so a volume may exist on it).
    pub(crate) recorded_on_selected: Option<String>,
}

/// What to do with a claim.
#[derive(Debug, Clone)]
pub(crate) enum ClaimDecision {
    /// Nothing to do; no event.
    Ignore(IgnoreReason),
    /// Provision: write the intent if needed, fetch the secret, call CreateVolume, create the PV.
    Provision(Box<ProvisionPlan>),
    /// Bad input: a `ProvisioningFailed` event with this error, retried with backoff.
    Fail(PlanError),
    /// Remove `volume.kubernetes.io/selected-node` so the scheduler picks another node.
    ClearSelectedNode(ClearReason),
    /// Node mode: an unselected Immediate-binding claim this node could serve; run the
    /// competition (`node_mode::ownership`), first asking the driver whether the claim fits
    /// ([`CapacityCheck`]; `None`: nothing to ask).
    Compete(Option<CapacityCheck>),
    /// A clone source being deleted still holds the clone-protection finalizer: wait while a
    /// pending claim clones it (`clones_pending`), else remove the finalizer; then it is a claim
    /// being deleted like any other ([`IgnoreReason::ClaimDeleting`]).
    ReleaseCloneSource {
        /// Whether a pending claim still clones it ([`Facts::clones_pending`]).
        clones_pending: bool,
    },
}

/// Why a claim is left alone (debug logs only).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum IgnoreReason {
    /// The claim is being deleted and no provisioning was ever started.
    ClaimDeleting,
    /// `spec.volumeName` is set: bound or pre-bound.
    AlreadyBound(String),
    /// The provisioner annotation names another provisioner (or none).
    NotOurs(Option<String>),
    /// Node mode: another instance's claim (or not ours yet).
    NotThisNode(NotOwned),
    /// `WaitForFirstConsumer` and no node selected yet.
    WaitingForFirstConsumer,
    /// The claim's PV exists already.
    PvExists(String),
    /// The class's retry policy stopped provisioning this claim (`provision::classify`).
    ProvisioningStopped,
    /// A data source kind for an external populator; the shell emits upstream's Normal
    /// `Provisioning` event "Assuming an external populator will provision the volume".
    ExternalPopulator(String),
}

/// Why the selected node is cleared.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ClearReason {
    /// The node has no instance of our driver (`node_mode::ownership`; event `SelectedNodeCleared`).
    NoDriverInstance(ClearSelectedNode),
    /// Upstream's reschedule: the selected node's CSINode is missing (event `ProvisioningFailed`).
    Reschedule(TopologyError),
    /// Node mode: a CreateVolume of the claim was sent to the selected node, which has no CSINode
    /// any more. If the Node stays absent for the deleted-node grace period (the shell confirms
    /// with a live GET), the volume went with it and the scheduler picks another node (whose
    /// instance creates the volume under the same name); event `VolumeNodeGone`.
    NodeGone {
        /// The selected node.
        node: String,
        /// The volume name recorded there.
        volume_name: String,
    },
}

impl ClearReason {
    /// The event reason.
    pub(crate) fn event_reason(&self) -> &'static str {
        match self {
            ClearReason::NoDriverInstance(c) => c.reason,
            ClearReason::Reschedule(_) => names::EVENT_PROVISIONING_FAILED,
            ClearReason::NodeGone { .. } => names::EVENT_VOLUME_NODE_GONE,
        }
    }

    /// Whether the clearing is one of upstream's failed attempts, which its library announces
    /// with the Normal `Provisioning` event first.
    pub(crate) fn is_failed_attempt(&self) -> bool {
        self.event_reason() == names::EVENT_PROVISIONING_FAILED
    }

    /// The event message.
    pub(crate) fn message(&self) -> String {
        match self {
            ClearReason::NoDriverInstance(c) => c.message.clone(),
            ClearReason::Reschedule(e) => e.to_string(),
            ClearReason::NodeGone { node, volume_name } => format!(
                "node {node:?}, on which volume {volume_name} was being created for this claim, no longer exists"
            ),
        }
    }
}

/// The volume name of a claim: the one its claim record names (so a changed `--volume-name-prefix`
/// never forks a claim into two volumes), else `<prefix>-<uid>`. The shell checks whether a PV of
/// this name exists ([`Facts::pv_exists`]).
pub(crate) fn claim_volume_name(
    pvc: &PersistentVolumeClaim,
    settings: &ProvisionSettings,
) -> Result<String, RequestError> {
    if let Some(name) = non_empty_annotation(&pvc.metadata, names::ANN_INTENT_VOLUME_NAME) {
        return Ok(name.to_owned());
    }
    make_volume_name(
        &settings.volume_name_prefix,
        pvc.metadata.uid.as_deref().unwrap_or_default(),
        settings.volume_name_uuid_length,
    )
}

/// The VolumeAttributesClass the claim asks for, when the gate is on.
pub(crate) fn requested_vac<'p>(
    pvc: &'p PersistentVolumeClaim,
    settings: &ProvisionSettings,
) -> Option<&'p str> {
    pvc.spec
        .as_ref()?
        .volume_attributes_class_name
        .as_deref()
        .filter(|name| settings.volume_attributes_class && !name.is_empty())
}

/// The VolumeAttributesClass the shell reads for [`Facts::vac`]: only a claim still to be
/// provisioned (unbound, not being deleted) needs its parameters.
pub(crate) fn vac_to_look_up<'p>(
    pvc: &'p PersistentVolumeClaim,
    settings: &ProvisionSettings,
) -> Option<&'p str> {
    let bound = pvc
        .spec
        .as_ref()
        .and_then(|s| s.volume_name.as_ref())
        .is_some();
    if bound || pvc.metadata.deletion_timestamp.is_some() {
        return None;
    }
    requested_vac(pvc, settings)
}

/// The node whose CSINode the shell looks up for [`Facts::selected_node_driver`]: none
/// while a requirement is pinned (the node is settled until that attempt ends), and only when
/// this instance is the one that checks this claim (`checker`, asked last because it ranks the
/// live instances; in node mode one instance per claim checks, so the claim gets one event).
pub(crate) fn selected_node_to_check(
    pvc: &PersistentVolumeClaim,
    pinned: bool,
    checker: impl FnOnce() -> bool,
) -> Option<&str> {
    if pinned {
        return None;
    }
    selected_node(pvc).filter(|_| checker())
}

/// Node mode: the selected node has no instance of our driver, and a CreateVolume for the claim
/// was sent there (`recorded`: the volume name the node recorded). A volume may exist on that node:
/// it stays selected until its instance is back, unless the node itself is gone (no CSINode; the
/// shell confirms the Node's absence after the grace period).
fn clear_or_wait(
    clear: &ClearSelectedNode,
    recorded: Option<&String>,
    selected_node_driver: CsiNodeLookup,
) -> ClaimDecision {
    match recorded {
        None => ClaimDecision::ClearSelectedNode(ClearReason::NoDriverInstance(clear.clone())),
        Some(volume_name) if selected_node_driver == CsiNodeLookup::NotFound => {
            ClaimDecision::ClearSelectedNode(ClearReason::NodeGone {
                node: clear.node.clone(),
                volume_name: volume_name.clone(),
            })
        }
        Some(_) => ClaimDecision::Ignore(IgnoreReason::NotThisNode(NotOwned::SelectedOtherNode(
            clear.node.clone(),
        ))),
    }
}

/// Why `pvc` is not a claim to provision, whatever else is known: being deleted, bound, or
/// another provisioner's. The shell skips the node-mode facts of such claims.
pub(crate) fn not_to_provision(
    pvc: &PersistentVolumeClaim,
    settings: &ProvisionSettings,
) -> Option<IgnoreReason> {
    if pvc.metadata.deletion_timestamp.is_some() {
        return Some(IgnoreReason::ClaimDeleting);
    }
    let bound_to = pvc
        .spec
        .as_ref()
        .and_then(|s| s.volume_name.as_deref())
        .filter(|v| !v.is_empty());
    if let Some(pv) = bound_to {
        return Some(IgnoreReason::AlreadyBound(pv.to_owned()));
    }
    if !is_ours(pvc, &settings.driver) {
        return Some(IgnoreReason::NotOurs(provisioner(pvc).map(str::to_owned)));
    }
    None
}

/// The in-tree plugin our driver took over whose class `class` is (CSI migration).
pub(crate) fn in_tree_plugin(class: &StorageClass, driver: &str) -> Option<Plugin> {
    Plugin::of_driver(driver).filter(|p| class.provisioner == p.in_tree_name())
}

/// Whether claims of `class` are our driver's to provision: its own class, or (CSI migration)
/// the class of the in-tree plugin it took over.
fn serves(class: &StorageClass, driver: &str) -> bool {
    class.provisioner == driver || in_tree_plugin(class, driver).is_some()
}

/// `class` as the plan reads it: a class of the in-tree plugin our driver took over translated
/// for the driver (upstream translates it before any other check, the data source's included),
/// any other class as it is.
pub(crate) fn translated_class<'c>(
    class: &'c StorageClass,
    driver: &str,
) -> Result<Cow<'c, StorageClass>, PlanError> {
    match in_tree_plugin(class, driver) {
        Some(plugin) => plugin
            .translate_class(class)
            .map(Cow::Owned)
            .map_err(PlanError::ClassTranslation),
        None => Ok(Cow::Borrowed(class)),
    }
}

/// `WaitForFirstConsumer` and no node selected yet.
fn waits_for_consumer(pvc: &PersistentVolumeClaim, class: &StorageClass) -> bool {
    class.volume_binding_mode.as_deref() == Some("WaitForFirstConsumer")
        && selected_node(pvc).is_none()
}

/// Decides what to do with `pvc`, over the facts the shell gathered. A data source the shell has
/// not read ([`source_to_read`]) counts as unresolved.
pub(crate) fn decide_claim(
    pvc: &PersistentVolumeClaim,
    settings: &ProvisionSettings,
    facts: &Facts,
) -> ClaimDecision {
    decide(pvc, settings, facts).unwrap_or_else(|unread| unread.1)
}

/// The data source the decision stops at because the shell has not read it: the shell reads it
/// into [`Facts::source`] and decides again. `None` for a claim without a source (nothing to
/// decide twice) and wherever the decision stops before the source.
pub(crate) fn source_to_read(
    pvc: &PersistentVolumeClaim,
    settings: &ProvisionSettings,
    facts: &Facts,
) -> Option<SourceToRead> {
    source_ref(pvc)?;
    decide(pvc, settings, facts).err().map(|unread| unread.0)
}

/// [`decide_claim`]; `Err`: the source to read, and the decision while it is unread.
fn decide(
    pvc: &PersistentVolumeClaim,
    settings: &ProvisionSettings,
    facts: &Facts,
) -> Result<ClaimDecision, Box<(SourceToRead, ClaimDecision)>> {
    if holds_clone_protection(pvc) {
        return Ok(ClaimDecision::ReleaseCloneSource {
            clones_pending: facts.clones_pending,
        });
    }
    if let Some(reason) = not_to_provision(pvc, settings) {
        return Ok(ClaimDecision::Ignore(reason));
    }
    if let (Some(mode), Some(node)) = (&settings.node, &facts.node) {
        match &node.ownership {
            ClaimOwnership::Owned => {}
            ClaimOwnership::Compete => {
                let check = match facts.class.as_deref() {
                    Some(class) => capacity_check(pvc, settings, facts, class, &mode.me.name)
                        .map_err(|need| Box::new((need, ClaimDecision::Compete(None))))?,
                    None => None,
                };
                return Ok(ClaimDecision::Compete(check));
            }
            ClaimOwnership::NotOwned(why) => {
                return Ok(ClaimDecision::Ignore(IgnoreReason::NotThisNode(
                    why.clone(),
                )));
            }
            ClaimOwnership::ClearSelectedNode(c) => {
                return Ok(clear_or_wait(
                    c,
                    node.recorded_on_selected.as_ref(),
                    facts.selected_node_driver,
                ));
            }
        }
    }

    let class = match (claim_class_name(pvc), facts.class.as_deref()) {
        (None, _) => {
            return Ok(ClaimDecision::Fail(PlanError::NoClassName {
                driver: settings.driver.clone(),
            }));
        }
        (Some(name), None) => {
            return Ok(ClaimDecision::Fail(PlanError::ClassNotFound(
                name.to_owned(),
            )));
        }
        (Some(_), Some(class)) => class,
    };
    if !serves(class, &settings.driver) {
        return Ok(ClaimDecision::Fail(PlanError::ClassOfOtherDriver {
            class: class.metadata.name.clone().unwrap_or_default(),
            provisioner: class.provisioner.clone(),
            driver: settings.driver.clone(),
        }));
    }
    if waits_for_consumer(pvc, class) {
        return Ok(ClaimDecision::Ignore(IgnoreReason::WaitingForFirstConsumer));
    }
    if facts.pv_exists {
        let name = claim_volume_name(pvc, settings).unwrap_or_default();
        return Ok(ClaimDecision::Ignore(IgnoreReason::PvExists(name)));
    }
    // Controller mode clears even with an intent recorded: the one driver behind every node
    // answers a CreateVolume of the same name with the volume it already made (node mode, where
    // each node has its own backend, keeps the node: see [`clear_or_wait`]).
    if settings.node.is_none()
        && let Some(clear) = selected_node_check(pvc, &settings.driver, facts.selected_node_driver)
    {
        return Ok(ClaimDecision::ClearSelectedNode(
            ClearReason::NoDriverInstance(clear),
        ));
    }

    // Stopped by the class's retry policy, which stops only after a final failure (no volume in
    // the making). An intent still recorded is resolved once the claim is deleted.
    if super::classify::is_stopped(pvc) {
        return Ok(ClaimDecision::Ignore(IgnoreReason::ProvisioningStopped));
    }
    Ok(match plan(pvc, settings, facts, class) {
        Ok(plan) => ClaimDecision::Provision(Box::new(plan)),
        Err(Stop::Fail(e)) => ClaimDecision::Fail(e),
        Err(Stop::Ignore(r)) => ClaimDecision::Ignore(r),
        Err(Stop::Reschedule(e)) => ClaimDecision::ClearSelectedNode(ClearReason::Reschedule(e)),
        Err(Stop::ReadSource(unread)) => {
            let (need, error) = *unread;
            return Err(Box::new((need, ClaimDecision::Fail(error))));
        }
    })
}

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
enum Stop {
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
fn data_source(
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
fn plan(
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

#[cfg(test)]
#[path = "plan_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "plan_props_tests.rs"]
mod props_tests;
