//! CSI connection: the generated `csi.v1` types, the Unix-socket gRPC channel with wait/reconnect,
//! the start-up handshake (Probe, plugin info and capabilities), per-call deadlines, secret redaction
//! for logs, the `csi_sidecar_operations_seconds` metric and gRPC error classification.

/// Generated CSI v1 messages, clients (`identity_client`, `controller_client`, `node_client`) and
/// servers, from `proto/csi.proto`.
#[allow(missing_docs, clippy::all)]
pub mod v1 {
    tonic::include_proto!("csi.v1");
}
