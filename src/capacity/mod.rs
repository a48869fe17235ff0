//! Storage capacity tracking (`--enable-capacity`): one CSIStorageCapacity object per StorageClass
//! of our driver and topology segment, holding what the driver's `GetCapacity` reports, so the
//! scheduler places pods of `WaitForFirstConsumer` claims where there is room.
//!
//! This module owns those objects and nothing else: their desired set (classes x segments, `plan`),
//! the mapping of existing objects onto it (objects an upstream sidecar created are adopted by their
//! labels, never duplicated), the writes (create, update only when a value changed, delete when a
//! class or segment went away), the owner reference (`owner`) and the shell (`controller`) that
//! polls the driver, on `--capacity-poll-interval`, on topology or class changes, and right after a
//! volume was created or deleted in a segment ([`CapacityNudge`]).

pub mod controller;
pub mod metrics;
pub mod owner;
pub mod plan;
#[cfg(test)]
mod plan_tests;

use k8s_openapi::api::core::v1::PersistentVolume;
use tokio::sync::mpsc;

/// Nudges buffered before new ones are dropped; a dropped nudge only delays a refresh to the next
/// poll, and a burst of volumes in one segment needs one refresh anyway.
const NUDGE_BUFFER: usize = 256;

/// Tells the capacity controller that a volume was created or deleted, so the objects of its
/// segments (or, without node affinity, of its class) are refreshed now rather than at the next
/// poll. Cheap to clone; a no-op when capacity tracking is off.
#[derive(Clone, Debug, Default)]
pub struct CapacityNudge(Option<mpsc::Sender<plan::Affected>>);

impl CapacityNudge {
    /// A nudge and the receiving end the controller consumes.
    pub fn channel() -> (Self, mpsc::Receiver<plan::Affected>) {
        let (tx, rx) = mpsc::channel(NUDGE_BUFFER);
        (Self(Some(tx)), rx)
    }

    /// Call after `CreateVolume` or `DeleteVolume` of `pv`'s volume succeeded. Never blocks.
    pub fn volume_changed(&self, pv: &PersistentVolume) {
        if let (Some(tx), Some(affected)) = (&self.0, plan::affected(pv)) {
            let _ = tx.try_send(affected);
        }
    }
}
