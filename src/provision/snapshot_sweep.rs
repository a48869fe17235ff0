//! Upstream's snapshot orphan sweep (`--snapshot-orphan-sweep-interval`): VolumeSnapshots that
//! carry our snapshot-source finalizer although no pending claim restores from them (a restore
//! whose claim was deleted mid-way, a crash between adding and removing it) get it removed, so a
//! snapshot is never kept from deletion by a finalizer nobody will lift.
//!
//! [`orphans`] is the decision; [`run`] lists VolumeSnapshots every interval (a paged LIST: they
//! are not cached) and removes the finalizer with an Update, as upstream.
//!
//! In node mode (where upstream sweeps from every node) one instance sweeps per interval: the first
//! in rendezvous order of [`SWEEP_KEY`] among the nodes whose CSINode lists the driver, so the
//! cluster sees one LIST per interval, not one per node. Its claim cache holds only the claims it
//! may act on, so it reads the pending claims with a paged LIST instead: a snapshot restored by a
//! claim it does not cache must keep its finalizer.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::api::{DynamicObject, ListParams, PostParams};
use kube::{Api, ResourceExt};
use tracing::{debug, info, warn};

use super::source::{SNAPSHOT_SOURCE_FINALIZER, SourceRef, source_ref};
use crate::model::topology::live_instances;
use crate::retry::describe;
use crate::runtime::{Context, Shutdown};

/// The rendezvous key choosing the node-mode instance that sweeps.
const SWEEP_KEY: &str = "snapshot-orphan-sweep";

/// `namespace/name` of the snapshots that keep their finalizer: sources of claims still Pending
/// (or without a phase), as upstream counts them.
pub(crate) fn referenced<'a>(
    claims: impl IntoIterator<Item = &'a PersistentVolumeClaim>,
) -> BTreeSet<String> {
    claims
        .into_iter()
        .filter(|c| {
            let phase = c.status.as_ref().and_then(|s| s.phase.as_deref());
            phase.is_none_or(|p| p.is_empty() || p == "Pending")
        })
        .filter_map(|c| match source_ref(c)? {
            SourceRef::Snapshot { namespace, name } => Some(format!("{namespace}/{name}")),
            SourceRef::Claim { .. } => None,
        })
        .collect()
}

/// The snapshots of `snapshots` (namespace, name, finalizers) to release: carrying our finalizer
/// and not in `referenced`.
pub(crate) fn orphans<'a>(
    snapshots: impl IntoIterator<Item = (&'a str, &'a str, &'a [String])>,
    referenced: &BTreeSet<String>,
) -> Vec<(String, String)> {
    snapshots
        .into_iter()
        .filter(|(_, _, finalizers)| finalizers.iter().any(|f| f == SNAPSHOT_SOURCE_FINALIZER))
        .filter(|(ns, name, _)| !referenced.contains(&format!("{ns}/{name}")))
        .map(|(ns, name, _)| (ns.to_owned(), name.to_owned()))
        .collect()
}

/// Runs the sweep every `interval` until shutdown. Off when the driver cannot take snapshots, and
/// for good when listing VolumeSnapshots is forbidden or the API is not served (as upstream).
pub(crate) async fn run(ctx: Arc<Context>, interval: Duration, shutdown: Shutdown) {
    if !ctx.driver.controller.create_delete_snapshot {
        return;
    }
    let all: Api<DynamicObject> =
        Api::all_with(ctx.client.clone(), &super::source::apis::volume_snapshots());
    loop {
        tokio::select! {
            () = tokio::time::sleep(interval) => {}
            () = shutdown.clone().requested() => return,
        }
        if !sweep(&ctx, &all).await {
            return;
        }
    }
}

/// Whether this instance sweeps this round: always in controller mode, and with leader election
/// (only the leader runs the controllers); otherwise in node mode only the first live instance in
/// rendezvous order (none when the CSINode cache is not there).
fn sweeps_here(ctx: &Context) -> bool {
    let Some(node) = &ctx.config.node_deployment else {
        return true;
    };
    if ctx.config.leader_election.is_some() {
        return true;
    }
    let Some(csinodes) = &ctx.stores.csinodes else {
        return false;
    };
    let live = live_instances(csinodes.state().iter().map(AsRef::as_ref), &ctx.driver.name);
    crate::rendezvous::rank_of(SWEEP_KEY, &node.node_name, live.iter().map(String::as_str))
        == Some(0)
}

