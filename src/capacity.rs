//! Storage capacity tracking (`--enable-capacity`): one CSIStorageCapacity object per StorageClass
//! of our driver and topology segment, holding what the driver's `GetCapacity` reports, so the
//! scheduler places pods of `WaitForFirstConsumer` claims where there is room.
//!
//! This module owns those objects and nothing else: their desired set (classes x segments, `plan`),
//! the mapping of existing objects onto it (objects an upstream sidecar created are adopted by their
//! labels, never duplicated), the writes (create, update only when a value changed, delete when a
//! class or segment went away), the owner reference (`owner`), the clean-up after deleted nodes in
//! node mode (`orphans`), and the shell (`controller`, one sync in `sync`) that polls the driver on
//! `--capacity-poll-interval`, on topology or class changes, and right after a volume was created
//! or deleted in a segment (as the PV watch shows it: the controllers that create and delete
//! volumes know nothing of capacity).

pub(crate) mod controller;
pub(crate) mod metrics;
pub(crate) mod orphans;
pub(crate) mod owner;
pub(crate) mod plan;
pub(crate) mod polls;
pub(crate) mod queue;
pub(crate) mod sync;
