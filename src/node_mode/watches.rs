//! Node-deployment watches as [`super::scope`] designs them, so each instance caches what it may
//! act on rather than the whole cluster:
//!
//! - PVCs: every claim streams by (paginated list, then watch), but only those
//!   [`scope::cached_claim`] keeps enter the cache: claims selected to this node (bound ones too,
//!   the claims of its own volumes) and pending claims of our driver (unselected, or selected
//!   elsewhere). A claim of another node leaves the cache once bound.
//! - PVs: label-selected ([`scope::own_pv_watch`]): this node's PVs and PVs of no single node.
//!   A second PV watch, of PVs without our labels, keeps nothing: it labels our driver's PVs
//!   written by others so that they enter the first ([`super::labeller`]).
//! - Nodes: name, UID and the per-node labels only ([`scope::strip_node_metadata`]; no spec, no
//!   status: readiness is never read). CSINodes: our driver's entry only.
//! - StorageClasses (few, small) and VolumeAttachments (drivers that attach) as in controller mode.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::CSINode;
use kube::{Api, Client};
use tracing::{info, warn};

use super::labeller::Labeller;
use super::scope;
use crate::csi::DriverInfo;
use crate::k8s::cache::{Watched, WatchedLean, watch_lean_scoped, watch_shared_scoped};
use crate::model::locate::{HOSTNAME_LABEL, PerNodeKeys};
use crate::names;
use crate::retry::describe;

/// The scoped watches of one node-mode instance.
pub(crate) struct NodeWatches {
    /// Claims this instance may act on.
    pub(crate) pvcs: WatchedLean<PersistentVolumeClaim>,
    /// This node's PVs and PVs of no single node.
    pub(crate) pvs: WatchedLean<PersistentVolume>,
    /// Stripped Nodes.
    pub(crate) nodes: Watched<Node>,
    /// Stripped CSINodes.
    pub(crate) csinodes: Watched<CSINode>,
    /// Labels PVs of our driver made by others; to be spawned once the caches are filled (it
    /// reads the CSINode cache).
    pub(crate) labeller: Labeller,
}

/// Starts the scoped watches of the instance on `node_name` (`subscribers`: change streams of the
/// claim and PV watches; `extra_claim_subscribers` more of the claim watch, `extra_pv_subscribers`
/// more of the PV watch).
pub(crate) async fn start(
    client: &Client,
    driver: &DriverInfo,
    node_name: &str,
    subscribers: usize,
    extra_claim_subscribers: usize,
    extra_pv_subscribers: usize,
) -> NodeWatches {
    let hostname = own_hostname(client, node_name).await;
    let segments = driver.node_segments();
    let keys = PerNodeKeys::from_node(node_name, hostname.as_deref(), &segments);
    let labeller_keys = keys.clone();
    let own: Vec<String> = scope::instance_label_values(node_name, hostname.as_deref())
        .into_iter()
        .filter(|v| v != names::LABEL_VALUE_ANY_NODE)
        .collect();
    let pv_watch = scope::own_pv_watch(&driver.name, node_name, hostname.as_deref());
    info!(
        selector = pv_watch.label_selector.as_deref().unwrap_or_default(),
        "node-deployment mode: watching this node's PVs, the claims it may act on, and stripped Nodes and CSINodes"
    );
    let (name, me) = (driver.name.clone(), node_name.to_owned());
    let pvcs = watch_lean_scoped(
        Api::all(client.clone()),
        scope::paged_watch(),
        "persistentvolumeclaims",
        subscribers + extra_claim_subscribers,
        move |pvc: &mut PersistentVolumeClaim| scope::cached_claim(&pvc.metadata, &name, &me),
    );
    let pvs = watch_lean_scoped(
        Api::all(client.clone()),
        pv_watch,
        "persistentvolumes",
        subscribers + extra_pv_subscribers,
        |_: &mut PersistentVolume| true,
    );
    let nodes = watch_shared_scoped(
        Api::all(client.clone()),
        scope::paged_watch(),
        "nodes",
        0,
        move |node: &mut Node| {
            scope::strip_node_metadata(&mut node.metadata, &keys);
            node.spec = None;
            node.status = None;
            true
        },
    );
    let name = driver.name.clone();
    let csinodes = watch_shared_scoped(
        Api::all(client.clone()),
        scope::paged_watch(),
        "csinodes",
        0,
        move |csinode: &mut CSINode| {
            scope::strip_csinode(csinode, &name);
            true
        },
    );
    let labeller = Labeller {
        client: client.clone(),
        driver: driver.name.clone(),
        me: node_name.to_owned(),
        own,
        keys: labeller_keys,
        csinodes: csinodes.store.clone(),
    };
    NodeWatches {
        pvcs,
        pvs,
        nodes,
        csinodes,
        labeller,
    }
}

/// Our Node's `kubernetes.io/hostname` label: PVs pinned by host name are labelled with it. A few
/// attempts; without it only PVs labelled with the node name (all PVs this version creates) are seen.
async fn own_hostname(client: &Client, node_name: &str) -> Option<String> {
    let api: Api<Node> = Api::all(client.clone());
    let mut delay = Duration::from_millis(200);
    for attempt in 1..=5 {
        match api.get_metadata_opt(node_name).await {
            Ok(Some(node)) => {
                return node
                    .metadata
                    .labels
                    .and_then(|mut l| l.remove(HOSTNAME_LABEL));
            }
            Ok(None) => {
                warn!(node = %node_name, "NODE_NAME names no Node object; PVs are watched by node name only");
                return None;
            }
            Err(e) => {
                warn!(node = %node_name, attempt, error = %describe(&e), "reading our Node for its host name failed");
                tokio::time::sleep(delay).await;
                delay *= 2;
            }
        }
    }
    None
}

#[cfg(test)]
#[path = "watches_tests.rs"]
mod tests;
