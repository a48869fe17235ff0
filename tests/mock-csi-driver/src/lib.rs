//! A mock CSI driver (real gRPC on a Unix socket) with fault injection, for tests and demos.
//!
//! ```text
//!  CSI client ──gRPC/UDS──► service (one line per RPC) ──► Driver::call ──► controller ops ──► Store ──► state file
//!                                                          │  latency, injected errors, counts (faults)
//!  tests ──control socket (JSON lines) / MockDriverHandle──► same switches, state dump
//! ```
//!
//! - Binary: `mock-csi-driver --endpoint unix:///PATH --nodeid NODE [--topology] [--state-file F] [--control C] ...`
//!   (see `--help`); other crates' tests find it with [`process::binary_path`] and drive it with
//!   [`process::MockDriverProcess`] and [`ControlClient`].
//! - In-process: [`MockDriver::start`] serves on a socket from a dedicated thread and returns a
//!   [`MockDriverHandle`] with the same switches and [`StateDump`].

/// Generated CSI v1 messages, clients and servers, from `proto/csi.proto`.
#[allow(missing_docs, clippy::all)]
pub mod csi {
    /// The `csi.v1` package.
    pub mod v1 {
        tonic::include_proto!("csi.v1");
    }
}

pub mod cli;
pub mod client;
pub mod config;
pub mod control;
pub mod controller;
pub mod driver;
pub mod faults;
pub mod holds;
pub mod invariants;
pub mod node;
pub mod parse;
pub mod process;
pub mod requests;
pub mod rules;
pub mod server;
pub mod service;
pub mod store;

pub use client::connect;
pub use config::{CRASH_EXIT_CODE, Config, ControllerCap, FaultRule, Misbehaviour, Trigger};
pub use control::{ControlClient, ControlError, ControlRequest, ControlResponse};
pub use driver::{PoolDump, StateDump};
pub use faults::CallStats;
pub use holds::{HoldDump, HoldState, HoldWhen};
pub use requests::{RecordedCapability, RecordedCreate};
pub use server::{MockDriver, MockDriverHandle, StartError, run};
pub use store::{ContentSource, SnapshotRecord, VolumeRecord};

/// Logs to stderr, filtered by `RUST_LOG` (default `info`), as text or JSON.
pub fn init_logging(format: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = if format == "json" {
        builder.json().try_init()
    } else {
        builder.try_init()
    };
}

/// Resolves on SIGTERM or SIGINT.
pub async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) {
        (Ok(mut term), Ok(mut int)) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
        }
        // Without signal handlers the process still dies on the default action.
        _ => std::future::pending::<()>().await,
    }
}
