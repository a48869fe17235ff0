//! The resolver: the only clean-up path of the intent log, whichever store holds an entry. Runs at
//! start-up (finishing what an earlier leader or a crashed process left), then every
//! [`RESOLVE_EVERY`] over [`IntentLog::pending`](super::IntentLog::pending) in memory: API requests
//! only for entries that need a clean-up or a live look at a PV. See docs/intent-ledger.md.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::Api;
use kube::runtime::reflector::ObjectRef;
use tracing::{debug, info, warn};

use crate::csi::v1;
use crate::k8s::cache::key;
use crate::k8s::events::{EventSpec, reference_to};
use crate::model::claim::selected_node;
use crate::model::secrets::SecretFetchError;
use crate::model::topology::CsiNodeLookup;
use crate::names;
use crate::node_mode::ownership;
use crate::provision::controller::Provisioner;
use crate::provision::controller::execute::{create_volume, delete_volume, secret_data};
use crate::provision::controller::intents::claim_record::has_record;
use crate::provision::controller::intents::cleanup::{
    AfterReplay, CleanupStep, after_replay, cleanup_step,
};
use crate::provision::controller::intents::ledger::Entry;
use crate::provision::controller::intents::resolution::{
    self, CleanupCause, Holds, Owner, Resolution, pv_holds_entry,
};
use crate::provision::controller::intents::{Forget, Held, Pending};
use crate::provision::controller::node_gone::{Gone, confirm_gone, gone_message};
use crate::retry::{Backoff, describe};
use crate::runtime::Shutdown;

/// How often the pending entries are compared with the caches.
const RESOLVE_EVERY: Duration = Duration::from_secs(2);

/// Since when each entry's node (by volume) has been missing: the resolver's own timers, apart
/// from the claims' in the claim memory, so a claim created again under the name of one whose
/// entry waits neither shares nor resets that wait.
pub(in crate::provision::controller) type NodeClocks = HashMap<String, (String, Instant)>;

/// Resolves entries until shutdown.
pub(in crate::provision::controller) async fn run_resolver(
    state: Arc<Provisioner>,
    shutdown: Shutdown,
) {
    let p = &state.ctx.config.provisioning;
    let mut backoff = Backoff::new(p.retry_interval_start, p.retry_interval_max);
    let mut not_before: HashMap<String, Instant> = HashMap::new();
    let mut clocks = NodeClocks::new();
    let stop = shutdown.requested();
    tokio::pin!(stop);
    loop {
        let pending = state.intents.pending();
        not_before.retain(|volume, _| pending.iter().any(|p| &p.entry.volume == volume));
        clocks.retain(|volume, _| pending.iter().any(|p| &p.entry.volume == volume));
        for one in pending {
            let volume = one.entry.volume.clone();
            if not_before.get(&volume).is_some_and(|t| Instant::now() < *t) {
                continue;
            }
            match resolve_one(&state, &one, &mut clocks).await {
                Ok(()) => {
                    backoff.reset(&volume);
                    not_before.remove(&volume);
                }
                Err(Retry { message, after }) => {
                    let delay = after.unwrap_or_else(|| backoff.failed(&volume));
                    debug!(%volume, ?delay, "{message}");
                    not_before.insert(volume, Instant::now() + delay);
                }
            }
        }
        tokio::select! {
            () = &mut stop => return,
            () = tokio::time::sleep(RESOLVE_EVERY) => {}
        }
    }
}

/// An entry to look at again: after `after`, or with the retry backoff.
pub(in crate::provision::controller) struct Retry {
    message: String,
    after: Option<Duration>,
}

impl From<String> for Retry {
    fn from(message: String) -> Self {
        Self {
            message,
            after: None,
        }
    }
}

