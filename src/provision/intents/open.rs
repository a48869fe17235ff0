//! Which intent store this instance uses (the driver's Lease ledger; in node mode its node's, or
//! its journal; claim records when Leases are refused), and reading what another node recorded
//! for a claim before its selected node is cleared.

use std::time::Duration;

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::Api;
use tracing::{info, warn};

use super::IntentStore;
use crate::k8s::errors::{ApiErrorClass, classify, describe};
use crate::provision::ledger::store::Ledger;
use crate::retry::{Attempt, retry_transient};
use crate::runtime::Context;

/// The intent store of this instance, chosen once at start-up.
pub(crate) async fn open(ctx: &Context) -> IntentStore {
    let node = ctx
        .config
        .node_deployment
        .as_ref()
        .map(|n| n.node_name.clone());
    IntentStore::new(
        open_ledger(ctx).await,
        ctx.client.clone(),
        &ctx.driver.name,
        node,
    )
}

/// The intent ledger of this driver, in the leader-election namespace (where upstream's Role
/// grants Leases). Node mode: one ledger per node, written only by that node's instance, and
/// finished by the dead-node clean-up when the node is gone (`gone_nodes::ledgers`).
async fn open_ledger(ctx: &Context) -> Ledger {
    let namespace = crate::leader::ledger_namespace(&ctx.config);
    let node = ctx
        .config
        .node_deployment
        .as_ref()
        .map(|n| n.node_name.as_str());
    let base = ledger_base(ctx, node);
    let journal = ctx
        .config
        .node_deployment
        .as_ref()
        .and_then(|n| n.intent_journal.as_deref());
    if let Some(dir) = journal {
        let count = ctx.metrics.backlog.ledger_intents.clone();
        match Ledger::open_journal(dir, count).await {
            Ok(ledger) => {
                Box::pin(move_leases_into(ctx, &ledger, &namespace, &base)).await;
                return ledger;
            }
            // The Lease ledger still records every intent (and resolves what an earlier run
            // left in it), at its cost in writes.
            Err(e) => warn!("{e}; until then this node's intents go to its Lease ledger"),
        }
    }
    Ledger::open(
        ctx.client.clone(),
        &namespace,
        &base,
        node,
        ctx.metrics.backlog.ledger_intents.clone(),
    )
    .await
}

/// A node moving to the journal: the entries of its Lease ledger (an earlier run's) go into the
/// journal, then the Leases are deleted (each with its resourceVersion as precondition). One LIST
/// at start-up, retried while the API server fails; a Lease that cannot be read or deleted stays
/// (and is taken in again at the next start: its entries are resolved like the journal's).
async fn move_leases_into(ctx: &Context, ledger: &Ledger, namespace: &str, base: &str) {
    use k8s_openapi::api::coordination::v1::Lease;
    use kube::api::{DeleteParams, Preconditions};
    let api: Api<Lease> = Api::namespaced(ctx.client.clone(), namespace);
    let leases = match crate::provision::ledger::lease::list_shards(&api, base).await {
        Ok(leases) => leases,
        Err(e) => {
            warn!(namespace, ledger = %base, "cannot look for this node's intent ledger Leases to move into the journal: {}; if the node used one, grant list and delete on leases (coordination.k8s.io) until it is moved", describe(&e));
            return;
        }
    };
    let mut moved = Vec::new();
    for lease in leases {
        match crate::provision::ledger::lease::lease_entries(&lease) {
            Ok(entries) => {
                ledger.take_in(entries);
                moved.push(lease.metadata);
            }
            Err(e) => {
                warn!(lease = %lease.metadata.name.unwrap_or_default(), "{e}; left in place, repair or delete it")
            }
        }
    }
    if moved.is_empty() || !ledger.flush().await {
        return;
    }
    for meta in moved {
        let name = meta.name.unwrap_or_default();
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                resource_version: meta.resource_version,
                uid: None,
            }),
            ..DeleteParams::default()
        };
        let deleted = retry_transient(
            5,
            Duration::from_millis(200),
            Duration::from_secs(5),
            |_| {
                let (api, name, params) = (&api, &name, &params);
                async move {
                    match api.delete(name, params).await {
                        Ok(_) => Attempt::Done(Ok(())),
                        Err(e) if classify(&e) == ApiErrorClass::NotFound => Attempt::Done(Ok(())),
                        Err(e) if classify(&e).is_retryable() => Attempt::Transient {
                            error: describe(&e),
                            retry_after: classify(&e).retry_after(),
                        },
                        Err(e) => Attempt::Done(Err(describe(&e))),
                    }
                }
            },
        )
        .await;
        match deleted {
            Ok(()) => {
                info!(lease = %name, "intent ledger Lease moved into the journal and deleted")
            }
            Err(error) => {
                warn!(lease = %name, "intent ledger Lease moved into the journal but not deleted (taken in again at the next start): {error}")
            }
        }
    }
}

/// The volume name node `node` recorded for `pvc` (same UID), if any: the claim's own record, else
/// the node's Lease ledger (one LIST; a node keeping a journal cannot be read from here).
pub(crate) async fn recorded_on_node(
    ctx: &Context,
    pvc: &PersistentVolumeClaim,
    node: &str,
) -> Result<Option<String>, kube::Error> {
    if let Some(entry) = super::claim_record::entry_of(pvc) {
        return Ok(Some(entry.volume));
    }
    let namespace = crate::leader::ledger_namespace(&ctx.config);
    let base = ledger_base(ctx, Some(node));
    let entries =
        crate::provision::ledger::lease::read_ledger(&ctx.client, &namespace, &base).await?;
    let uid = pvc.metadata.uid.as_deref().unwrap_or_default();
    Ok(entries.into_iter().find(|e| e.uid == uid).map(|e| e.volume))
}

/// The ledger's name: the driver's Lease name; in node mode with the node's hash.
fn ledger_base(ctx: &Context, node: Option<&str>) -> String {
    let lease = crate::leader::decide::lease_name(&ctx.driver.name);
    match node {
        Some(node) => crate::provision::ledger::node_ledger_base(&lease, node),
        None => lease,
    }
}
