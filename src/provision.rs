//! Provisioning: PVC -> CreateVolume -> PV. Pure decisions (which claims, the request, secrets,
//! topology, the PV object) plus the controller shell that executes them.

pub(crate) mod classify;
pub(crate) mod controller;
pub(crate) mod plan;
pub(crate) mod pv;
pub(crate) mod quantity;
pub(crate) mod request;
pub(crate) mod snapshot_sweep;
pub(crate) mod source;
pub(crate) mod topology;