/// Resolves one entry.
pub(in crate::provision::controller) async fn resolve_one(
    state: &Provisioner,
    pending: &Pending,
    clocks: &mut NodeClocks,
) -> Result<(), Retry> {
    let entry = &pending.entry;
    let stores = &state.ctx.stores;
    // Compared with the entry only when something can tell them apart (a known id, node mode):
    // one unpacked PV, for such entries only.
    let pv_cached = stores.pvs.get(&entry.volume).is_some_and(|pv| {
        (entry.id.is_none() && own_node(state).is_none())
            || pv_holds_entry(entry, &pv.full(), own_node(state)) == Holds::Yes
    });
    let claim = stores
        .pvcs
        .get(&key(Some(&entry.namespace), &entry.claim))
        .map(|c| c.full())
        .filter(|c| c.metadata.uid.as_deref() == Some(entry.uid.as_str()));
    let owner = match (pending.held, &claim) {
        // A record's owner is its claim's selected node now, not as the pass began.
        (Held::Claim, Some(claim)) => Owner::of_record(own_node(state), selected_node(claim)),
        // The finalizer holds a claim as long as its record is on it: a claim missing from the
        // cache is behind, or the mirror is (its record removed, the claim gone).
        (Held::Claim, None) => return check_record(state, pending).await,
        _ => Owner::Me,
    };
    let resolution = resolution::resolve(entry, &owner, pv_cached, claim.as_ref());
    if resolution == Resolution::Keep {
        return Ok(());
    }
    // A worker on this volume finishes or decides it itself (and a clean-up must not race a
    // CreateVolume).
    let Some(_lock) = state.ctx.volume_locks.try_lock(&entry.volume) else {
        return Ok(());
    };
    let cached_cause = match resolution {
        Resolution::Keep => return Ok(()),
        // Left by a crash (a clean run drops its own entries): no ledger write just for these.
        Resolution::Drop => return resolved(state, pending, Forget::Stale).await,
        Resolution::Forget => {
            debug!(claim = %entry.claim_name(), volume = %entry.volume, "nothing to delete: no volume was made, or the claim is bound to it");
            return resolved(state, pending, Forget::Done).await;
        }
        Resolution::AwaitNodeGone(node) => {
            return await_node_gone(state, pending, claim.as_ref(), &node, clocks).await;
        }
        Resolution::CheckPv => None,
        Resolution::Cleanup(cause) => Some(cause),
    };
    // The caches may lag behind a PV created or a claim re-read moments ago, and in node mode
    // never hold another node's PV: this path deletes a volume, so both are live reads (rare: only
    // entries whose claim moved on or is bound to a PV not cached get here).
    let live_pv = Api::<PersistentVolume>::all(state.ctx.client.clone())
        .get_opt(&entry.volume)
        .await
        .map_err(|e| format!("reading PV {}: {}", entry.volume, describe(&e)))?;
    if let Some(pv) = live_pv {
        if pv_holds_entry(entry, &pv, own_node(state)) == Holds::Yes {
            return resolved(state, pending, Forget::Done).await;
        }
        // The PV of this name may be another node's copy (or another volume): then this entry's
        // volume is referenced by nothing. Its handle is never deleted, whatever a replay says.
        let in_use = pv.spec.and_then(|s| s.csi).map(|c| c.volume_handle);
        return cleanup_entry(
            state,
            pending,
            &CleanupCause::PvOfAnotherVolume,
            claim.as_ref(),
            in_use.as_deref(),
        )
        .await;
    }
    let Some(cause) = cached_cause else {
        // Bound to a PV that is not there (yet, or any more): the provisioning controller
        // decides; looked at again with backoff, not every pass.
        return Err(format!(
            "claim {} is bound to PV {}, which does not exist",
            entry.claim_name(),
            entry.volume
        )
        .into());
    };
    let live = live_claim(state, entry).await?;
    if pending.held == Held::Claim && !live.as_ref().is_some_and(has_record) {
        // The record is gone from the claim (or the claim with it): the mirror lagged.
        return resolved(state, pending, Forget::Vanished).await;
    }
    let cause = match resolution::resolve(entry, &owner, false, live.as_ref()) {
        Resolution::Cleanup(live_cause) => live_cause,
        // The claim still wants it after all (the cache lagged): the controller goes on.
        _ => {
            debug!(volume = %entry.volume, cached = ?cause, "intent still wanted");
            return Ok(());
        }
    };
    cleanup_entry(state, pending, &cause, live.as_ref(), None).await
}

/// The claim of `entry` as the API server has it now (`None`: gone, or another claim of its
/// name).
async fn live_claim(
    state: &Provisioner,
    entry: &Entry,
) -> Result<Option<PersistentVolumeClaim>, Retry> {
    let live = Api::<PersistentVolumeClaim>::namespaced(state.ctx.client.clone(), &entry.namespace)
        .get_opt(&entry.claim)
        .await
        .map_err(|e| format!("reading claim {}: {}", entry.claim_name(), describe(&e)))?;
    Ok(live.filter(|c| c.metadata.uid.as_deref() == Some(entry.uid.as_str())))
}

/// A claim record whose claim the cache lacks: the claim is read live. Gone, or no longer
/// carrying the record: the mirror lagged, nothing else to do. Still there with it: looked at
/// again once the cache has it.
async fn check_record(state: &Provisioner, pending: &Pending) -> Result<(), Retry> {
    let entry = &pending.entry;
    if live_claim(state, entry)
        .await?
        .as_ref()
        .is_some_and(has_record)
    {
        return Err(format!(
            "claim {} carries a provisioning intent but is not in the cache yet",
            entry.claim_name()
        )
        .into());
    }
    resolved(state, pending, Forget::Vanished).await
}

