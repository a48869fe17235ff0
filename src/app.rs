//! Composition root: clients, driver handshake, controllers, HTTP server, graceful shutdown.
