//! CSI connection: the generated `csi.v1` types, the Unix-socket gRPC channel with wait/reconnect,
//! the start-up handshake (Probe, plugin info and capabilities), per-call deadlines, secret redaction
//! for logs, the `csi_sidecar_operations_seconds` metric, and how a failed call reads in messages
//! ([`rpc_error`]). What a failed call *means* is each concern's decision (`provision::classify`).
//!
//! ```text
//!  --csi-address ─► Endpoint::parse ─► connect() ─► Channel ─► handshake() ─► DriverInfo
//!                                                      └────► GrpcCsi ─► Arc<dyn CsiController>
//! ```

/// Generated CSI v1 messages, clients (`identity_client`, `controller_client`, `node_client`) and
/// servers, from `proto/csi.proto`.
#[allow(missing_docs, clippy::all)]
pub mod v1 {
    tonic::include_proto!("csi.v1");
}

pub mod client;
pub mod connect;
pub mod endpoint;
pub mod probe;
pub mod redact;

pub use client::OperationMetrics;
pub use client::{CsiController, CsiFuture, CsiResult, GrpcCsi};
pub use connect::{ConnectError, ConnectOptions, connect};
pub use endpoint::{Endpoint, EndpointError};
pub use probe::{
    ControllerCapabilities, DriverInfo, HandshakeError, HandshakeOptions, NodeInfo,
    PluginCapabilities, handshake,
};
pub use redact::{Redact, redacted};

/// A failed call as gRPC-Go prints it (`rpc error: code = NotFound desc = ...`), the text upstream's
/// events and logs carry.
pub fn rpc_error(status: &tonic::Status) -> String {
    format!(
        "rpc error: code = {:?} desc = {}",
        status.code(),
        status.message()
    )
}