async fn resolved(state: &Provisioner, pending: &Pending, why: Forget) -> Result<(), Retry> {
    state
        .intents
        .forget(pending, why)
        .await
        .map_err(|e| e.to_string().into())
}

/// This node's name in node mode.
fn own_node(state: &Provisioner) -> Option<&str> {
    state
        .settings
        .node
        .as_ref()
        .map(|mode| mode.me.name.as_str())
}

/// Node mode: the claim of another node's entry is being deleted (or gone). One instance (the first in
/// rendezvous order of the claim among the live instances) watches that node: if it has no
/// CSINode and its Node stays absent for the deleted-node grace period, the volume went with the
/// node and the entry is dropped (else the claim would stay Terminating forever).
async fn await_node_gone(
    state: &Provisioner,
    pending: &Pending,
    claim: Option<&PersistentVolumeClaim>,
    node: &str,
    clocks: &mut NodeClocks,
) -> Result<(), Retry> {
    let entry = &pending.entry;
    let Some(csinodes) = &state.ctx.stores.csinodes else {
        return Ok(());
    };
    // Controller mode always checks; in node mode one instance of the live ones does.
    let checker = own_node(state).is_none_or(|me| {
        ownership::checks_selected_node(me, &entry.uid, &csinodes.state(), &state.settings.driver)
    });
    let lookup = CsiNodeLookup::of(
        csinodes.get(&ObjectRef::new(node)).as_deref(),
        &state.settings.driver,
    );
    if !checker || lookup != CsiNodeLookup::NotFound {
        // Another instance watches it, or the node is there: that node's instance owns it.
        clocks.remove(&entry.volume);
        return Ok(());
    }
    let now = Instant::now();
    let since = match clocks.get(&entry.volume) {
        Some((known, since)) if known == node => *since,
        // Starts now, and anew when the entry waits for another node.
        _ => {
            clocks.insert(entry.volume.clone(), (node.to_owned(), now));
            now
        }
    };
    let gone = confirm_gone(state, since, node)
        .await
        .map_err(|e| format!("reading node {node}: {}", describe(&e)))?;
    match gone {
        Gone::Wait(left) => Err(Retry {
            message: format!(
                "the node {node} of the claim's provisioning intent is missing; waiting for the grace period"
            ),
            after: Some(left),
        }),
        Gone::Exists => {
            clocks.remove(&entry.volume);
            Ok(())
        }
        Gone::Confirmed => {
            let message = gone_message(
                state,
                node,
                &entry.volume,
                "the provisioning intent is removed without calling DeleteVolume",
            );
            info!(claim = %entry.claim_name(), %node, volume = %entry.volume, "{message}");
            if let Some(claim) = claim {
                state.ctx.events.emit(
                    reference_to(claim),
                    EventSpec::warning(names::EVENT_VOLUME_NODE_GONE, message),
                );
            }
            resolved(state, pending, Forget::Done).await?;
            clocks.remove(&entry.volume);
            Ok(())
        }
    }
}

/// Replays CreateVolume (same name, with the provisioner secret) to learn the id of an abandoned
/// volume, and judges the answer ([`after_replay`]). `Err`: the secret could not be read.
async fn replay_for_id(
    state: &Provisioner,
    entry: &Entry,
    mut request: v1::CreateVolumeRequest,
) -> Result<AfterReplay, SecretFetchError> {
    if let Some(secret) = &entry.secret_ref() {
        request.secrets = secret_data(state, secret).await?;
    }
    Ok(match create_volume(state, request, false).await {
        Ok(response) => after_replay(
            &entry.volume,
            Ok(response
                .volume
                .as_ref()
                .map_or("", |v| v.volume_id.as_str())),
        ),
        Err(status) => after_replay(
            &entry.volume,
            Err((status.code(), &crate::csi::rpc_error(&status))),
        ),
    })
}

