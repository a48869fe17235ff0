//! What the API server serves of the kinds some features need, asked once at start-up, so a
//! feature whose API is missing (Kubernetes 1.20 serves neither VolumeAttributesClass nor
//! CSIStorageCapacity v1) is turned off with one message instead of a watch failing for ever.

use kube::Client;
use tracing::warn;

use crate::retry::describe;

/// What the API server serves of the storage.k8s.io/v1 kinds some features need. Kubernetes 1.20,
/// the oldest version upstream supports, serves neither.
pub(crate) struct ServedKinds {
    pub(crate) volume_attributes_class: bool,
    pub(crate) storage_capacity: bool,
}

/// One discovery call at start-up; a failed discovery assumes both are served (the features then
/// report their own errors, as before discovery existed).
pub(crate) async fn storage_kinds(client: &Client) -> ServedKinds {
    match client.list_api_group_resources("storage.k8s.io/v1").await {
        Ok(list) => {
            let serves = |kind: &str| list.resources.iter().any(|r| r.kind == kind);
            ServedKinds {
                volume_attributes_class: serves("VolumeAttributesClass"),
                storage_capacity: serves("CSIStorageCapacity"),
            }
        }
        Err(e) => {
            warn!(error = %describe(&e), "discovery of storage.k8s.io/v1 failed; assuming VolumeAttributesClass and CSIStorageCapacity are served");
            ServedKinds {
                volume_attributes_class: true,
                storage_capacity: true,
            }
        }
    }
}

/// Says once which requested features this API server cannot support and why, instead of a
/// watch that fails for ever. Upstream turns an unset VolumeAttributesClass gate off silently
/// and crash-loops or retries for the rest.
pub(crate) fn features_off(
    requested_vac: bool,
    requested_capacity: bool,
    served: &ServedKinds,
) -> Vec<&'static str> {
    let mut off = Vec::new();
    if requested_vac && !served.volume_attributes_class {
        off.push(
            "VolumeAttributesClass (the API server does not serve storage.k8s.io/v1 \
             VolumeAttributesClass, Kubernetes 1.34 and newer do; claims cannot name one here)",
        );
    }
    if requested_capacity && !served.storage_capacity {
        off.push(
            "storage capacity tracking, --enable-capacity (the API server does not serve \
             storage.k8s.io/v1 CSIStorageCapacity, Kubernetes 1.24 and newer do; no \
             CSIStorageCapacity object is written)",
        );
    }
    off
}

#[cfg(test)]
#[path = "served_tests.rs"]
mod tests;
