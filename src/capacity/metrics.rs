//! Upstream's capacity gauges (same names, no labels), registered only with `--enable-capacity`:
//!
//! | name | meaning |
//! |---|---|
//! | `csistoragecapacities_desired_goal` | objects that should exist (classes x segments) |
//! | `csistoragecapacities_desired_current` | of those, how many exist |
//! | `csistoragecapacities_obsolete` | objects of this instance that exist and are to be deleted |
//!
//! and ours, beside them:
//!
//! | name | meaning |
//! |---|---|
//! | `csi_provisioner_capacity_queue_oldest_seconds` | how long the oldest queued sync or deletion has waited: how far the published capacity may lag behind the driver's |
//! | `csi_provisioner_capacity_poll_interval_seconds` | `--capacity-poll-interval`, so an alert can compare the lag with it |

use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// Handles to the gauges; cheap to clone. Unregistered (and so never exposed) when the feature is off.
#[derive(Clone, Debug, Default)]
pub(crate) struct CapacityMetrics {
    goal: Gauge,
    current: Gauge,
    obsolete: Gauge,
    oldest: Gauge<f64, std::sync::atomic::AtomicU64>,
    poll_interval: Gauge<f64, std::sync::atomic::AtomicU64>,
}

impl CapacityMetrics {
    /// Creates the gauges and, when `enabled`, registers them in `registry`.
    pub(crate) fn register_if(
        enabled: bool,
        poll_interval: std::time::Duration,
        registry: &mut Registry,
    ) -> Self {
        let metrics = Self::default();
        if enabled {
            metrics.poll_interval.set(poll_interval.as_secs_f64());
            registry.register(
                "csi_provisioner_capacity_queue_oldest_seconds",
                "How long the oldest queued CSIStorageCapacity sync or deletion has waited (a retry waiting out its backoff included): how far the published capacity may lag behind the driver's.",
                metrics.oldest.clone(),
            );
            registry.register(
                "csi_provisioner_capacity_poll_interval_seconds",
                "The --capacity-poll-interval, for comparing the capacity lag with it.",
                metrics.poll_interval.clone(),
            );
            registry.register(
                "csistoragecapacities_desired_goal",
                "[ALPHA] Number of CSIStorageCapacity objects that are supposed to be managed automatically.",
                metrics.goal.clone(),
            );
            registry.register(
                "csistoragecapacities_desired_current",
                "[ALPHA] Number of CSIStorageCapacity objects that exist and are supposed to be managed automatically.",
                metrics.current.clone(),
            );
            registry.register(
                "csistoragecapacities_obsolete",
                "[ALPHA] Number of CSIStorageCapacity objects that exist and will be deleted automatically. Objects that exist and may need an update are not considered obsolete and therefore not included in this value.",
                metrics.obsolete.clone(),
            );
        }
        metrics
    }

    /// Records one comparison of the desired set with the objects.
    pub(crate) fn observe(&self, goal: usize, current: usize, obsolete: usize) {
        let set = |g: &Gauge, n: usize| g.set(i64::try_from(n).unwrap_or(i64::MAX));
        set(&self.goal, goal);
        set(&self.current, current);
        set(&self.obsolete, obsolete);
    }

    /// Records how long the oldest queued item has waited.
    pub(crate) fn observe_lag(&self, oldest: std::time::Duration) {
        self.oldest.set(oldest.as_secs_f64());
    }
}
