//! Kubernetes access: the rate-limited client, watches and caches, conflict-free
//! finalizer patches, error classification and the event recorder.

pub(crate) mod access;
pub(crate) mod cache;
pub(crate) mod client;
pub(crate) mod events;
pub(crate) mod patch;
pub(crate) mod served;
