//! A drop-in Rust replacement for the Kubernetes CSI external-provisioner sidecar.
//!
//! ```text
//!  PVC/SC/PV watches ──► provision::plan (pure) ──► CreateVolume ──► PV (with finalizer)
//!  PV watch ─────────► reclaim::plan (pure) ────► DeleteVolume ──► PV deleted, finalizer removed
//!  node mode ────────► node::ownership / node::gone (pure) ──► the same two shells
//! ```
//!
//! Every controller is a pure decision function over typed objects plus a thin effectful shell.

pub mod app;
pub mod cli;
pub mod config;
pub mod csi;
pub(crate) mod gofmt;
pub mod http;
pub mod k8s;
pub mod leader;
pub mod metrics;
pub(crate) mod model;
pub mod names;
pub mod node;
pub mod provision;
pub mod reclaim;
pub mod retry;
pub(crate) mod runtime;
pub(crate) mod sync;
pub mod telemetry;
#[cfg(test)]
pub(crate) mod testing;
