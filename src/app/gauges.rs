//! The gauges counted from the caches at each scrape: the backlog (claims with an intent, volumes
//! awaiting deletion) and the operator gauges (pending claims, stuck volumes).

use std::sync::Arc;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};

use crate::k8s::cache::Lean;

use crate::model::meta::label;

/// The gauges' values at one scrape, counted in one pass over the caches (one object unpacked at
/// a time: a scrape must not hold the whole cache unpacked).
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Counts {
    /// Claims carrying our provisioning intent (see [`crate::metrics::BacklogMetrics`]).
    pub(super) claims_with_intent: i64,
    /// Volumes awaiting deletion (see [`crate::metrics::BacklogMetrics`]).
    pub(super) volumes_awaiting_deletion: i64,
    /// Claims of the driver not bound yet ([`crate::metrics::OperatorMetrics`]).
    pub(super) pending: i64,
    /// PVs of the driver Released for longer than [`crate::metrics::STUCK_AFTER`].
    pub(super) released_stuck: i64,
    /// PVs of the driver being deleted for longer than [`crate::metrics::STUCK_AFTER`].
    pub(super) terminating_stuck: i64,
}

/// [`Counts`] as of `now`. In node mode each instance counts only what is pinned to its node
/// (claims selected to it, PVs labelled with it), because other nodes' pending claims and PVs
/// without a node are in several instances' caches: the sum over the DaemonSet then counts each
/// object once.
pub(super) fn count(
    claims: &[Arc<Lean<PersistentVolumeClaim>>],
    pvs: &[Arc<Lean<PersistentVolume>>],
    driver: &str,
    node: Option<&str>,
    now: jiff::Timestamp,
) -> Counts {
    let older = |t: &jiff::Timestamp| {
        now.duration_since(*t).as_secs_f64() > crate::metrics::STUCK_AFTER.as_secs_f64()
    };
    let mut counts = Counts::default();
    for c in claims.iter().map(|c| c.full()) {
        if !crate::model::claim::is_ours(&c, driver)
            || (node.is_some() && crate::model::claim::selected_node(&c) != node)
        {
            continue;
        }
        if crate::provision::controller::intents::claim_record::has_record(&c) {
            counts.claims_with_intent += 1;
        }
        if c.metadata.deletion_timestamp.is_none()
            && c.status.as_ref().and_then(|s| s.phase.as_deref()) != Some("Bound")
        {
            counts.pending += 1;
        }
    }
    for pv in pvs.iter().map(|pv| pv.full()) {
        if node.is_some() && label(&pv.metadata, crate::names::LABEL_PV_NODE) != node {
            continue;
        }
        if crate::reclaim::plan::awaits_deletion(&pv, driver) {
            counts.volumes_awaiting_deletion += 1;
        }
        let ours = pv
            .spec
            .as_ref()
            .and_then(|s| s.csi.as_ref())
            .is_some_and(|csi| csi.driver == driver);
        if !ours {
            continue;
        }
        let status = pv.status.as_ref();
        if status.and_then(|s| s.phase.as_deref()) == Some("Released")
            && status
                .and_then(|s| s.last_phase_transition_time.as_ref())
                .is_some_and(|t| older(&t.0))
        {
            counts.released_stuck += 1;
        }
        if pv
            .metadata
            .deletion_timestamp
            .as_ref()
            .is_some_and(|t| older(&t.0))
        {
            counts.terminating_stuck += 1;
        }
    }
    counts
}

#[cfg(test)]
#[path = "gauges_tests.rs"]
mod tests;
