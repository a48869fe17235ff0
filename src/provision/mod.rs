//! Provisioning: PVC -> CreateVolume -> PV. Pure decisions (which claims, the request, secrets,
//! topology, the PV object) plus the controller shell that executes them.

pub mod classify;
pub mod controller;
pub mod intent;
pub(crate) mod memory;
pub mod params;
pub mod plan;
pub mod plan_error;
pub mod pv;
pub mod quantity;
pub mod request;
pub mod secrets;
pub mod topology;
