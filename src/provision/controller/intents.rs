//! The intent log: the durable record that a CreateVolume may be in flight, so that no volume
//! outlives its claim unnoticed (upstream leaks one when a claim is deleted while CreateVolume
//! hangs or the sidecar is down: its issues 486, 1469).
//!
//! [`IntentLog`] is one of two stores, chosen once at start-up ([`open`]) from the RBAC
//! self-check: a claim's path calls [`IntentLog::record`] (returns once the record is durable;
//! only then may CreateVolume be sent), [`IntentLog::set_id`] and [`IntentLog::forget`]; the
//! resolver walks [`IntentLog::pending`] and asks [`IntentLog::recorded_here`].
//!
//! - the Lease ledger ([`ledger`]): a few Leases in the sidecar's namespace (one per node
//!   in node mode), what is recorded while a write is in flight riding the next write; the
//!   default, in upstream's RBAC. Claim records an earlier run left are taken into it at
//!   start-up ([`open`]);
//! - the claim record ([`claim_record`]): a finalizer and annotations on the claim, for RBAC
//!   without Leases (the ledger cannot be listed at start-up). A Lease write refused later fails
//!   that attempt with an event naming the missing permission, as any API error does.
//!
//! The resolver ([`resolve`]) is the only clean-up path for both: it walks
//! [`IntentLog::pending`] and decides each entry with `resolution::resolve`.

use std::sync::Arc;

use k8s_openapi::api::core::v1::PersistentVolumeClaim;

use crate::k8s::patch::PatchError;
use crate::provision::controller::intents::ledger::store::{Ledger, LedgerError};
use crate::provision::controller::intents::ledger::{Entry, Removal};
use resolution::Owner;

pub(crate) mod claim_record;
pub(crate) mod cleanup;
pub(crate) mod ledger;
mod open;
pub(crate) mod resolution;
pub(in crate::provision::controller) mod resolve;

use claim_record::ClaimRecords;
pub(crate) use open::{open, recorded_on_node};

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
        crate::k8s::errors::ApiErrorClass::Forbidden => {
            "; grant the sidecar's ServiceAccount update (or patch) on persistentvolumeclaims"
        }
        _ => "; retrying",
    }
}

/// What [`IntentLog::record`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Recorded {
    /// Durable: CreateVolume may be sent.
    Durable,
    /// The claim is being deleted (claim record): nothing was started, nothing may be.
    ClaimDeleting,
}

/// An entry the resolver looks at, and who acts on it.
#[derive(Debug, Clone)]
pub(crate) struct Pending {
    /// The intent.
    pub(crate) entry: Entry,
    /// Who acts on it (for a claim record: from the claim's selected node as last seen).
    pub(crate) owner: Owner,
    /// A claim record: its owner is its claim's selected node now, and the finalizer holds the
    /// claim as long as the record is on it.
    pub(crate) on_claim: bool,
}

/// The intent log of this process, chosen once at start-up; cheap to clone.
#[derive(Clone)]
pub(crate) enum IntentLog {
    /// The Lease ledger (its committer and removal flushes are its own, see [`open`]).
    Ledger(Ledger),
    /// The claim record, without Lease RBAC.
    Claims(Arc<ClaimRecords>),
}

impl IntentLog {
    /// Records `entry` for `pvc` and returns once it is durable.
    pub(crate) async fn record(
        &self,
        pvc: &PersistentVolumeClaim,
        entry: Entry,
    ) -> Result<Recorded, IntentError> {
        match self {
            Self::Ledger(ledger) => ledger.record(entry).await.map_err(IntentError::Ledger)?,
            Self::Claims(claims) => return claims.record(pvc, &entry).await,
        }
        Ok(Recorded::Durable)
    }

    /// Remembers the volume id learned for `entry` (a retried clean-up then needs no replay).
    pub(crate) async fn set_id(&self, entry: &Entry, id: &str) {
        match self {
            Self::Ledger(ledger) => ledger.set_id(&entry.volume, id),
            Self::Claims(claims) => claims.set_id(entry, id).await,
        }
    }

    /// Drops `entry`: its PV exists, or its volume was deleted (or never made). `stale`: found so
    /// by the resolver (its PV exists): the ledger writes nothing just for it. A Retain volume's
    /// removal is written at once ([`Removal::Prompt`]), others lazily.
    pub(crate) async fn forget(&self, entry: &Entry, stale: bool) -> Result<(), IntentError> {
        match self {
            Self::Ledger(ledger) => {
                let removal = match (stale, entry.retain) {
                    (true, _) => Removal::Stale,
                    (false, true) => Removal::Prompt,
                    (false, false) => Removal::Lazy,
                };
                ledger.forget(&entry.volume, removal);
            }
            Self::Claims(claims) => claims.forget(entry).await.map_err(IntentError::Claim)?,
        }
        Ok(())
    }

    /// Every entry now, with who acts on it: the start of a resolver's pass (which also has the
    /// ledger write the removals no intent write carried since the pass before).
    pub(crate) fn pending(&self) -> Vec<Pending> {
        match self {
            Self::Ledger(ledger) => {
                ledger.flush_removals();
                let entries = ledger.entries().into_iter();
                entries
                    .map(|entry| Pending {
                        entry,
                        owner: Owner::Me,
                        on_claim: false,
                    })
                    .collect()
            }
            Self::Claims(claims) => claims.pending(),
        }
    }

    /// Whether this process recorded `volume` itself (then it alone made, or did not make, the
    /// volume's PV).
    pub(crate) fn recorded_here(&self, volume: &str) -> bool {
        match self {
            Self::Ledger(ledger) => ledger.recorded_here(volume),
            Self::Claims(claims) => claims.recorded_here(volume),
        }
    }
}