/// The snapshots pending claims restore from ([`referenced`]): from the cache in controller mode,
/// from a paged LIST in node mode (its cache is scoped), each page reduced as it arrives so a
/// node's instance never holds every claim of the cluster; `None` when the LIST fails (nothing is
/// released then).
async fn referenced_now(ctx: &Context) -> Option<BTreeSet<String>> {
    if ctx.config.node_deployment.is_none() {
        let claims: Vec<PersistentVolumeClaim> =
            ctx.stores.pvcs.state().iter().map(|c| c.full()).collect();
        return Some(referenced(&claims));
    }
    let api: Api<PersistentVolumeClaim> = Api::all(ctx.client.clone());
    let mut keep = BTreeSet::new();
    let mut params = ListParams::default().limit(500);
    loop {
        match api.list(&params).await {
            Ok(page) => {
                keep.extend(referenced(&page.items));
                match page.metadata.continue_.filter(|c| !c.is_empty()) {
                    Some(token) => params = params.continue_token(&token),
                    None => return Some(keep),
                }
            }
            Err(e) => {
                // Upstream would treat every finalizer as orphaned here; keeping them is safe.
                warn!(error = %describe(&e), "listing claims for the snapshot orphan sweep failed; retrying at the next interval");
                return None;
            }
        }
    }
}

/// One pass; `false` when the sweep should stop for good.
async fn sweep(ctx: &Context, all: &Api<DynamicObject>) -> bool {
    if !sweeps_here(ctx) {
        return true;
    }
    let mut snapshots = Vec::new();
    let mut params = ListParams::default().limit(500);
    loop {
        match all.list(&params).await {
            Ok(page) => {
                // Only snapshots carrying our finalizer can be released: keep no others.
                snapshots.extend(page.items.into_iter().filter(|s| {
                    s.metadata
                        .finalizers
                        .as_ref()
                        .is_some_and(|f| f.iter().any(|f| f == SNAPSHOT_SOURCE_FINALIZER))
                }));
                match page.metadata.continue_.filter(|c| !c.is_empty()) {
                    Some(token) => params = params.continue_token(&token),
                    None => break,
                }
            }
            Err(kube::Error::Api(s)) if s.code == 403 || s.code == 404 => {
                info!(
                    code = s.code,
                    "VolumeSnapshots cannot be listed; the snapshot orphan sweep is off"
                );
                return false;
            }
            Err(e) => {
                warn!(error = %describe(&e), "listing VolumeSnapshots for the orphan sweep failed; retrying at the next interval");
                return true;
            }
        }
    }
    let Some(keep) = referenced_now(ctx).await else {
        return true;
    };
    let empty = Vec::new();
    let listed = snapshots.iter().map(|s| {
        let finalizers = s.metadata.finalizers.as_ref().unwrap_or(&empty);
        (
            s.metadata.namespace.as_deref().unwrap_or_default(),
            s.metadata.name.as_deref().unwrap_or_default(),
            finalizers.as_slice(),
        )
    });
    for (namespace, name) in orphans(listed, &keep) {
        let Some(mut snapshot) = snapshots
            .iter()
            .find(|s| s.namespace().as_deref() == Some(namespace.as_str()) && s.name_any() == name)
            .cloned()
        else {
            continue;
        };
        if let Some(f) = snapshot.metadata.finalizers.as_mut() {
            f.retain(|f| f != SNAPSHOT_SOURCE_FINALIZER);
        }
        let api: Api<DynamicObject> = Api::namespaced_with(
            ctx.client.clone(),
            &namespace,
            &super::source::apis::volume_snapshots(),
        );
        // Conflicts, NotFound and Forbidden are logged; the next sweep tries again (upstream).
        match api.replace(&name, &PostParams::default(), &snapshot).await {
            Ok(_) => {
                info!(snapshot = %format!("{namespace}/{name}"), "snapshot-source finalizer removed: no pending claim restores from it")
            }
            Err(e) => {
                debug!(snapshot = %format!("{namespace}/{name}"), error = %describe(&e), "removing an orphaned snapshot-source finalizer failed; retrying at the next sweep")
            }
        }
    }
    true
}

#[cfg(test)]
#[path = "snapshot_sweep_tests.rs"]
mod tests;
