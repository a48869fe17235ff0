//! Composition root: clients, driver handshake, controllers, HTTP server, graceful shutdown.

/// Runs the sidecar until shutdown.
pub async fn run(_config: crate::config::Config) -> anyhow::Result<()> {
    // TODO(lead): compose clients, driver handshake, controllers, HTTP server and shutdown.
    Ok(())
}
