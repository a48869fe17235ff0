//! HTTP server on `--http-endpoint`: metrics and health endpoints.
