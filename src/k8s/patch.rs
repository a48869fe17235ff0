//! Conflict-free finalizer and annotation patches that never depend on a stale cached copy.
