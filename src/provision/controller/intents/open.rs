//! Which intent log this instance uses, chosen once at start-up from the RBAC self-check (the
//! driver's Lease ledger; in node mode its node's; claim records when Leases cannot be listed),
//! what is taken into the ledger then (claim records an earlier run left, a retired node
//! journal), and reading what another node recorded for a claim before its selected node is
//! cleared.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::AtomicI64;

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use tracing::{info, warn};

use super::IntentLog;
use crate::model::claim::selected_node;
use crate::provision::controller::intents::claim_record::{ClaimRecords, records, remove_record};
use crate::provision::controller::intents::ledger::lease::read_ledger;
use crate::provision::controller::intents::ledger::store::Ledger;
use crate::provision::controller::intents::ledger::{Entry, decode, node_ledger_base};
use crate::provision::controller::intents::resolution::Owner;
use crate::runtime::Context;

/// The intent log of this instance, chosen once at start-up: the intent ledger of this driver,
/// in the leader-election namespace (where upstream's Role grants Leases), else the claim
/// record. Node mode: one ledger per node, written only by that node's instance (but for the
/// claim records taken in here), and finished by the dead-node clean-up when the node is gone
/// (`gone_nodes::ledgers`). With it, the log's own work, to run until `stop` completes: the
/// ledger's committer (nothing for claim records).
pub(crate) async fn open<S: Future<Output = ()>>(
    ctx: &Context,
    stop: S,
) -> (IntentLog, impl Future<Output = ()> + use<S>) {
    let deployment = ctx.config.node_deployment.as_ref();
    let node = deployment.map(|n| n.node_name.as_str());
    let ledger = open_ledger(ctx, node, ctx.metrics.backlog.ledger_intents.clone()).await;
    if let Some(dir) = deployment.and_then(|n| n.intent_journal.as_deref()) {
        take_in_retired_journal(ledger.as_ref(), dir).await;
    }
    if let Some(ledger) = &ledger {
        take_in_claim_records(ctx, ledger, node).await;
    }
    let committer = ledger
        .clone()
        .map(|ledger| ledger.run_committer(ctx.leadership.clone(), stop));
    let work = async move {
        if let Some(committer) = committer {
            committer.await;
        }
    };
    let log = match ledger {
        Some(ledger) => IntentLog::Ledger(ledger),
        None => IntentLog::Claims(Arc::new(ClaimRecords::new(
            ctx.client.clone(),
            &ctx.driver.name,
            ctx.stores.pvcs.clone(),
            node.map(str::to_owned),
        ))),
    };
    (log, work)
}

/// The ledger of `node` (in node mode; else the driver's), `None` when it cannot be used.
async fn open_ledger(ctx: &Context, node: Option<&str>, count: Arc<AtomicI64>) -> Option<Ledger> {
    let namespace = crate::leader::ledger_namespace(&ctx.config);
    let base = ledger_base(ctx, node);
    Ledger::open(ctx.client.clone(), &namespace, &base, node, count).await
}

/// Takes `entries` into `ledger` and writes it; whether that succeeded.
async fn written(ledger: &Ledger, entries: Vec<Entry>) -> bool {
    ledger.take_in(entries);
    ledger.flush().await
}

