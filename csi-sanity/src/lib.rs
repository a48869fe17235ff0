//! Conformance checks of a CSI driver against the spec rules the provisioner relies on.
//!
//! ```text
//!  Options ──► runner::run ──► Ctx::new (connect, wait for Probe, discover capabilities)
//!                          └─► for each selected check: needs met? ─► body ─► cleanup ─► "PASS|FAIL|SKIP name"
//! ```
//!
//! Use the binary (`csi-sanity --csi-address /path/csi.sock`) or [`runner::run`] from tests.

/// Generated CSI v1 messages and clients, from `proto/csi.proto`.
#[allow(missing_docs, clippy::all)]
pub mod csi {
    /// The `csi.v1` package.
    pub mod v1 {
        tonic::include_proto!("csi.v1");
    }
}

pub mod checks;
pub mod cli;
pub mod context;
pub mod options;
pub mod runner;

pub use options::{Options, Pattern, Secrets};
pub use runner::{Outcome, Report, RunError, run};
