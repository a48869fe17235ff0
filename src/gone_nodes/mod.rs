//! Volumes whose node no longer exists, in both modes: their PVs are answered as deleted (and,
//! opt-in, their claims deleted) once the node has been absent for the grace period and a live
//! lookup confirms it.
//!
//! - [`tracker`]: the pure per-PV state machine (candidates, grace deadline
//!   [`tracker::grace_deadline`], the actor's rendezvous rank, what to remove).
//! - [`discover`]: where node-mode instances find the PVs of missing nodes (they do not watch
//!   other nodes' PVs).
//! - [`controller`]: the shell: passes, live confirmation, PV and claim removal.
//!
//! The provisioning controller's intents left on a missing node wait on the same grace rule.

pub mod controller;
pub(crate) mod discover;
pub mod tracker;
