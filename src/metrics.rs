//! Metrics registry with the upstream metric names and labels.
