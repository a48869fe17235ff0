//! The gauges counted from the caches at each scrape: the backlog (claims with an intent, volumes
//! awaiting deletion) and the operator gauges (pending claims, stuck volumes).

use std::sync::Arc;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};

use crate::k8s::lean::Lean;

use crate::model::meta::label;

/// The backlog gauges' values: claims carrying our provisioning intent, and volumes awaiting
/// deletion (see [`crate::metrics::BacklogMetrics`]). In node mode each instance counts only what
/// is pinned to its node (claims selected to it, PVs labelled with it), because other nodes'
/// pending claims and PVs without a node are in several instances' caches: the sum over the
/// DaemonSet then counts each object once.
pub(super) fn count_backlog(
    claims: &[Arc<Lean<PersistentVolumeClaim>>],
    pvs: &[Arc<Lean<PersistentVolume>>],
    driver: &str,
    node: Option<&str>,
) -> (i64, i64) {
    // One object unpacked at a time: a scrape must not hold the whole cache unpacked.
    let claims = claims
        .iter()
        .map(|c| c.full())
        .filter(crate::provision::controller::intents::claim_record::has_record)
        .filter(|c| crate::model::claim::is_ours(c, driver))
        .filter(|c| node.is_none() || crate::model::claim::selected_node(c) == node)
        .count();
    let volumes = pvs
        .iter()
        .map(|pv| pv.full())
        .filter(|pv| crate::reclaim::plan::awaits_deletion(pv, driver))
        .filter(|pv| node.is_none() || label(&pv.metadata, crate::names::LABEL_PV_NODE) == node)
        .count();
    let gauge = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
    (gauge(claims), gauge(volumes))
}

/// The scrape-time gauges of [`crate::metrics::OperatorMetrics`].
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct OperatorCounts {
    pub(super) pending: i64,
    pub(super) released_stuck: i64,
    pub(super) terminating_stuck: i64,
}

/// Claims of the driver not bound yet (in node mode: selected to this node), and PVs of the driver
/// Released, or being deleted, for longer than [`crate::metrics::STUCK_AFTER`] (in node mode:
/// labelled with this node), as of `now`.
pub(super) fn count_operator(
    claims: &[Arc<Lean<PersistentVolumeClaim>>],
    pvs: &[Arc<Lean<PersistentVolume>>],
    driver: &str,
    node: Option<&str>,
    now: jiff::Timestamp,
) -> OperatorCounts {
    let gauge = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
    let older = |t: &jiff::Timestamp| {
        now.duration_since(*t).as_secs_f64() > crate::metrics::STUCK_AFTER.as_secs_f64()
    };
    let pending = claims
        .iter()
        .map(|c| c.full())
        .filter(|c| crate::model::claim::is_ours(c, driver))
        .filter(|c| c.metadata.deletion_timestamp.is_none())
        .filter(|c| c.status.as_ref().and_then(|s| s.phase.as_deref()) != Some("Bound"))
        .filter(|c| node.is_none() || crate::model::claim::selected_node(c) == node)
        .count();
    let (mut released_stuck, mut terminating_stuck) = (0, 0);
    for pv in pvs.iter().map(|pv| pv.full()) {
        let ours = pv
            .spec
            .as_ref()
            .and_then(|s| s.csi.as_ref())
            .is_some_and(|csi| csi.driver == driver);
        if !ours || (node.is_some() && label(&pv.metadata, crate::names::LABEL_PV_NODE) != node) {
            continue;
        }
        let status = pv.status.as_ref();
        if status.and_then(|s| s.phase.as_deref()) == Some("Released")
            && status
                .and_then(|s| s.last_phase_transition_time.as_ref())
                .is_some_and(|t| older(&t.0))
        {
            released_stuck += 1;
        }
        if pv
            .metadata
            .deletion_timestamp
            .as_ref()
            .is_some_and(|t| older(&t.0))
        {
            terminating_stuck += 1;
        }
    }
    OperatorCounts {
        pending: gauge(pending),
        released_stuck: gauge(released_stuck),
        terminating_stuck: gauge(terminating_stuck),
    }
}

#[cfg(test)]
#[path = "gauges_tests.rs"]
mod tests;
