//! Kubernetes access: the rate-limited client, watches and reflector stores, conflict-free
//! finalizer patches, error classification and the event recorder.
