//! Kubernetes access: the rate-limited client, watches and caches, conflict-free
//! finalizer patches and the event recorder (what an API error means is `crate::retry`'s).

pub(crate) mod access;
pub(crate) mod cache;
pub(crate) mod client;
pub(crate) mod events;
pub(crate) mod patch;
pub(crate) mod served;
