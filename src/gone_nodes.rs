//! Volumes whose node no longer exists, in both modes: their PVs are answered as deleted (and,
//! opt-in, their claims deleted) once the node has been absent for the grace period and a live
//! lookup confirms it.
//!
//! - [`candidates`]: which volumes are considered, and why the others are not.
//! - [`policy`]: settings and timing: the grace rule [`policy::grace_deadline`], check interval,
//!   the acting instance's rendezvous rank and the fallbacks' delay.
//! - [`tracker`]: the pure per-PV state machine (what to look up, when, and what to remove).
//! - [`discover`]: where node-mode instances find the PVs of missing nodes (they do not watch
//!   other nodes' PVs).
//! - [`ledgers`]: node mode: the intent ledgers of missing nodes, deleted after the grace period.
//! - [`controller`]: the shell: passes, live confirmation, PV and claim removal.
//!
//! The provisioning controller's intents left on a missing node wait on the same grace rule.

pub(crate) mod candidates;
pub(crate) mod controller;
pub(crate) mod discover;
pub(crate) mod ledgers;
pub(crate) mod policy;
pub(crate) mod tracker;
