//! The owner of our CSIStorageCapacity objects (`--capacity-ownerref-level`), looked up once at
//! start-up from the Pod `POD_NAME` in `NAMESPACE`: level 0 is the Pod, 1 its controller (read from
//! the Pod's owner references, so no permission on the parent is needed), 2 that one's controller
//! (e.g. the Deployment of a ReplicaSet), and so on. Deleting the owner then garbage-collects the
//! objects.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
use kube::{Api, Client};

use super::plan::controller_of;

/// Why no owner could be determined (fatal at start-up, as upstream).
#[derive(Debug, thiserror::Error)]
pub(crate) enum OwnerError {
    /// A GET along the chain failed.
    #[error(
        "look up owner(s) of pod: get {kind} {namespace}/{name}: {}",
        crate::retry::describe(source)
    )]
    Get {
        kind: String,
        namespace: String,
        name: String,
        #[source]
        source: kube::Error,
    },
    /// An object along the chain has no controlling owner.
    #[error(
        "look up owner(s) of pod: {api_version} {kind} {name:?} in namespace {namespace:?} has no controlling owner, cannot unwind the ownership further; lower --capacity-ownerref-level"
    )]
    NoController {
        api_version: String,
        kind: String,
        name: String,
        namespace: String,
    },
}

/// The owner reference `levels` steps up from Pod `pod` in `namespace` (`levels >= 0`).
pub(crate) async fn lookup(
    client: &Client,
    namespace: &str,
    pod: &str,
    levels: u32,
) -> Result<OwnerReference, OwnerError> {
    let (mut api_version, mut kind, mut name) = ("v1".to_owned(), "Pod".to_owned(), pod.to_owned());
    let mut levels = levels;
    loop {
        let (group, version) = match api_version.split_once('/') {
            Some((g, v)) => (g.to_owned(), v.to_owned()),
            None => (String::new(), api_version.clone()),
        };
        let resource = ApiResource::from_gvk(&GroupVersionKind::gvk(&group, &version, &kind));
        let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), namespace, &resource);
        let object = api.get(&name).await.map_err(|source| OwnerError::Get {
            kind: kind.clone(),
            namespace: namespace.to_owned(),
            name: name.clone(),
            source,
        })?;
        if levels == 0 {
            return Ok(OwnerReference {
                api_version,
                kind,
                name,
                uid: object.metadata.uid.unwrap_or_default(),
                controller: Some(true),
                block_owner_deletion: None,
            });
        }
        let refs = object.metadata.owner_references.unwrap_or_default();
        let Some(parent) = controller_of(&refs) else {
            return Err(OwnerError::NoController {
                api_version,
                kind,
                name,
                namespace: namespace.to_owned(),
            });
        };
        if levels == 1 {
            // The reference itself is enough: no GET (and no RBAC) for the parent.
            return Ok(OwnerReference {
                controller: Some(true),
                block_owner_deletion: None,
                ..parent.clone()
            });
        }
        api_version = parent.api_version.clone();
        kind = parent.kind.clone();
        name = parent.name.clone();
        levels -= 1;
    }
}
