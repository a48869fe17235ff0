//! Which intent log this instance uses (the driver's Lease ledger; in node mode its node's;
//! claim records when Leases cannot be listed at start-up), and reading what another node
//! recorded for a claim before its selected node is cleared.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use tracing::{info, warn};

use super::claim_record::ClaimRecords;
use super::{IntentLog, Journal};
use crate::k8s::cache::Lean;
use crate::provision::controller::intents::ledger::store::Ledger;
use crate::provision::controller::intents::ledger::store::read_ledger;
use crate::provision::controller::intents::ledger::{Entry, decode, node_ledger_base};
use crate::runtime::Context;

/// The intent log of this instance, chosen once at start-up: the intent ledger of this driver,
/// in the leader-election namespace (where upstream's Role grants Leases), else the claim record.
/// Node mode: one ledger per node, written only by that node's instance, and finished by the
/// dead-node clean-up when the node is gone (`gone_nodes::ledgers`). With it, what the log needs
/// run beside it: the claim watch `pvcs`, passed on as it comes after the claim records it
/// carries are taken in (the records an earlier run left are the resolver's to finish whichever
/// store is chosen), and the ledger's committer, until `stop` completes.
pub(crate) async fn open<C, S>(
    ctx: &Context,
    pvcs: C,
    stop: S,
) -> (
    IntentLog,
    impl Stream<Item = C::Item> + use<C, S>,
    impl Future<Output = ()> + use<C, S>,
)
where
    C: Stream<Item = Arc<Lean<PersistentVolumeClaim>>>,
    S: Future<Output = ()>,
{
    let deployment = ctx.config.node_deployment.as_ref();
    let node = deployment.map(|n| n.node_name.as_str());
    let ledger = Ledger::open(
        ctx.client.clone(),
        &crate::leader::ledger_namespace(&ctx.config),
        &ledger_base(ctx, node),
        node,
        ctx.metrics.backlog.ledger_intents.clone(),
    )
    .await;
    let (retired, files) = match deployment.and_then(|n| n.intent_journal.as_deref()) {
        Some(dir) => take_in_retired_journal(ledger.as_ref(), dir).await,
        None => Default::default(),
    };
    let claims = Arc::new(ClaimRecords::new(ctx.client.clone(), &ctx.driver.name));
    let mirror = claims.clone();
    let pvcs = pvcs.inspect(move |claim| mirror.observe_cached(claim));
    let committer = ledger
        .clone()
        .map(|ledger| ledger.run_committer(ctx.leadership.clone(), stop));
    let committer = async move {
        if let Some(committer) = committer {
            committer.await;
        }
    };
    let journal = Journal::new(retired, files, ctx.metrics.backlog.ledger_intents.clone());
    let log = IntentLog::new(ledger, claims, journal);
    (log, pvcs, committer)
}

/// `--node-deployment-intent-journal` is retired: the node's intents go to its Lease ledger. What
/// an earlier version left in the journal's files is taken into that ledger, and each file is
/// renamed `*.imported` once written there (never lost: a file that cannot be read stays, and
/// one not yet written is taken in again at the next start). Without a ledger (Leases refused)
/// the entries are returned with their files, for the resolver to finish from memory in this run
/// (the files are renamed `*.resolved` once it has).
async fn take_in_retired_journal(
    ledger: Option<&Ledger>,
    dir: &Path,
) -> (Vec<Entry>, Vec<PathBuf>) {
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
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Default::default(),
        Err(e) => {
            warn!(journal = %dir.display(), "cannot read the retired intent journal: {e}; its intents are not taken in until it can be read");
            return Default::default();
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
        return Default::default();
    }
    let Some(ledger) = ledger else {
        warn!(journal = %dir.display(), "the retired intent journal's entries cannot be written to a Lease ledger (Leases are not granted): they are resolved from memory in this run, and the files renamed *.resolved once they are");
        return (entries, taken);
    };
    ledger.take_in(entries);
    if !ledger.flush().await {
        warn!(journal = %dir.display(), "the retired intent journal's entries could not be written to the Lease ledger; they are taken in again at the next start");
        return Default::default();
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
    Default::default()
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
