//! Reading the Secrets StorageClasses name for CSI calls. Their values go into CSI requests only,
//! never into logs, events or errors.

use std::collections::HashMap;

use k8s_openapi::api::core::v1::Secret;
use kube::{Api, Client};

/// A Secret could not be read; the message has upstream's wording and never a value.
#[derive(Debug, thiserror::Error)]
#[error(
    "error getting secret {name} in namespace {namespace}: {}",
    crate::k8s::errors::describe(source)
)]
pub(crate) struct SecretFetchError {
    /// Secret name.
    pub(crate) name: String,
    /// Secret namespace.
    pub(crate) namespace: String,
    /// The API error.
    #[source]
    pub(crate) source: kube::Error,
}

/// The data of Secret `namespace/name` as CSI wants it: key -> UTF-8 value.
pub(crate) async fn credentials(
    client: &Client,
    name: &str,
    namespace: &str,
) -> Result<HashMap<String, String>, SecretFetchError> {
    let api: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let secret = api.get(name).await.map_err(|source| SecretFetchError {
        name: name.to_owned(),
        namespace: namespace.to_owned(),
        source,
    })?;
    Ok(secret
        .data
        .unwrap_or_default()
        .into_iter()
        .map(|(k, v)| (k, String::from_utf8_lossy(&v.0).into_owned()))
        .collect())
}
