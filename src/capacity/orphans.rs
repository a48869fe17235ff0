//! Node-deployment mode: the objects of instances whose node was deleted, which no instance
//! manages any more (each manages only its own `managed-by` id).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::storage::v1::CSIStorageCapacity;
use kube::api::{DeleteParams, ListParams};
use kube::{Api, Client};
use tokio::sync::watch;
use tracing::{info, warn};

use super::plan;
use crate::retry::describe;
use crate::runtime::{Context, Shutdown};

/// Node-deployment mode: deletes the objects of instances whose node was deleted (nobody else
/// would: each instance manages only its own). One instance acts, the first in rendezvous order
/// among the live instances; an id must have had no Node for `--deleted-node-grace-period`
/// (observed in the cache) and still have none in a live list before its objects are deleted.
pub(crate) async fn sweep(
    ctx: Arc<Context>,
    client: Client,
    namespace: String,
    me: String,
    leader: watch::Receiver<bool>,
    shutdown: Shutdown,
) {
    let (Some(nodes), Some(csinodes)) = (ctx.stores.nodes.clone(), ctx.stores.csinodes.clone())
    else {
        return;
    };
    let driver = ctx.driver.name.clone();
    let grace = ctx.config.deleted_node.grace_period;
    let api: Api<CSIStorageCapacity> = Api::namespaced(client.clone(), &namespace);
    let node_api: Api<Node> = Api::all(client);
    let selector = format!("{}={driver}", crate::names::LABEL_DRIVER_NAME);
    let key = format!("{driver}/capacity-orphans");
    let mut missing_since: HashMap<String, Instant> = HashMap::new();
    let period = crate::gone_nodes::policy::check_interval(grace);
    let mut ticks = tokio::time::interval(period);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let stop = shutdown.requested();
    tokio::pin!(stop);
    loop {
        tokio::select! {
            () = &mut stop => return,
            _ = ticks.tick() => {}
        }
        let node_names: Vec<String> = nodes
            .state()
            .iter()
            .filter_map(|n| n.metadata.name.clone())
            .collect();
        let live: Vec<String> = csinodes
            .state()
            .iter()
            .filter(|c| c.spec.drivers.iter().any(|d| d.name == driver))
            .filter_map(|c| c.metadata.name.clone())
            .filter(|n| node_names.contains(n))
            .collect();
        let actor = crate::rendezvous::rank_of(&key, &me, live.iter().map(String::as_str));
        if !*leader.borrow() || actor != Some(0) {
            missing_since.clear();
            continue;
        }
        let objects = match api.list(&ListParams::default().labels(&selector)).await {
            Ok(list) => list.items,
            Err(e) => {
                warn!(error = %describe(&e), "listing CSIStorageCapacities of other instances failed; retrying later");
                continue;
            }
        };
        let orphans = plan::orphaned(&driver, &objects, node_names.iter().map(String::as_str));
        missing_since.retain(|id, _| orphans.contains_key(id));
        let now = Instant::now();
        let due: Vec<&String> = orphans
            .keys()
            .filter(|id| {
                now.duration_since(*missing_since.entry((*id).clone()).or_insert(now)) >= grace
            })
            .collect();
        if due.is_empty() {
            continue;
        }
        // The cache said absent for the whole grace period: confirm with a live list.
        let live_nodes = match node_api.list_metadata(&ListParams::default()).await {
            Ok(list) => list
                .items
                .into_iter()
                .filter_map(|n| n.metadata.name)
                .collect::<Vec<_>>(),
            Err(e) => {
                warn!(error = %describe(&e), "listing Nodes to confirm a deleted node failed; retrying later");
                continue;
            }
        };
        let confirmed = plan::orphaned(&driver, &objects, live_nodes.iter().map(String::as_str));
        for id in due {
            let Some(names) = confirmed.get(id) else {
                continue;
            };
            let mut all_gone = true;
            for name in names {
                ctx.leadership.acting().await;
                match api.delete(name, &DeleteParams::default()).await {
                    Ok(_) => {
                        info!(object = %name, managed_by = %id, "deleted CSIStorageCapacity of an instance whose node no longer exists")
                    }
                    Err(kube::Error::Api(s)) if s.code == 404 => {}
                    Err(e) => {
                        all_gone = false;
                        warn!(object = %name, error = %describe(&e), "deleting CSIStorageCapacity of a deleted node failed; retrying later");
                    }
                }
            }
            if all_gone {
                missing_since.remove(id);
            }
        }
    }
}
