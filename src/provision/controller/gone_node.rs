//! Node mode: a claim whose CreateVolume was in flight on a node that has since gone away. The
//! node's instance, which owns the intent, will never come back; after the deleted-node grace
//! period, confirmed by a live GET of the Node, the volume is taken to have gone with its node (as
//! the dead-node clean-up does for PVs): a deleted claim has its intent finished, so it does not
//! stay Terminating forever; a pending one has its selected node cleared, so the scheduler picks
//! another node (whose instance creates the volume under the same recorded name).

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, PersistentVolumeClaim};
use kube::Api;
use tracing::{debug, info};

use super::claim_writes::{clear_selected_node, finish_intent_read_first};
use super::report::kube_err;
use super::{ProvisionError, Provisioner, claim_key, claim_name};
use crate::k8s::events::{EventSpec, reference_to};
use crate::names;
use crate::runtime::Action;

/// [`ClaimDecision::IntentOnGoneNode`]: wait out the grace period, confirm, finish the intent.
pub(super) async fn intent_on_gone_node(
    state: &Provisioner,
    pvc: &PersistentVolumeClaim,
    node: &str,
    volume_name: &str,
) -> Result<Action, ProvisionError> {
    let grace = state.ctx.config.deleted_node.grace_period;
    let key = claim_key(pvc);
    let since = state.memory().node_missing_since(&key, Instant::now());
    let due = crate::gone_nodes::policy::grace_deadline(since, grace, Duration::ZERO, 0);
    let now = Instant::now();
    if now < due {
        debug!(claim = %claim_name(pvc), %node, "the node of the claim's provisioning intent is missing; waiting for the grace period");
        return Ok(Action::requeue(due - now));
    }
    // The cache only started the timer: only a 404 from the API server counts as absence.
    let nodes: Api<Node> = Api::all(state.ctx.client.clone());
    let found = nodes
        .get_opt(node)
        .await
        .map_err(kube_err(format!("reading node {node}")))?;
    if found.is_some() {
        // The node exists (its driver is not registered right now): its instance owns the intent.
        state.memory().node_not_missing(&key);
        debug!(claim = %claim_name(pvc), %node, "the node of the claim's provisioning intent exists; leaving it to that node");
        return Ok(Action::await_change());
    }
    let deleting = pvc.metadata.deletion_timestamp.is_some();
    let what = if deleting {
        "the provisioning intent is removed without calling DeleteVolume"
    } else {
        "the selected node is removed so that the scheduler picks another node"
    };
    let message = format!(
        "node {node:?}, on which volume {volume_name} was being created for this claim, no longer exists \
         (missing for at least {}): the volume is considered gone with its node and {what}",
        crate::gofmt::format_go_duration(grace)
    );
    info!(claim = %claim_name(pvc), %node, volume = %volume_name, "{message}");
    state.ctx.events.emit(
        reference_to(pvc),
        EventSpec::warning(names::EVENT_VOLUME_NODE_GONE, message),
    );
    if deleting {
        finish_intent_read_first(state, pvc, volume_name).await?;
    } else {
        clear_selected_node(state, pvc).await?;
    }
    state.memory().node_not_missing(&key);
    Ok(Action::await_change())
}
