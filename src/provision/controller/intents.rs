//! The intent log: the durable record that a CreateVolume may be in flight, so that no volume
//! outlives its claim unnoticed (upstream leaks one when a claim is deleted while CreateVolume
//! hangs or the sidecar is down: its issues 486, 1469).
//!
//! One interface of five methods over the store new intents go to, chosen once at start-up
//! ([`open`]), and what earlier runs left elsewhere (records on claims, a retired journal's
//! entries no ledger could take in): a claim's path calls [`IntentLog::record`] (returns once the record is
//! durable; only then may CreateVolume be sent), [`IntentLog::set_id`] and
//! [`IntentLog::forget`] on the handle it returns; the resolver walks [`IntentLog::pending`],
//! calls the same two on each entry, and asks [`IntentLog::recorded_here`].
//!
//! - the Lease ledger ([`ledger`]): a few Leases in the sidecar's namespace (one per node
//!   in node mode), what is recorded while a write is in flight riding the next write; the
//!   default, in upstream's RBAC;
//! - the claim record ([`claim_record`]): a finalizer and annotations on the claim, for RBAC
//!   without Leases (the ledger cannot be listed at start-up). A Lease write refused later fails
//!   that attempt with an event naming the missing permission, as any API error does.
//!
//! The resolver ([`resolve`]) is the only clean-up path for both: it walks
//! [`IntentLog::pending`] and decides each entry with `resolution::resolve`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::PersistentVolumeClaim;

use crate::k8s::patch::PatchError;
use crate::provision::controller::intents::ledger::store::{Ledger, LedgerError};
use crate::provision::controller::intents::ledger::{Entry, Removal};
use crate::sync::lock;
use tracing::{info, warn};

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
    /// A retired node journal's entry that no ledger could take in (Leases refused at start-up):
    /// in memory, for this run's resolver to finish; the journal's files are renamed
    /// `*.json.resolved` once none is left.
    Journal,
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

/// A retired journal's entries no ledger took in ([`Held::Journal`]).
#[derive(Default)]
pub(crate) struct Journal {
    /// By volume.
    entries: Mutex<BTreeMap<String, Entry>>,
    /// Their count, published as the ledger's (no ledger publishes it when they exist).
    count: Arc<AtomicI64>,
    /// The files they were read from, renamed `*.json.resolved` once every entry is resolved, so
    /// that a later start does not resolve them again.
    files: Vec<PathBuf>,
}

impl Journal {
    /// `entries` read from `files`, counted in `count`.
    pub(crate) fn new(entries: Vec<Entry>, files: Vec<PathBuf>, count: Arc<AtomicI64>) -> Self {
        let entries: BTreeMap<_, _> = entries.into_iter().map(|e| (e.volume.clone(), e)).collect();
        if entries.is_empty() {
            // Files that list nothing are resolved already.
            retire(&files);
        } else {
            count.store(entries.len() as i64, Ordering::Relaxed);
        }
        Self {
            entries: Mutex::new(entries),
            count,
            files,
        }
    }

    /// Drops the entry of `entry`'s volume and claim (the same name may be another node's copy,
    /// or, with short generated names, another claim's volume); once none is left, the files are
    /// renamed.
    fn forget(&self, entry: &Entry) {
        let mut entries = lock(&self.entries);
        if entries
            .get(&entry.volume)
            .is_none_or(|e| e.uid != entry.uid)
        {
            return;
        }
        entries.remove(&entry.volume);
        self.count.store(entries.len() as i64, Ordering::Relaxed);
        let last = entries.is_empty();
        // No entry is ever added: only the caller that removed the last one gets here.
        drop(entries);
        if last {
            retire(&self.files);
        }
    }
}

/// Renames a retired journal's `files` `*.json.resolved`: a later start does not read them again.
fn retire(files: &[PathBuf]) {
    for file in files {
        let resolved = file.with_extension("json.resolved");
        match std::fs::rename(file, &resolved) {
            Ok(()) => info!(file = %resolved.display(), "retired intent journal resolved"),
            Err(e) => warn!(file = %file.display(), "resolved but not renamed: {e}"),
        }
    }
}

/// The intent log of this process: the store new intents go to, chosen once at start-up
/// ([`open`]), and the claim records already on claims (an earlier run's, or this one's when
/// Leases are not granted), which the resolver finishes. Cheap to clone.
#[derive(Clone)]
pub(crate) struct IntentLog {
    /// `None`: Leases were refused at start-up, new intents go on their claims.
    ledger: Option<Ledger>,
    claims: Arc<ClaimRecords>,
    journal: Arc<Journal>,
}

impl IntentLog {
    /// A log over `ledger` (`None`: claim records only), the claim records `claims` mirrors and
    /// a retired journal's entries no ledger took in.
    pub(crate) fn new(ledger: Option<Ledger>, claims: Arc<ClaimRecords>, journal: Journal) -> Self {
        Self {
            ledger,
            claims,
            journal: Arc::new(journal),
        }
    }

    /// Records `entry` for `pvc` and returns once it is durable.
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
                let earlier = claim_record::entry_of(pvc).is_some_and(|e| e.volume == entry.volume);
                if earlier {
                    Held::LedgerAndClaim
                } else {
                    Held::Ledger
                }
            }
            // No ledger (RBAC at start-up): on the claim.
            None => match self.claims.record(pvc, &entry).await {
                Ok(Written::Recorded) => Held::Claim,
                Ok(Written::ClaimDeleting) => return Ok(Recorded::ClaimDeleting),
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
        if pending.held == Held::Journal
            && let Some(kept) = lock(&self.journal.entries).get_mut(&entry.volume)
        {
            kept.id = Some(id.to_owned());
        }
    }

    /// Drops `pending` from the store holding it, as `why` says.
    pub(crate) async fn forget(&self, pending: &Pending, why: Forget) -> Result<(), IntentError> {
        let entry = &pending.entry;
        let removal = match why {
            Forget::Done if entry.retain => Removal::Prompt,
            Forget::Done => Removal::Lazy,
            Forget::Stale => Removal::Stale,
            // The claim that carried the record is gone: nothing is written, and no ledger
            // entry is dropped for it.
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
        // A journal entry of the same volume and claim goes with this process's own record of it
        // (its fate is decided); never with another node's record of its own copy.
        let own = match pending.held {
            Held::Claim => self.claims.recorded_here(&entry.volume),
            Held::Ledger | Held::LedgerAndClaim | Held::Journal => true,
        };
        if own {
            self.journal.forget(entry);
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
        let journal = lock(&self.journal.entries)
            .values()
            .cloned()
            .collect::<Vec<_>>();
        let journal = journal.into_iter().map(|entry| Pending {
            entry,
            held: Held::Journal,
        });
        ledger.chain(claims).chain(journal).collect()
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

#[cfg(test)]
#[path = "intents_tests.rs"]
mod tests;
