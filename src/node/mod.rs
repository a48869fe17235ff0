//! Node ownership in node-deployment mode, and volumes whose node no longer exists.
//!
//! The decisions are pure (no API calls, no clocks read, no tasks); two thin shells execute them:
//! [`controller`] (the dead-node clean-up) and [`watches`] (node-mode watch set-up).
//!
//! - [`ownership`]: which claims this instance provisions (upstream `checkNode`), the immediate-binding
//!   competition, clearing a selected node that has no instance of our driver, and which PVs this
//!   instance may delete.
//! - [`scope`]: what each node-mode instance lists and watches (label and field selectors, metadata
//!   stripping, the interesting-claims index) so its memory does not grow with the cluster.
//! - [`locate`]: where a volume lives (the node its affinity pins or its annotations record) and
//!   how to look that node up.
//! - [`gone`]: the per-PV state machine that answers volumes of deleted nodes as deleted, safely.
//! - [`rendezvous`]: deterministic choice of one acting instance among many (highest random weight).
//! - [`metrics`]: the dead-node metrics.
//! - [`controller`]: the dead-node shell (passes, live confirmation, PV and claim removal).
//! - [`watches`]: the scoped watches of a node-mode instance.

pub mod controller;
pub(crate) mod discover;
pub mod gone;
pub mod locate;
pub mod ownership;
pub mod rendezvous;
pub mod scope;
pub mod watches;
