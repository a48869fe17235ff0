//! Kubernetes access: the rate-limited client, watches and reflector stores, conflict-free
//! finalizer patches, error classification and the event recorder.

pub(crate) mod access;
pub mod client;
pub mod errors;
pub mod events;
pub mod patch;
pub mod secrets;
pub mod watch;
