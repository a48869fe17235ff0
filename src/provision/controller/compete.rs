//! Node mode: the competition for unselected Immediate-binding claims. Each instance waits its
//! turn, then writes its node into `selected-node` with optimistic concurrency; one instance wins.

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::ResourceExt;
use tracing::{debug, info};

use super::claim_writes::claims_api;
use super::{ProvisionError, Provisioner, claim_key, kube_err};
use crate::k8s::patch;
use crate::node_mode::ownership::{self, Recheck, recheck_before_claiming};
use crate::provision::plan::{CapacityCheck, CapacityVerdict};
use crate::retry::{ApiErrorClass, classify};
use crate::runtime::queue::Action;

/// Node mode, an unselected Immediate-binding claim: wait our turn, then try to write our node into
/// `selected-node` with optimistic concurrency; exactly one instance wins.
pub(super) async fn compete(
    state: &Provisioner,
    pvc: &Arc<PersistentVolumeClaim>,
    capacity: Option<CapacityCheck>,
) -> Result<Action, ProvisionError> {
    let Some(mode) = &state.settings.node else {
        return Ok(Action::await_change());
    };
    let key = claim_key(pvc);
    let now = Instant::now();
    let due = state.memory().compete_due(&key, now, rand::random::<f64>());
    if now < due {
        return Ok(Action::requeue(due - now));
    }
    state.memory().compete_now(&key);
    if let Some(check) = capacity
        && !has_room(state, pvc, &check).await
    {
        // Not forgotten: the next look waits longer, backing off to once per
        // --node-deployment-max-delay per claim while the claim stays unselected.
        let now = Instant::now();
        let due = state.memory().compete_due(&key, now, rand::random::<f64>());
        return Ok(Action::requeue(due.saturating_duration_since(now)));
    }
    let api = claims_api(state, pvc);
    let fresh = api
        .get_opt(&pvc.name_any())
        .await
        .map_err(kube_err(format!("reading claim {}", claim_key(pvc))))?;
    let resource_version = match recheck_before_claiming(
        fresh.as_ref(),
        pvc.metadata.uid.as_deref().unwrap_or_default(),
        &mode.me.name,
    ) {
        Recheck::Claim { resource_version } => resource_version,
        Recheck::AlreadyOurs => return Ok(Action::await_change()),
        Recheck::Abandon(why) => {
            debug!(claim = %claim_key(pvc), ?why, "not competing for claim any more");
            state.memory().stop_competing(&key);
            return Ok(Action::await_change());
        }
    };
    let patch = ownership::become_owner_patch(&mode.me.name, &resource_version);
    match patch::apply_change(&api, &pvc.name_any(), patch::Change::Merge(&patch)).await {
        Ok(_) => {
            info!(claim = %claim_key(pvc), node = %mode.me.name, "claim selected for this node");
            state.memory().stop_competing(&key);
            Ok(Action::await_change())
        }
        Err(e) if classify(&e) == ApiErrorClass::Conflict => {
            // Another instance (or another writer) got there first: look again after a longer wait.
            debug!(claim = %claim_key(pvc), "lost the race for the claim");
            Ok(Action::requeue(Duration::from_millis(1)))
        }
        Err(e) => Err(ProvisionError::Kube {
            what: format!(
                "selecting node {:?} for PVC {} failed",
                mode.me.name,
                claim_key(pvc)
            ),
            source: e,
        }),
    }
}

/// Asks the driver whether `check` fits on this node; `false` only when every answer says no.
async fn has_room(state: &Provisioner, pvc: &PersistentVolumeClaim, check: &CapacityCheck) -> bool {
    let mut answers = Vec::with_capacity(check.requests.len());
    for request in &check.requests {
        let answer = state
            .ctx
            .csi
            .get_capacity(request.clone())
            .await
            .map(|r| r.available_capacity)
            .map_err(|s| crate::csi::rpc_error(&s));
        answers.push(answer);
        if check.verdict(&answers).is_some() {
            break;
        }
    }
    match check.verdict(&answers) {
        Some(CapacityVerdict::NotEnough) => {
            debug!(claim = %claim_key(pvc), required = check.required_bytes, "not enough capacity on this node; not competing for the claim now");
            false
        }
        Some(CapacityVerdict::CheckFailed(e)) => {
            debug!(claim = %claim_key(pvc), "proceeding with becoming owner although the capacity check failed: {e}");
            true
        }
        Some(CapacityVerdict::Enough) | None => true,
    }
}
