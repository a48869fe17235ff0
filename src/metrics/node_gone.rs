//! Metrics of the dead-node clean-up (our own names; upstream has no such feature):
//!
//! | name | type | meaning |
//! |---|---|---|
//! | `csi_provisioner_deleted_node_volumes_total` | counter | PVs answered as deleted because their node no longer exists (PV object removed and/or our finalizer taken off, no DeleteVolume) |
//! | `csi_provisioner_deleted_node_claims_total` | counter | PVCs deleted because the node of their bound PV no longer exists (`--deleted-node-pvc-cleanup`) |
//! | `csi_provisioner_volumes_waiting_for_missing_node` | gauge | PVs whose node is missing and whose grace period is running in this instance, as the first-ranked actor (summing over instances counts each PV once) |
//!
//! Counters are per instance; sum them over the DaemonSet. prometheus-client appends `_total`
//! to counter names itself, so they are registered without it.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// Handles to the dead-node metrics; cheap to clone (shared atomics).
#[derive(Clone, Debug, Default)]
pub(crate) struct NodeGoneMetrics {
    volumes: Counter,
    claims: Counter,
    waiting: Gauge,
}

impl NodeGoneMetrics {
    /// Creates the metrics and registers them in `registry`.
    pub(crate) fn register(registry: &mut Registry) -> Self {
        let metrics = Self::default();
        registry.register(
            "csi_provisioner_deleted_node_volumes",
            "Volumes answered as deleted because their node no longer exists",
            metrics.volumes.clone(),
        );
        registry.register(
            "csi_provisioner_deleted_node_claims",
            "Claims deleted because the node of their bound volume no longer exists \
             (--deleted-node-pvc-cleanup)",
            metrics.claims.clone(),
        );
        registry.register(
            "csi_provisioner_volumes_waiting_for_missing_node",
            "Volumes whose node is missing and whose grace period is running in this instance",
            metrics.waiting.clone(),
        );
        metrics
    }

    /// One PV answered as deleted.
    pub(crate) fn volume_answered(&self) {
        self.volumes.inc();
    }

    /// One claim deleted by the opt-in clean-up.
    pub(crate) fn claim_deleted(&self) {
        self.claims.inc();
    }

    /// Sets the waiting gauge (from [`crate::gone_nodes::tracker::NodeGoneTracker::waiting`]).
    pub(crate) fn set_waiting(&self, volumes: usize) {
        self.waiting.set(i64::try_from(volumes).unwrap_or(i64::MAX));
    }
}

#[cfg(test)]
#[path = "node_gone_tests.rs"]
mod tests;