/// Deletes the volume of an abandoned entry, then drops the entry. `in_use`: the volume id a PV of
/// the entry's name references, never deleted (a replay answering it means one volume both
/// reach).
async fn cleanup_entry(
    state: &Provisioner,
    pending: &Pending,
    cause: &CleanupCause,
    claim: Option<&PersistentVolumeClaim>,
    in_use: Option<&str>,
) -> Result<(), Retry> {
    let entry = &pending.entry;
    let claim_deleted = matches!(cause, CleanupCause::ClaimGone | CleanupCause::ClaimDeleting);
    if claim_deleted && entry.may_be_kept(state.intents.recorded_here(&entry.volume)) {
        // Cannot tell a volume whose PV was never made from one a user kept (its Retain PV
        // deleted by an admin): kept, and reported (the audit lists it as a volume without a PV).
        let why = if entry.request.0.is_empty() {
            "the record of a deleted claim, written by a build that kept neither the request nor \
             the reclaim policy, cannot tell whether its volume was made or is one the user keeps"
        } else {
            "the provisioning of a deleted claim of a Retain class left no PV, and whether its PV \
             was made and then deleted by an admin cannot be told"
        };
        return keep_and_report(state, pending, &format!("{why}; {DELETE_IF_UNUSED}")).await;
    }
    let secret = entry.secret_ref();
    let report = |message: String| {
        warn!(claim = %entry.claim_name(), volume = %entry.volume, "{message}");
        if let Some(claim) = claim {
            state.ctx.events.emit(
                reference_to(claim),
                EventSpec::warning(names::EVENT_PROVISIONING_CLEANUP_FAILED, message.clone()),
            );
        }
        Retry::from(message)
    };
    let mut step = cleanup_step(entry);
    if step == CleanupStep::KeepAndReport {
        let unknown = "its record names neither the volume's id nor a request that made it, so \
                       whether it exists cannot be told";
        let advice = match (cause, in_use) {
            // The PV of its name may hold this very volume: nothing to delete on a guess.
            (CleanupCause::PvOfAnotherVolume, Some(id)) => format!(
                "PV {} references volume {id}, which may be this one: check before deleting \
                 anything on the storage backend",
                entry.volume
            ),
            _ => DELETE_IF_UNUSED.to_owned(),
        };
        return keep_and_report(state, pending, &format!("{unknown}; {advice}")).await;
    }
    if let CleanupStep::Replay(request) = step {
        let verdict = replay_for_id(state, entry, *request)
            .await
            .map_err(|e| report(e.to_string()))?;
        step = match verdict {
            AfterReplay::Delete(volume_id) => {
                // Remembered: if the delete fails, the next attempt needs no replay.
                state.intents.set_id(pending, &volume_id).await;
                CleanupStep::DeleteVolume { volume_id }
            }
            AfterReplay::NoVolumeId(message) => {
                let _ = report(message);
                CleanupStep::DropIntent
            }
            AfterReplay::VolumeAbsent => CleanupStep::DropIntent,
            AfterReplay::Retry(message) => return Err(report(message)),
        };
    }
    if let CleanupStep::DeleteVolume { volume_id } = &step
        && in_use == Some(volume_id.as_str())
    {
        info!(claim = %entry.claim_name(), volume = %entry.volume, %volume_id, "the volume is the one PV {} references (storage both nodes reach): kept", entry.volume);
        step = CleanupStep::DropIntent;
    }
    if let CleanupStep::DeleteVolume { volume_id } = &step {
        delete_volume(state, volume_id, secret.as_ref())
            .await
            .map_err(|e| {
                let whose = match cause {
                    CleanupCause::ClaimGone | CleanupCause::ClaimDeleting => {
                        "of a deleted claim".to_owned()
                    }
                    CleanupCause::BoundElsewhere(pv) => format!("of a claim bound to PV {pv}"),
                    CleanupCause::PvOfAnotherVolume => format!(
                        "created for a claim whose PV {} holds another volume",
                        entry.volume
                    ),
                };
                report(format!("error deleting volume {volume_id} {whose}: {e}"))
            })?;
        info!(claim = %entry.claim_name(), volume = %entry.volume, %volume_id, ?cause, "volume of an abandoned provisioning deleted");
    }
    resolved(state, pending, Forget::Done).await
}

/// What a kept volume's warning asks of the administrator, when no PV may hold it.
const DELETE_IF_UNUSED: &str = "delete the volume on the storage backend if it exists and nobody \
                                needs it (csi-provisioner audit lists it)";

/// Drops `pending`'s entry and reports its volume as kept (`message`: why, and what to check): a
/// `volume kept` warning and the kept-volumes counter.
async fn keep_and_report(
    state: &Provisioner,
    pending: &Pending,
    message: &str,
) -> Result<(), Retry> {
    let entry = &pending.entry;
    warn!(claim = %entry.claim_name(), volume = %entry.volume, "volume kept: {message}");
    resolved(state, pending, Forget::Done).await?;
    // Counted once the record is gone: a failed removal is retried and must not count twice.
    state.ctx.metrics.operator.intent_volumes_kept.inc();
    Ok(())
}
