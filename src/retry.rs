//! Per-object exponential backoff (`--retry-interval-start` .. `--retry-interval-max`).