/// Claim records an earlier run left (it had no Lease RBAC) are taken into the ledger, one
/// shot: each record is written into the ledger of the node that owns it (this instance's;
/// in node mode another node's goes to that node's ledger, where its instance, or the dead-node
/// clean-up when the node is gone, resolves it), and only once written is it removed from its
/// claim, finalizer and all. A crash between the two leaves both: taken in again at the next
/// start, which is harmless. A record with no node selected follows a final answer of
/// CreateVolume (no volume exists): only removed.
async fn take_in_claim_records(ctx: &Context, ledger: &Ledger, node: Option<&str>) {
    let mut by_node: BTreeMap<Option<String>, Vec<Entry>> = BTreeMap::new();
    let mut done = Vec::new();
    for (entry, pvc) in records(&ctx.stores.pvcs, &ctx.driver.name) {
        match Owner::of_record(node, selected_node(&pvc)) {
            Owner::Me => by_node.entry(None).or_default().push(entry),
            Owner::Node(other) => by_node.entry(Some(other)).or_default().push(entry),
            Owner::NoNode => done.push(entry),
        }
    }
    for (owner, entries) in by_node {
        let theirs = match owner.as_deref() {
            None => Some(ledger.clone()),
            other => open_ledger(ctx, other, Arc::default()).await,
        };
        let taken = entries.clone();
        match theirs {
            Some(theirs) if written(&theirs, entries).await => done.extend(taken),
            _ => {
                warn!(node = ?owner, records = taken.len(), "the claim records of an earlier run could not be written to the Lease ledger; they are taken in again at the next start")
            }
        }
    }
    for entry in done {
        match remove_record(&ctx.client, &entry).await {
            Ok(()) => {
                info!(claim = %entry.claim_name(), volume = %entry.volume, "claim record of an earlier run taken into the Lease ledger")
            }
            Err(e) => {
                warn!(claim = %entry.claim_name(), volume = %entry.volume, "taken into the Lease ledger but not removed from the claim: {e}; taken in again at the next start")
            }
        }
    }
}

/// `--node-deployment-intent-journal` is retired: the node's intents go to its Lease ledger. What
/// an earlier version left in the journal's files is taken into that ledger, and each file is
/// renamed `*.imported` once written there (never lost: a file that cannot be read stays, and
/// one not yet written is taken in again at the next start).
async fn take_in_retired_journal(ledger: Option<&Ledger>, dir: &Path) {
    warn!(journal = %dir.display(), "--node-deployment-intent-journal is retired: this node's intents go to its Lease ledger; an intent journal left there is taken in (remove the flag once that is logged, or once no intents-*.json is left there)");
    let files = match std::fs::read_dir(dir) {
        Ok(items) => items
            .filter_map(Result::ok)
            .map(|item| item.path())
            .filter(|path| {
                path.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("intents-") && n.ends_with(".json"))
            })
            .collect::<Vec<_>>(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
        Err(e) => {
            warn!(journal = %dir.display(), "cannot read the retired intent journal: {e}; its intents are not taken in until it can be read");
            return;
        }
    };
    let (mut taken, mut entries) = (Vec::new(), Vec::new());
    for file in files {
        let read = std::fs::read_to_string(&file).map_err(|e| e.to_string());
        match read.and_then(|text| decode(&text)) {
            Ok(mut read) => {
                entries.append(&mut read);
                taken.push(file);
            }
            Err(e) => {
                warn!(file = %file.display(), "{e}; left in place (it lists volumes whose CreateVolume may have been sent): repair it, or remove it once none is left")
            }
        }
    }
    if taken.is_empty() {
        return;
    }
    let done = match ledger {
        Some(ledger) => written(ledger, entries).await,
        None => false,
    };
    if !done {
        warn!(journal = %dir.display(), "the retired intent journal's entries could not be written to the Lease ledger; they are taken in again at the next start");
        return;
    }
    for file in taken {
        let imported = file.with_extension("json.imported");
        match std::fs::rename(&file, &imported) {
            Ok(()) => {
                info!(file = %imported.display(), "retired intent journal taken into the Lease ledger")
            }
            Err(e) => {
                warn!(file = %file.display(), "taken into the Lease ledger but not renamed: {e}")
            }
        }
    }
}

/// The volume name node `node` recorded for `pvc` (same UID), if any: the claim's own record, else
/// the node's Lease ledger (one LIST).
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
    let entries = read_ledger(&ctx.client, &namespace, &base).await?;
    let uid = pvc.metadata.uid.as_deref().unwrap_or_default();
    Ok(entries.into_iter().find(|e| e.uid == uid).map(|e| e.volume))
}

/// The ledger's name: the driver's Lease name; in node mode with the node's hash.
fn ledger_base(ctx: &Context, node: Option<&str>) -> String {
    let lease = crate::leader::decide::lease_name(&ctx.driver.name);
    match node {
        Some(node) => node_ledger_base(&lease, node),
        None => lease,
    }
}
