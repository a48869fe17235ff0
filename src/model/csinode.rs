//! CSINode facts: which drivers run on a node, and the nodes that run ours.

use std::collections::BTreeSet;

use k8s_openapi::api::storage::v1::CSINode;

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
