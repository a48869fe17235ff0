//! Node mode: a claim whose CreateVolume was sent to a node that has since gone away. That node's
//! instance, which owns the volume, will never come back; after the deleted-node grace period,
//! confirmed by a live GET of the Node, the volume is taken to have gone with its node (as the
//! dead-node clean-up does for PVs): a pending claim has its selected node cleared, so the
//! scheduler picks another node (whose instance creates the volume under the same name); the
//! record of a deleted claim is dropped by the resolver, so the claim does not stay Terminating.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, PersistentVolumeClaim};
use kube::Api;
use tracing::{debug, info};

use super::claim_writes::clear_selected_node;
use super::kube_err;
use super::{ProvisionError, Provisioner, claim_key};
use crate::k8s::events::{EventSpec, reference_to};
use crate::names;
use crate::runtime::queue::Action;

/// Whether a node, missing from the caches since a timer started, is gone for good.
pub(super) enum Gone {
    /// Not yet: look again after this long.
    Wait(Duration),
    /// The Node exists (its driver is not registered right now): its instance owns the volume.
    Exists,
    /// Missing for the whole grace period, and the API server confirms it.
    Confirmed,
}

/// Waits out the grace period from `since` (the caller's timer: a claim's in the claim memory,
/// an intent entry's in the resolver), then asks the API server: only a 404 counts as absence.
pub(super) async fn confirm_gone(
    state: &Provisioner,
    since: Instant,
    node: &str,
) -> Result<Gone, kube::Error> {
    let grace = state.ctx.config.deleted_node.grace_period;
    let due = crate::gone_nodes::policy::grace_deadline(since, grace, Duration::ZERO, 0);
    let now = Instant::now();
    if now < due {
        return Ok(Gone::Wait(due - now));
    }
    let found = Api::<Node>::all(state.ctx.client.clone())
        .get_opt(node)
        .await?;
    if found.is_some() {
        return Ok(Gone::Exists);
    }
    Ok(Gone::Confirmed)
}

/// The `VolumeNodeGone` message: `what` the sidecar does about it.
pub(super) fn gone_message(
    state: &Provisioner,
    node: &str,
    volume_name: &str,
    what: &str,
) -> String {
    format!(
        "node {node:?}, on which volume {volume_name} was being created for this claim, no longer exists \
         (missing for at least {}): the volume is considered gone with its node and {what}",
        crate::gofmt::format_go_duration(state.ctx.config.deleted_node.grace_period)
    )
}

/// A pending claim selected to a gone node that recorded a CreateVolume for it: once the node is
/// confirmed gone, its selected node is cleared.
pub(super) async fn clear_after_grace(
    state: &Provisioner,
    pvc: &PersistentVolumeClaim,
    node: &str,
    volume_name: &str,
) -> Result<Action, ProvisionError> {
    let key = claim_key(pvc);
    let since = state
        .memory()
        .node_missing_since(&key, node, Instant::now());
    let gone = confirm_gone(state, since, node)
        .await
        .map_err(kube_err(format!("reading node {node}")))?;
    match gone {
        Gone::Wait(left) => {
            debug!(claim = %claim_key(pvc), %node, "the node of the claim's provisioning intent is missing; waiting for the grace period");
            Ok(Action::requeue(left))
        }
        Gone::Exists => {
            state.memory().node_not_missing(&key);
            debug!(claim = %claim_key(pvc), %node, "the node of the claim's provisioning intent exists; leaving it to that node");
            Ok(Action::await_change())
        }
        Gone::Confirmed => {
            let message = gone_message(
                state,
                node,
                volume_name,
                "the selected node is removed so that the scheduler picks another node",
            );
            info!(claim = %claim_key(pvc), %node, volume = %volume_name, "{message}");
            state.ctx.events.emit(
                reference_to(pvc),
                EventSpec::warning(names::EVENT_VOLUME_NODE_GONE, message),
            );
            clear_selected_node(state, pvc).await?;
            state.memory().node_not_missing(&key);
            Ok(Action::await_change())
        }
    }
}
