//! The ledger's Lease objects: a shard's entries read from and written into a Lease, and reading
//! another ledger whole (another node's, before clearing a claim's selected node).

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::ListParams;
use kube::{Api, Client};
use tracing::warn;

use crate::k8s::errors::{ApiErrorClass, classify, describe};

use super::{ENTRIES_ANNOTATION, Entry, LEDGER_LABEL, NODE_ANNOTATION, NODE_LEDGER_LABEL, decode};

pub(super) fn set_lease(leases: &mut Vec<Option<Lease>>, shard: usize, lease: Lease) {
    if leases.len() <= shard {
        leases.resize(shard + 1, None);
    }
    leases[shard] = Some(lease);
}

/// The entries a ledger Lease holds (none when it has no annotation yet).
pub(crate) fn lease_entries(lease: &Lease) -> Result<Vec<Entry>, String> {
    match lease
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ENTRIES_ANNOTATION))
    {
        Some(value) => decode(value),
        None => Ok(Vec::new()),
    }
}

/// The Lease to write for a shard: the last one seen with new content, or a new one.
pub(super) fn with_entries(
    known: Option<Lease>,
    name: &str,
    base: &str,
    node: Option<&str>,
    content: &str,
) -> Lease {
    let mut lease = known.unwrap_or_else(|| {
        let mut labels: std::collections::BTreeMap<String, String> = [
            (LEDGER_LABEL.to_owned(), base.to_owned()),
            (
                "app.kubernetes.io/managed-by".to_owned(),
                "csi-provisioner-rs".to_owned(),
            ),
        ]
        .into();
        let mut annotations = std::collections::BTreeMap::new();
        if let Some(node) = node {
            labels.insert(NODE_LEDGER_LABEL.to_owned(), base.to_owned());
            annotations.insert(NODE_ANNOTATION.to_owned(), node.to_owned());
        }
        Lease {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                labels: Some(labels),
                annotations: Some(annotations),
                ..ObjectMeta::default()
            },
            spec: None,
        }
    });
    lease
        .metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert(ENTRIES_ANNOTATION.to_owned(), content.to_owned());
    lease
}

/// Every entry of ledger `base` in `namespace` as the API server has it (another node's ledger,
/// read by the instance that would clear a claim's selected node). Unreadable shards are skipped
/// with a warning: their owner repairs or deletes them.
pub(crate) async fn read_ledger(
    client: &Client,
    namespace: &str,
    base: &str,
) -> Result<Vec<Entry>, kube::Error> {
    let api: Api<Lease> = Api::namespaced(client.clone(), namespace);
    let list = api
        .list(&ListParams::default().labels(&format!("{LEDGER_LABEL}={base}")))
        .await?;
    let mut entries = Vec::new();
    for lease in list.items {
        match lease_entries(&lease) {
            Ok(mut e) => entries.append(&mut e),
            Err(e) => warn!(lease = %lease.metadata.name.unwrap_or_default(), "{e}"),
        }
    }
    Ok(entries)
}

/// The Leases of ledger `base` in `api`'s namespace, retrying (with backoff, without end) every
/// failure but a refusal, which is returned: what to grant depends on the caller.
pub(crate) async fn list_shards(api: &Api<Lease>, base: &str) -> Result<Vec<Lease>, kube::Error> {
    let selector = format!("{LEDGER_LABEL}={base}");
    let mut pause = std::time::Duration::from_millis(200);
    loop {
        match api.list(&ListParams::default().labels(&selector)).await {
            Ok(list) => return Ok(list.items),
            Err(e) if classify(&e) == ApiErrorClass::Forbidden => return Err(e),
            Err(e) => {
                warn!(ledger = %base, "reading the intent ledger's Leases failed, retrying: {}", describe(&e));
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(std::time::Duration::from_secs(10));
            }
        }
    }
}
