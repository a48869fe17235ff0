//! A drop-in Rust replacement for the Kubernetes CSI external-provisioner sidecar.
//!
//! ```text
//!  PVC/SC/PV watches ──► provision::plan (pure) ──► CreateVolume ──► PV (with finalizer)
//!  PV watch ─────────► reclaim::plan (pure) ────► DeleteVolume ──► PV deleted, finalizer removed
//!  node mode ────────► node_mode::ownership / gone_nodes::tracker (pure) ──► the same two shells
//! ```
//!
//! Every controller is a pure decision function over typed objects plus a thin effectful shell.
//! See ARCHITECTURE.md; only what the binary and the end-to-end tests use is public.

// Kept here rather than in [workspace.lints]: the workspace's test tools share those lints.
#![warn(unreachable_pub, missing_docs)]

pub mod app;
pub mod audit;
pub(crate) mod capacity;
pub mod cli;
pub mod config;
pub mod csi;
pub(crate) mod gofmt;
pub(crate) mod gone_nodes;
pub(crate) mod host;
pub(crate) mod http;
pub(crate) mod k8s;
pub(crate) mod leader;
pub(crate) mod metrics;
pub(crate) mod migration;
pub(crate) mod model;
pub mod names;
pub(crate) mod node_mode;
pub(crate) mod pprof;
pub(crate) mod provision;
pub(crate) mod reclaim;
pub mod rendezvous;
pub(crate) mod retry;
pub(crate) mod runtime;
pub(crate) mod sync;
pub mod telemetry;
#[cfg(test)]
pub(crate) mod testing;
pub(crate) mod unused;
