//! Deletion and the deletion-protection finalizer (KEP-2644): pure decisions over PVs plus the
//! controller shell that adds/removes the finalizer and calls DeleteVolume.

pub(crate) mod controller;
pub(crate) mod plan;
