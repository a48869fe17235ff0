//! CSI connection: the generated `csi.v1` types, the Unix-socket gRPC channel with wait/reconnect,
//! the start-up handshake (Probe, plugin info and capabilities), per-call deadlines, secret redaction
//! for logs, the `csi_sidecar_operations_seconds` metric and gRPC error classification.
