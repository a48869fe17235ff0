//! The intent store: the durable record that a CreateVolume may be in flight, so that no volume
//! outlives its claim unnoticed (upstream leaks one when a claim is deleted while CreateVolume
//! hangs or the sidecar is down: its issues 486, 1469).
//!
//! One type over two stores, chosen once at start-up ([`open`]): a claim's path calls
//! [`IntentStore::record`] (returns once the record is durable; only then may CreateVolume be
//! sent), [`IntentStore::set_id`] and [`IntentStore::forget`]; the resolver walks
//! [`IntentStore::pending`].
//!
//! - the Lease ledger ([`ledger`]): a few Leases in the sidecar's namespace (one per node
//!   in node mode), what is recorded while a write is in flight riding the next write; the
//!   default, in upstream's RBAC;
//! - the claim record ([`claim_record`]): a finalizer and annotations on the claim, for RBAC
//!   without Leases (the ledger cannot be listed at start-up). A Lease write refused later fails
//!   that attempt with an event naming the missing permission, as any API error does.
//!
//! The resolver ([`resolve`]) is the only clean-up path for all of them: it
//! walks [`IntentStore::pending`] and decides each entry with `resolution::resolve`.

use std::sync::Arc;

use k8s_openapi::api::core::v1::PersistentVolumeClaim;

use crate::k8s::lean::Lean;
use crate::k8s::patch::PatchError;
use crate::leader::Leadership;
use crate::provision::controller::intents::ledger::store::{Ledger, LedgerError};
use crate::provision::controller::intents::ledger::{Entry, Removal};
use resolution::Owner;

pub(crate) mod claim_record;
pub(crate) mod cleanup;
pub(crate) mod ledger;
mod open;
pub(crate) mod resolution;
pub(in crate::provision::controller) mod resolve;

use claim_record::{ClaimRecords, Written};
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

/// What [`IntentStore::record`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Recorded {
    /// Durable: CreateVolume may be sent.
    Durable,
    /// The claim is being deleted (claim record): nothing was started, nothing may be.
    ClaimDeleting,
}

/// An entry the resolver looks at, who acts on it, and which store holds it.
#[derive(Debug, Clone)]
pub(crate) struct Pending {
    /// The intent.
    pub(crate) entry: Entry,
    /// Who acts on it (for a claim record: from the claim's selected node as last seen).
    pub(crate) owner: Owner,
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
}

/// How the ledger writes `entry`'s removal: a Retain volume's at once ([`Removal::Prompt`]), one
/// found `stale` (its PV exists) with no write of its own, others lazily.
fn removal(entry: &Entry, stale: bool) -> Removal {
    if stale {
        Removal::Stale
    } else if entry.retain {
        Removal::Prompt
    } else {
        Removal::Lazy
    }
}

/// A handle on the intent store; cheap to clone.
#[derive(Clone)]
pub(crate) struct IntentStore {
    ledger: Ledger,
    claims: Arc<ClaimRecords>,
    /// Node mode: this instance's node.
    node: Option<String>,
}

impl IntentStore {
    /// A store over `ledger` (disabled: claim records only) for claims of `driver`.
    pub(crate) fn new(
        ledger: Ledger,
        client: kube::Client,
        driver: &str,
        node: Option<String>,
    ) -> Self {
        Self {
            ledger,
            claims: Arc::new(ClaimRecords::new(client, driver)),
            node,
        }
    }

    /// Records `entry` for `pvc` and returns once it is durable.
    pub(crate) async fn record(
        &self,
        pvc: &PersistentVolumeClaim,
        entry: Entry,
    ) -> Result<Recorded, IntentError> {
        match self.ledger.record(entry.clone()).await {
            Ok(()) => Ok(Recorded::Durable),
            // No ledger (RBAC at start-up): on the claim.
            Err(LedgerError::Disabled) => match self.claims.record(pvc, &entry).await {
                Ok(Written::Recorded) => Ok(Recorded::Durable),
                Ok(Written::ClaimDeleting) => Ok(Recorded::ClaimDeleting),
                Err(e) => Err(IntentError::Claim(e)),
            },
            Err(e) => Err(IntentError::Ledger(e)),
        }
    }

    /// Remembers the volume id learned for `entry` (a retried clean-up then needs no replay).
    pub(crate) async fn set_id(&self, entry: &Entry, id: &str) {
        self.ledger.set_id(&entry.volume, id);
        if self.claims.holds(entry) {
            self.claims.set_id(entry, id).await;
        }
    }

    /// Drops `entry`: its PV exists, or its volume was deleted (or never made).
    pub(crate) async fn forget(&self, entry: &Entry) -> Result<(), IntentError> {
        self.ledger.forget(&entry.volume, removal(entry, false));
        if self.claims.holds(entry) {
            self.claims
                .forget(entry)
                .await
                .map_err(IntentError::Claim)?;
        }
        Ok(())
    }

    /// The resolver's [`IntentStore::forget`]: only in the store holding `pending`. `stale`: its
    /// PV exists (the ledger writes nothing just for it).
    pub(crate) async fn resolved(&self, pending: &Pending, stale: bool) -> Result<(), IntentError> {
        let entry = &pending.entry;
        match pending.held {
            Held::Ledger => self.ledger.forget(&entry.volume, removal(entry, stale)),
            Held::Claim => self
                .claims
                .forget(entry)
                .await
                .map_err(IntentError::Claim)?,
        }
        Ok(())
    }

    /// The resolver's [`IntentStore::set_id`]: only in the store holding `pending`.
    pub(crate) async fn learned_id(&self, pending: &Pending, id: &str) {
        match pending.held {
            Held::Ledger => self.ledger.set_id(&pending.entry.volume, id),
            Held::Claim => self.claims.set_id(&pending.entry, id).await,
        }
    }

    /// A claim record whose claim is gone (or no longer carries it): the mirror lagged behind.
    /// Nothing else to do: the finalizer held the claim as long as the record was on it.
    pub(crate) fn unmirror(&self, entry: &Entry) {
        self.claims.unmirror(entry);
    }

    /// Every entry now, with who acts on it.
    pub(crate) fn pending(&self) -> Vec<Pending> {
        let me = self.node.as_deref();
        let ledger = self.ledger.entries().into_iter().map(|entry| Pending {
            entry,
            owner: Owner::Me,
            held: Held::Ledger,
        });
        let claims = self
            .claims
            .pending()
            .into_iter()
            .map(|(entry, selected)| Pending {
                entry,
                owner: Owner::of_record(me, selected.as_deref()),
                held: Held::Claim,
            });
        ledger.chain(claims).collect()
    }

    /// Whether this process recorded `volume` itself (then it alone made, or did not make, the
    /// volume's PV).
    pub(crate) fn recorded_here(&self, volume: &str) -> bool {
        self.ledger.recorded_here(volume) || self.claims.recorded_here(volume)
    }

    /// Takes in a claim as the watch delivered it (the claim record it carries, if any), parsed
    /// only when it may carry one.
    pub(crate) fn observe_cached(&self, claim: &Lean<PersistentVolumeClaim>) {
        self.claims.observe_cached(claim);
    }

    /// Asks for the ledger's pending removals to be written (the resolver's pass).
    pub(crate) fn flush_removals(&self) {
        self.ledger.flush_removals();
    }

    /// Writes the ledger until `stop` completes (nothing to run for claim records).
    pub(crate) async fn run(self, leadership: Leadership, stop: impl Future<Output = ()>) {
        self.ledger.run_committer(leadership, stop).await;
    }
}
