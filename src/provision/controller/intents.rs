//! The intent log: the durable record that a CreateVolume may be in flight, so that no volume
//! outlives its claim unnoticed (upstream issues 486, 1469). One interface ([`IntentLog`]) over the
//! store [`open`] chooses once: the Lease [`ledger`], else the [`claim_record`]; the resolver
//! ([`resolve`]) is the only clean-up path for both. See docs/intent-ledger.md.

use std::path::Path;
use std::sync::Arc;

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use tracing::warn;

use crate::k8s::cache::Lean;
use crate::k8s::patch::PatchError;
use crate::provision::controller::intents::ledger::{
    Entry, Ledger, LedgerError, Removal, decode, node_ledger_base, read_ledger,
};
use crate::runtime::Context;

pub(crate) mod claim_record;
pub(crate) mod cleanup;
pub(crate) mod ledger;
pub(crate) mod resolution;
pub(in crate::provision::controller) mod resolve;

use claim_record::ClaimRecords;

/// Why an intent was not recorded. `Display` is the text of the claim's event.
#[derive(Debug, thiserror::Error)]
pub(crate) enum IntentError {
    /// The ledger write failed.
    #[error("no volume is created until the provisioning intent is recorded, and that failed: {0}")]
    Ledger(LedgerError),
    /// The claim write failed.
    #[error(
        "no volume is created until the provisioning intent is recorded on the claim, and that failed: {0}{hint}",
        hint = claim_hint(.0)
    )]
    Claim(PatchError),
}

fn claim_hint(error: &PatchError) -> &'static str {
    match error.class {
        crate::retry::ApiErrorClass::Forbidden => {
            "; grant the sidecar's ServiceAccount update (or patch) on persistentvolumeclaims"
        }
        _ => "; retrying",
    }
}

/// What [`IntentLog::record`] found.
#[derive(Debug, Clone)]
pub(crate) enum Recorded {
    /// Durable: CreateVolume may be sent. The handle names the store that holds it.
    Durable(Box<Pending>),
    /// The claim is being deleted (claim record): nothing was started, nothing may be.
    ClaimDeleting,
}

/// An entry and which store holds it: what [`IntentLog::pending`] lists and
/// [`IntentLog::record`] returns, and what [`IntentLog::set_id`] and [`IntentLog::forget`] act on.
#[derive(Debug, Clone)]
pub(crate) struct Pending {
    /// The intent.
    pub(crate) entry: Entry,
    /// Which store holds it.
    pub(crate) held: Held,
}

/// Which store holds an entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Held {
    /// The Lease ledger.
    Ledger,
    /// The claim record.
    Claim,
    /// The Lease ledger, and the claim still carries an earlier run's record of the same volume
    /// (a handle [`IntentLog::record`] returns): both go together.
    LedgerAndClaim,
}

/// Why an entry is dropped ([`IntentLog::forget`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Forget {
    /// Its PV was made, or its volume deleted (or never made): a ledger entry's removal written
    /// lazily, a Retain volume's at once ([`Removal::Prompt`]); a claim record's at once.
    Done,
    /// The resolver found its PV exists (left by a crash): the ledger writes nothing just for it.
    Stale,
    /// The resolver found the claim that carried the record gone, or no longer carrying it (the
    /// mirror lagged): nothing to write. Never drops a ledger entry.
    Vanished,
}

/// The intent log of this process: the store new intents go to, chosen once at start-up
/// ([`open`]), and the claim records already on claims (an earlier run's, or this one's when
/// Leases are not granted), which the resolver finishes. Cheap to clone.
#[derive(Clone)]
pub(crate) struct IntentLog {
    /// `None`: Leases were refused at start-up, new intents go on their claims.
    ledger: Option<Ledger>,
    claims: Arc<ClaimRecords>,
}

impl IntentLog {
    /// Records `entry` for `pvc` and returns once it is durable: only then may CreateVolume be
    /// sent.
    pub(crate) async fn record(
        &self,
        pvc: &PersistentVolumeClaim,
        entry: Entry,
    ) -> Result<Recorded, IntentError> {
        let held = match &self.ledger {
            Some(ledger) => {
                ledger
                    .record(entry.clone())
                    .await
                    .map_err(IntentError::Ledger)?;
                if claim_record::entry_of(pvc).is_some_and(|e| e.volume == entry.volume) {
                    Held::LedgerAndClaim
                } else {
                    Held::Ledger
                }
            }
            // No ledger (RBAC at start-up): on the claim.
            None => match self.claims.record(pvc, &entry).await {
                Ok(true) => Held::Claim,
                Ok(false) => return Ok(Recorded::ClaimDeleting),
                Err(e) => return Err(IntentError::Claim(e)),
            },
        };
        Ok(Recorded::Durable(Box::new(Pending { entry, held })))
    }

    /// Remembers the volume id learned for `pending` (a retried clean-up then needs no replay).
    pub(crate) async fn set_id(&self, pending: &Pending, id: &str) {
        let entry = &pending.entry;
        if let (Held::Ledger | Held::LedgerAndClaim, Some(ledger)) = (pending.held, &self.ledger) {
            ledger.set_id(&entry.volume, id);
        }
        if let Held::Claim | Held::LedgerAndClaim = pending.held {
            self.claims.set_id(entry, id).await;
        }
    }

