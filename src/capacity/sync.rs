//! One sync of one (class, segment): GetCapacity, then the write the plan asks for.

use k8s_openapi::api::storage::v1::CSIStorageCapacity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::Api;
use kube::api::PostParams;
use tracing::{debug, info};

use super::plan::{self, Identity, Key, Reported, Write};
use crate::csi::v1;
use crate::retry::describe;
use crate::runtime::Leadership;

/// GetCapacity for `key`, then the write [`plan::decide`] asks for. Returns the object written.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn sync(
    leadership: &Leadership,
    api: &Api<CSIStorageCapacity>,
    csi: &dyn crate::csi::CsiController,
    key: &Key,
    parameters: std::collections::BTreeMap<String, String>,
    existing: Option<&CSIStorageCapacity>,
    identity: &Identity,
    namespace: &str,
    owner: Option<&OwnerReference>,
) -> Result<Option<CSIStorageCapacity>, String> {
    let request = v1::GetCapacityRequest {
        volume_capabilities: Vec::new(),
        parameters: parameters.into_iter().collect(),
        // An empty segment (a driver without topology keys) asks for the driver's total.
        accessible_topology: (!key.segment.is_empty()).then(|| v1::Topology {
            segments: key.segment.clone().into_iter().collect(),
        }),
    };
    let answer = csi.get_capacity(request).await.map_err(|status| {
        format!(
            "CSI GetCapacity for class {} segment {:?}: rpc error: code = {:?} desc = {}",
            key.class,
            key.segment,
            status.code(),
            status.message()
        )
    })?;
    let reported = Reported {
        available: answer.available_capacity,
        maximum_volume_size: answer.maximum_volume_size,
    };
    match plan::decide(identity, namespace, owner, key, reported, existing) {
        Write::Nothing => {
            debug!(class = %key.class, segment = ?key.segment, available = reported.available, "capacity unchanged, no write");
            Ok(None)
        }
        Write::Create(object) => {
            leadership.acting().await;
            let created = api
                .create(&PostParams::default(), &object)
                .await
                .map_err(|e| {
                    format!(
                        "create CSIStorageCapacity for class {} segment {:?}: {}",
                        key.class,
                        key.segment,
                        describe(&e)
                    )
                })?;
            info!(
                object = created.metadata.name.as_deref().unwrap_or_default(),
                class = %key.class,
                segment = ?key.segment,
                available = reported.available,
                "created CSIStorageCapacity"
            );
            Ok(Some(created))
        }
        Write::Update(object) => {
            leadership.acting().await;
            let name = object.metadata.name.clone().unwrap_or_default();
            let updated = api
                .replace(&name, &PostParams::default(), &object)
                .await
                .map_err(|e| format!("update CSIStorageCapacity {name}: {}", describe(&e)))?;
            info!(object = %name, class = %key.class, segment = ?key.segment, available = reported.available, "updated CSIStorageCapacity");
            Ok(Some(updated))
        }
    }
}
