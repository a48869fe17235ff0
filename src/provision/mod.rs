//! Provisioning: PVC -> CreateVolume -> PV. Pure decisions (which claims, the request, secrets,
//! topology, the PV object) plus the controller shell that executes them.

pub(crate) mod gofmt;
pub mod params;
pub mod secrets;
pub mod topology;
