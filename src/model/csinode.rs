//! CSINode facts: which drivers run on a node, the nodes that run ours, and (in both modes) the
//! claim whose selected node runs no instance of ours, to be rescheduled (upstream issue 544).

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::api::storage::v1::CSINode;

use crate::model::claim::selected_node;
use crate::names;

/// Whether a CSINode lists `driver` (an instance of our driver runs on that node).
pub(crate) fn csinode_lists_driver(csinode: &CSINode, driver: &str) -> bool {
    csinode.spec.drivers.iter().any(|d| d.name == driver)
}

/// The names of the nodes whose CSINode lists `driver`, sorted and without duplicates: the
/// instances of a node-deployment DaemonSet that are alive.
pub(crate) fn live_instances<'a, I>(csinodes: I, driver: &str) -> Vec<String>
where
    I: IntoIterator<Item = &'a CSINode>,
{
    let set: BTreeSet<String> = csinodes
        .into_iter()
        .filter(|c| csinode_lists_driver(c, driver))
        .filter_map(|c| c.metadata.name.clone())
        .collect();
    set.into_iter().collect()
}

/// Whether a node runs an instance of our driver, as its CSINode says.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum CsiNodeLookup {
    /// Not looked up, cache not synced, or the lookup failed: never clear on this.
    #[default]
    Unknown,
    /// The CSINode lists our driver.
    HasDriver,
    /// The CSINode exists but does not list our driver.
    LacksDriver,
    /// No CSINode object for that node.
    NotFound,
}

impl CsiNodeLookup {
    /// Classifies a CSINode from a synced cache or a live GET (`None` = absent / 404).
    pub(crate) fn of(csinode: Option<&CSINode>, driver: &str) -> Self {
        match csinode {
            None => Self::NotFound,
            Some(c) if csinode_lists_driver(c, driver) => Self::HasDriver,
            Some(_) => Self::LacksDriver,
        }
    }
}

/// The decision to clear a claim's selected node, with its event and patch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ClearSelectedNode {
    /// The selected node being cleared.
    pub(crate) node: String,
    /// Warning event reason on the PVC: upstream's `ProvisioningFailed` where upstream
    /// reschedules too, else [`names::EVENT_SELECTED_NODE_CLEARED`].
    pub(crate) reason: &'static str,
    /// Event message: which node and why.
    pub(crate) message: String,
}

/// In either mode: a claim whose selected node has no instance of `driver` gets its selected node
/// cleared so the scheduler picks again (upstream issue 544). `None` when a node is not selected,
/// the node runs our driver, or nothing is known ([`CsiNodeLookup::Unknown`]).
///
/// The shell removes the annotation only while it still names that node
/// ([`crate::k8s::patch::remove_annotation_if_step`]) and records the Warning event on the PVC.
pub(crate) fn selected_node_check(
    pvc: &PersistentVolumeClaim,
    driver: &str,
    lookup: CsiNodeLookup,
) -> Option<ClearSelectedNode> {
    let node = selected_node(pvc)?;
    let why = match lookup {
        CsiNodeLookup::Unknown | CsiNodeLookup::HasDriver => return None,
        // Upstream reschedules this one too, with its own words: the same event here.
        CsiNodeLookup::NotFound => {
            return Some(ClearSelectedNode {
                node: node.to_owned(),
                reason: names::EVENT_PROVISIONING_FAILED,
                message: format!(
                    "failed to get selected CSINode {node}: csinode.storage.k8s.io {} not found",
                    crate::gofmt::quote(node)
                ),
            });
        }
        // Upstream never reschedules this one (the claim waits for ever, its issue 544).
        CsiNodeLookup::LacksDriver => "the node's CSINode does not list the driver",
    };
    Some(ClearSelectedNode {
        node: node.to_owned(),
        reason: names::EVENT_SELECTED_NODE_CLEARED,
        message: format!(
            "selected node {node:?} has no instance of driver {driver:?} ({why}); removed the {} \
             annotation so that the scheduler picks another node",
            names::ANN_SELECTED_NODE
        ),
    })
}
