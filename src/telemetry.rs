//! Logging set-up: text or JSON, `-v` levels mapped to tracing levels.
