//! What a claim's decision needs ([`Facts`]), gathered once per reconcile: the caches, plus the
//! few live reads only some claims need (a VolumeAttributesClass, in node mode what the selected
//! node recorded for the claim), then the data source the decision asks for. Node-mode ownership
//! is computed here, once.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::{CSINode, VolumeAttributesClass};
use kube::Api;
use kube::runtime::reflector::{ObjectRef, Store};

use super::kube_err;
use super::{ProvisionError, Provisioner, claim_key};
use crate::csi::v1::CreateVolumeRequest;
use crate::k8s::errors::describe;
use crate::model::csinode::CsiNodeLookup;
use crate::node_mode::ownership::{self, ClaimOwnership, OwnershipInputs};
use crate::provision::plan::ProvisionSettings;
use crate::provision::plan::{self, ClaimDecision, Facts, NodeFacts};
use crate::provision::source::{SourceLookup, holds_clone_protection};
use crate::provision::topology::{StaticTopology, TopologyView};
use crate::runtime::Context;

/// Reads the facts of `pvc`: the caches and live reads every decision of its kind needs, then the
/// data source if the decision over those asks for it ([`plan::source_to_read`]).
pub(super) async fn gather(
    state: &Provisioner,
    pvc: &PersistentVolumeClaim,
) -> Result<Facts, ProvisionError> {
    let ctx = &state.ctx;
    let stores = &ctx.stores;
    let settings = &state.settings;
    let vac = match plan::vac_to_look_up(pvc, settings) {
        Some(name) => Some(
            Api::<VolumeAttributesClass>::all(ctx.client.clone())
                .get_opt(name)
                .await
                .map_err(|e| describe(&e)),
        ),
        None => None,
    };
    let class = crate::model::claim::claim_class_name(pvc)
        .and_then(|name| stores.classes.get(&ObjectRef::new(name)));
    let pinned = state.memory().pinned(&claim_key(pvc));
    let pv_exists =
        plan::claim_volume_name(pvc, settings).is_ok_and(|name| stores.pvs.get(&name).is_some());
    let selected_node_driver = match &stores.csinodes {
        // Controller mode always checks; in node mode one instance of the live ones does.
        Some(csinodes) => plan::selected_node_to_check(pvc, pinned.is_some(), || {
            settings.node.as_ref().is_none_or(|mode| {
                ownership::checks_selected_node(
                    &mode.me.name,
                    pvc.metadata.uid.as_deref().unwrap_or_default(),
                    &csinodes.state(),
                    &settings.driver,
                )
            })
        })
        .map_or(CsiNodeLookup::Unknown, |node| {
            CsiNodeLookup::of(
                csinodes.get(&ObjectRef::new(node)).as_deref(),
                &settings.driver,
            )
        }),
        None => CsiNodeLookup::Unknown,
    };
    let selected_node_uid = match (crate::model::claim::selected_node(pvc), &stores.nodes) {
        (Some(node), Some(nodes)) => nodes
            .get(&ObjectRef::new(node))
            .and_then(|n| n.metadata.uid.clone()),
        _ => None,
    };
    let node = match &settings.node {
        Some(mode) if plan::not_to_provision(pvc, settings).is_none() => {
            let ownership = ownership::check_node(
                pvc,
                &OwnershipInputs {
                    me: &mode.me,
                    driver: &settings.driver,
                    topology_supported: settings.topology,
                    immediate_binding: mode.immediate_binding,
                    storage_class: class.as_deref(),
                    selected_node_driver,
                },
            );
            // Before a node without our driver is cleared: did it get a CreateVolume for this
            // claim? (Rare: one LIST of that node's ledger.)
            let recorded_on_selected = match &ownership {
                ClaimOwnership::ClearSelectedNode(clear) => {
                    crate::provision::controller::intents::recorded_on_node(ctx, pvc, &clear.node)
                        .await
                        .map_err(kube_err(format!(
                            "reading the intent ledger of node {}",
                            clear.node
                        )))?
                }
                _ => None,
            };
            Some(NodeFacts {
                ownership,
                recorded_on_selected,
            })
        }
        _ => None,
    };
    let mut facts = Facts {
        class,
        pv_exists,
        topology: state.topology.clone(),
        selected_node_driver,
        selected_node_uid,
        pinned_topology: pinned,
        vac,
        source: SourceLookup::NotResolved,
        node,
        // Only a claim that protects a clone source asks (the others never enter `data_source`).
        clones_pending: holds_clone_protection(pvc)
            && super::data_source::clones_pending(state, pvc),
    };
    if let Some(need) = plan::source_to_read(pvc, settings, &facts) {
        facts.source = super::data_source::read(state, pvc, &need).await;
    }
    Ok(facts)
}

/// The topology view the decisions read: node mode's fixed view of its own node, else the Node
/// and CSINode caches.
pub(super) fn topology_of(
    ctx: &Context,
    settings: &ProvisionSettings,
) -> Arc<dyn TopologyView + Send + Sync> {
    match &settings.node {
        // As upstream: a CSINode and a Node built from NodeGetInfo.
        Some(mode) => {
            let node_id = ctx
                .driver
                .node
                .as_ref()
                .map(|n| n.node_id.clone())
                .unwrap_or_default();
            Arc::new(StaticTopology::single_node(
                &mode.me.name,
                &settings.driver,
                &node_id,
                &mode.me.segments,
            ))
        }
        None => Arc::new(StoreTopology {
            nodes: ctx.stores.nodes.clone(),
            csinodes: ctx.stores.csinodes.clone(),
        }),
    }
}

/// Reads `Store` state as a topology view.
struct StoreTopology {
    nodes: Option<Store<Node>>,
    csinodes: Option<Store<CSINode>>,
}

impl TopologyView for StoreTopology {
    fn csinode(&self, name: &str) -> Option<Arc<CSINode>> {
        self.csinodes.as_ref()?.get(&ObjectRef::new(name))
    }
    fn node(&self, name: &str) -> Option<Arc<Node>> {
        self.nodes.as_ref()?.get(&ObjectRef::new(name))
    }
    fn csinodes(&self) -> Vec<Arc<CSINode>> {
        self.csinodes.as_ref().map(Store::state).unwrap_or_default()
    }
    fn nodes(&self) -> Vec<Arc<Node>> {
        self.nodes.as_ref().map(Store::state).unwrap_or_default()
    }
}

// The shell's entry points to the decision over gathered facts.
impl Facts {
    /// The decision over these facts ([`plan::decide_claim`]).
    pub(super) fn decide(&self, state: &Provisioner, pvc: &PersistentVolumeClaim) -> ClaimDecision {
        plan::decide_claim(pvc, &state.settings, self)
    }

    /// The CreateVolume provisioning `pvc` would send now ([`plan::request_now`]).
    pub(super) fn request_now(
        &self,
        state: &Provisioner,
        pvc: &PersistentVolumeClaim,
        volume_name: &str,
    ) -> Option<CreateVolumeRequest> {
        plan::request_now(pvc, &state.settings, self, volume_name)
    }
}
