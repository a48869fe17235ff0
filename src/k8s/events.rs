//! Event recorder: core/v1 Events with upstream reasons, messages and source component, aggregated on repeat.