    /// Drops `pending` from the store holding it, as `why` says.
    pub(crate) async fn forget(&self, pending: &Pending, why: Forget) -> Result<(), IntentError> {
        let entry = &pending.entry;
        let removal = match why {
            Forget::Done if entry.retain => Removal::Prompt,
            Forget::Done => Removal::Lazy,
            Forget::Stale => Removal::Stale,
            Forget::Vanished => {
                if pending.held == Held::Claim {
                    self.claims.unmirror(entry);
                }
                return Ok(());
            }
        };
        if let (Held::Ledger | Held::LedgerAndClaim, Some(ledger)) = (pending.held, &self.ledger) {
            ledger.forget(&entry.volume, removal);
        }
        if let Held::Claim | Held::LedgerAndClaim = pending.held {
            self.claims
                .forget(entry)
                .await
                .map_err(IntentError::Claim)?;
        }
        Ok(())
    }

    /// Every entry now: the start of a resolver's pass (the only caller, once
    /// a pass), which also has the ledger write the removals no intent write carried since the
    /// pass before.
    pub(crate) fn pending(&self) -> Vec<Pending> {
        let entries = self.ledger.as_ref().map(|ledger| {
            ledger.flush_removals();
            ledger.entries()
        });
        let ledger = entries.into_iter().flatten().map(|entry| Pending {
            entry,
            held: Held::Ledger,
        });
        let claims = self.claims.pending().into_iter().map(|entry| Pending {
            entry,
            held: Held::Claim,
        });
        ledger.chain(claims).collect()
    }

    /// Whether this process recorded `volume` itself (then it alone made, or did not make, the
    /// volume's PV).
    pub(crate) fn recorded_here(&self, volume: &str) -> bool {
        self.ledger
            .as_ref()
            .is_some_and(|l| l.recorded_here(volume))
            || self.claims.recorded_here(volume)
    }
}

/// The intent log, chosen once at start-up: this driver's ledger (this node's in node mode,
/// finished by `gone_nodes::ledgers` once the node is gone), else the claim record; with the claim
/// watch `pvcs`, mirrored into the claim records as it passes, and the committer, until `stop`.
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
    if let Some(dir) = deployment.and_then(|n| n.intent_journal.as_deref()) {
        report_retired_journal(dir);
    }
    let claims = Arc::new(ClaimRecords::new(ctx.client.clone(), &ctx.driver.name));
    let mirror = claims.clone();
    let pvcs = pvcs.inspect(move |claim| mirror.observe_cached(claim));
    let committer = ledger
        .clone()
        .map(|ledger| ledger.run_committer(ctx.leadership.clone(), stop));
    let committer = async move {
        futures::future::OptionFuture::from(committer).await;
    };
    (IntentLog { ledger, claims }, pvcs, committer)
}

/// `--node-deployment-intent-journal` is retired and ignored (issue 40): the node's intents go to
/// its Lease ledger. Volumes an earlier version's journal in `dir` lists are not resolved by this
/// one: they are kept, and named in a warning, for the operator to check.
fn report_retired_journal(dir: &Path) {
    let retired = "--node-deployment-intent-journal is retired and ignored";
    let items = match std::fs::read_dir(dir) {
        Ok(items) => Some(items),
        // No directory: nothing listed, the same warning as an empty one.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => {
            warn!(journal = %dir.display(), "{retired}, and its directory cannot be read ({e}): any intents-*.json there list volumes whose CreateVolume may have been sent; check them before removing the flag");
            return;
        }
    };
    let (mut volumes, mut unreadable) = (Vec::new(), 0);
    for file in items
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .map(|item| item.path())
    {
        let name = file
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        if name.starts_with("intents-") && name.ends_with(".json") {
            let read = std::fs::read_to_string(&file).map_err(|e| e.to_string());
            match read.and_then(|text| decode(&text)) {
                Ok(entries) => volumes.extend(entries.into_iter().map(|e| e.volume)),
                Err(e) => {
                    warn!(file = %file.display(), "retired intent journal unreadable: {e}");
                    unreadable += 1;
                }
            }
        }
    }
    if volumes.is_empty() && unreadable == 0 {
        warn!(journal = %dir.display(), "{retired}: this node's intents go to its Lease ledger; remove the flag");
    } else {
        warn!(journal = %dir.display(), volumes = %volumes.join(","), unreadable, "{retired}: the retired intent journal lists volumes whose CreateVolume may have been sent; they are not resolved by this version: check each (with a driver that lists volumes, `csi-provisioner audit` names a volume no PV holds as leaked), then remove the journal and the flag");
    }
}

/// The volume name node `node` recorded for `pvc` (same UID), if any: the claim's own record, else
/// the node's Lease ledger (one LIST).
pub(crate) async fn recorded_on_node(
    ctx: &Context,
    pvc: &PersistentVolumeClaim,
    node: &str,
) -> Result<Option<String>, kube::Error> {
    if let Some(entry) = claim_record::entry_of(pvc) {
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

#[cfg(test)]
#[path = "intents_tests.rs"]
mod tests;
