//! What a claim's decision needs, gathered once per reconcile: the caches, plus the few live
//! reads only some claims need (a VolumeAttributesClass, a data source, in node mode what the
//! selected node recorded for the claim). Node-mode ownership is computed here, once.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::{CSINode, StorageClass, VolumeAttributesClass};
use kube::Api;
use kube::runtime::reflector::{ObjectRef, Store};

use super::report::kube_err;
use super::{ProvisionError, Provisioner, claim_key};
use crate::csi::v1::{CreateVolumeRequest, TopologyRequirement};
use crate::k8s::errors::describe;
use crate::model::csinode::CsiNodeLookup;
use crate::node_mode::ownership::{self, ClaimOwnership, OwnershipInputs};
use crate::provision::plan::{self, ClaimContext, ClaimDecision, Lookup, NodeFacts, SourceLookup};
use crate::provision::topology::TopologyView;

/// Everything [`plan::decide_claim`] (and [`plan::request_now`]) reads, owned (the topology view
/// is built when deciding: it is not `Sync`).
pub(super) struct Facts {
    class: Option<Arc<StorageClass>>,
    vac: Option<Result<Option<VolumeAttributesClass>, String>>,
    source: SourceLookup,
    pinned: Option<TopologyRequirement>,
    pv_exists: bool,
    selected_node_driver: CsiNodeLookup,
    selected_node_uid: Option<String>,
    node: Option<NodeFacts>,
}

/// Reads the facts of `pvc`.
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
    // Read with the same `pv_exists` the decision sees, so both agree on whether it is needed.
    let source = super::data_source::read(state, pvc, class.as_deref(), pv_exists).await;
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
    Ok(Facts {
        class,
        vac,
        source,
        pinned,
        pv_exists,
        selected_node_driver,
        selected_node_uid,
        node,
    })
}

/// Reads `Store` state as a topology view.
struct StoreTopology<'a> {
    nodes: Option<&'a Store<Node>>,
    csinodes: Option<&'a Store<CSINode>>,
}

impl TopologyView for StoreTopology<'_> {
    fn csinode(&self, name: &str) -> Option<Arc<CSINode>> {
        self.csinodes?.get(&ObjectRef::new(name))
    }
    fn node(&self, name: &str) -> Option<Arc<Node>> {
        self.nodes?.get(&ObjectRef::new(name))
    }
    fn csinodes(&self) -> Vec<Arc<CSINode>> {
        self.csinodes.map(Store::state).unwrap_or_default()
    }
    fn nodes(&self) -> Vec<Arc<Node>> {
        self.nodes.map(Store::state).unwrap_or_default()
    }
}

impl Facts {
    /// The decision over these facts ([`plan::decide_claim`]).
    pub(super) fn decide(&self, state: &Provisioner, pvc: &PersistentVolumeClaim) -> ClaimDecision {
        self.with_context(state, |ctx| plan::decide_claim(pvc, ctx))
    }

    /// The CreateVolume provisioning `pvc` would send now ([`plan::request_now`]).
    pub(super) fn request_now(
        &self,
        state: &Provisioner,
        pvc: &PersistentVolumeClaim,
        volume_name: &str,
    ) -> Option<CreateVolumeRequest> {
        self.with_context(state, |ctx| plan::request_now(pvc, ctx, volume_name))
    }

    /// Runs `f` over the claim context these facts make.
    fn with_context<T>(&self, state: &Provisioner, f: impl FnOnce(&ClaimContext<'_>) -> T) -> T {
        let stores = &state.ctx.stores;
        let store_topology = StoreTopology {
            nodes: stores.nodes.as_ref(),
            csinodes: stores.csinodes.as_ref(),
        };
        let topology: &dyn TopologyView = match &state.node_topology {
            Some(fixed) => fixed,
            None => &store_topology,
        };
        let vac = match &self.vac {
            None => Lookup::NotLookedUp,
            Some(Ok(Some(v))) => Lookup::Found(v),
            Some(Ok(None)) => Lookup::Missing,
            Some(Err(e)) => Lookup::Failed(e.as_str()),
        };
        f(&ClaimContext {
            settings: &state.settings,
            class: self.class.as_deref(),
            pv_exists: self.pv_exists,
            topology,
            selected_node_driver: self.selected_node_driver,
            selected_node_uid: self.selected_node_uid.as_deref(),
            pinned_topology: self.pinned.as_ref(),
            vac,
            source: &self.source,
            node: self.node.as_ref(),
        })
    }
}
