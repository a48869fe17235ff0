//! The audit (`csi-provisioner audit`, `--audit-interval`): compares the PVs in the API server with
//! the volumes the driver lists, and reports what needs an operator: leaked volumes (no PV), lost
//! volumes (a PV whose volume is gone), PVs stuck Released or Terminating with the reason, PVs of
//! ours without the deletion-protection finalizer, provisioning intents never resolved, and claims
//! unused for long.
//!
//! This module is pure: what one observation suggests ([`observe`]) and what two observations
//! confirm ([`confirm`]). A volume or PV is reported only when it looked wrong in both, taken
//! `--min-age` apart, and a volume with an open intent never counts as leaked: so a volume whose PV
//! is being created, or a PV whose volume is being deleted, is never reported. The shells are
//! [`run`] (the subcommand) and [`periodic`] (inside the sidecar, exporting gauges).

use std::borrow::Borrow;
use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use serde::Serialize;

use crate::model::claim::unused_since;
use crate::model::meta::{annotation, has_finalizer, label};
use crate::names;
use crate::reclaim::plan::{
    Ownership, ReclaimPolicy, has_our_finalizer, ownership, phase, reclaim_policy,
};

pub mod args;
pub(crate) mod collect;
pub(crate) mod periodic;
mod render;
pub mod run;

pub use run::main;

/// A volume whose CreateVolume may be in flight (an intent-ledger entry, or a claim's intent).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Intent {
    /// The volume (and PV) name.
    pub(crate) volume: String,
    /// `namespace/name` of the claim.
    pub(crate) claim: String,
    /// The claim's UID.
    #[serde(skip)]
    pub(crate) uid: String,
    /// The volume id, once the driver answered.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) volume_id: Option<String>,
    /// Where the intent is kept: `ledger` or `claim`.
    pub(crate) kept_in: &'static str,
}

/// The driver's volumes, or why they could not be listed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Listing {
    /// Every volume id ListVolumes returned.
    Volumes(BTreeSet<String>),
    /// Not listed: the reason, said as it is.
    Unavailable(String),
}

/// What [`observe`] reads besides the objects.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Scope<'a> {
    /// Our driver.
    pub(crate) driver: &'a str,
    /// Node mode: only PVs pinned to this node (its driver lists only its own volumes).
    pub(crate) node: Option<&'a str>,
    /// When ListVolumes started: a PV created later cannot be missing from it.
    pub(crate) listed_at: jiff::Timestamp,
    /// Now, for "stuck" and "unused" ages.
    pub(crate) now: jiff::Timestamp,
    /// Claims unused longer than this are listed.
    pub(crate) unused_for: std::time::Duration,
    /// PVs Released or Terminating longer than this are stuck.
    pub(crate) stuck_after: std::time::Duration,
}

/// A PV whose volume the driver did not list.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Lost {
    pub(crate) pv: String,
    pub(crate) volume_handle: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) claim: Option<String>,
    pub(crate) phase: String,
    /// The PV's creation time.
    #[serde(skip)]
    pub(crate) created: Option<jiff::Timestamp>,
}

/// A PV Released or being deleted for longer than [`Scope::stuck_after`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Stuck {
    pub(crate) pv: String,
    /// `Released` or `Terminating`.
    pub(crate) state: &'static str,
    /// Since when (RFC 3339).
    pub(crate) since: String,
    /// Why, as far as the objects tell.
    pub(crate) reason: String,
    /// The PV's last Warning event (the shell fills it in).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) last_warning: Option<String>,
}

/// A PV of ours with reclaim Delete and without the deletion-protection finalizer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Unprotected {
    pub(crate) pv: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) claim: Option<String>,
}

/// A claim of ours without a Pod using it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Unused {
    pub(crate) claim: String,
    /// Unused since (RFC 3339).
    pub(crate) since: String,
    /// `annotation` (ours) or `condition` (Kubernetes' `Unused`, KEP-5541).
    pub(crate) from: &'static str,
    #[serde(skip)]
    pub(crate) age_seconds: u64,
}

/// What one observation suggests; [`confirm`] keeps what two agree on.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Observation {
    /// `None` when the volumes could not be listed (the reason).
    pub(crate) listing_error: Option<String>,
    /// How many volumes the driver listed.
    pub(crate) volumes_listed: usize,
    /// When ListVolumes started.
    pub(crate) listed_at: Option<jiff::Timestamp>,
    /// Volume ids with no PV and no intent naming them.
    pub(crate) orphans: BTreeSet<String>,
    pub(crate) lost: BTreeMap<String, Lost>,
    pub(crate) intents: BTreeMap<String, Intent>,
    pub(crate) stuck: Vec<Stuck>,
    pub(crate) unprotected: BTreeMap<String, Unprotected>,
    pub(crate) unused: Vec<Unused>,
    pub(crate) pvs: usize,
}

/// The audit's result.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Report {
    pub(crate) driver: String,
    /// How many of the driver's PVs and volumes were compared.
    pub(crate) pvs: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) volumes: Option<usize>,
    /// Why leaked and lost volumes could not be checked, if they could not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) volumes_not_checked: Option<String>,
    /// Backend volumes with no PV, in both observations and with no open intent.
    pub(crate) leaked: Vec<String>,
    /// Volumes with no PV that an open intent without a volume id may still explain.
    pub(crate) unconfirmed: Vec<String>,
    pub(crate) lost: Vec<Lost>,
    pub(crate) stuck: Vec<Stuck>,
    pub(crate) missing_finalizer: Vec<Unprotected>,
    /// Intents open in both observations.
    pub(crate) unresolved_intents: Vec<Intent>,
    pub(crate) unused_claims: Vec<Unused>,
    /// Leaked volumes DeleteVolume was called for (`--delete-orphans --confirm`), with the outcome.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(crate) deleted: Vec<Deletion>,
}

/// One `--delete-orphans` DeleteVolume.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Deletion {
    pub(crate) volume_id: String,
    /// `deleted`, `would delete (dry run: add --confirm)`, or the driver's error.
    pub(crate) outcome: String,
}

fn claim_ref_name(pv: &PersistentVolume) -> Option<String> {
    let r = pv.spec.as_ref()?.claim_ref.as_ref()?;
    Some(format!(
        "{}/{}",
        r.namespace.as_deref().unwrap_or_default(),
        r.name.as_deref()?
    ))
}

fn volume_handle(pv: &PersistentVolume) -> Option<&str> {
    Some(pv.spec.as_ref()?.csi.as_ref()?.volume_handle.as_str())
}

fn older_than(t: jiff::Timestamp, now: jiff::Timestamp, age: std::time::Duration) -> bool {
    now.duration_since(t).as_secs_f64() >= age.as_secs_f64()
}

/// Whether the PV is the driver's and, in node mode, this node's.
fn in_scope(pv: &PersistentVolume, scope: &Scope<'_>) -> bool {
    let driver = pv
        .spec
        .as_ref()
        .and_then(|s| s.csi.as_ref())
        .is_some_and(|csi| csi.driver == scope.driver);
    driver
        && scope
            .node
            .is_none_or(|node| label(&pv.metadata, names::LABEL_PV_NODE) == Some(node))
}

/// Why a PV is stuck, from the PV and whether its claim still exists.
pub(crate) fn stuck_reason(pv: &PersistentVolume, claim_exists: bool, driver: &str) -> String {
    let deleting = pv.metadata.deletion_timestamp.is_some();
    let claim = claim_ref_name(pv).unwrap_or_default();
    if deleting && claim_exists && has_finalizer(&pv.metadata, names::FINALIZER_PV_PROTECTION) {
        return format!(
            "still bound to claim {claim}: PV protection keeps it until the claim is deleted"
        );
    }
    match (reclaim_policy(pv), has_our_finalizer(pv)) {
        (ReclaimPolicy::Delete, true) => {
            if claim_exists {
                format!("claim {claim} still exists; the volume is deleted once it is gone")
            } else {
                "waiting for DeleteVolume: see the last warning, or check that the provisioner (its leader) is running".to_owned()
            }
        }
        (ReclaimPolicy::Delete, false) if !deleting => {
            let by = annotation(&pv.metadata, names::ANN_PROVISIONED_BY).unwrap_or("");
            if matches!(ownership(pv, driver), Ownership::Ours { .. }) {
                "no deletion-protection finalizer yet: the provisioner has not handled this PV (is it running?)".to_owned()
            } else {
                format!(
                    "provisioned by {:?}, not by this driver's provisioner: nothing here deletes it",
                    by
                )
            }
        }
        (ReclaimPolicy::Retain | ReclaimPolicy::Recycle, _) if !deleting => {
            "reclaim policy is not Delete: the volume is kept until an administrator deletes it"
                .to_owned()
        }
        _ => {
            let held: Vec<&str> = pv
                .metadata
                .finalizers
                .iter()
                .flatten()
                .map(String::as_str)
                .collect();
            format!("held by finalizers [{}]", held.join(", "))
        }
    }
}

/// What one observation suggests. `pvs` and `claims` are every PV and every claim (in any order);
/// `intents` every open intent of the ledger (the claims' own intents are read from `claims`).
pub(crate) fn observe<P, C>(
    scope: &Scope<'_>,
    listing: &Listing,
    pvs: impl IntoIterator<Item = P>,
    claims: impl IntoIterator<Item = C>,
    ledger: &[Intent],
) -> Observation
where
    P: Borrow<PersistentVolume>,
    C: Borrow<PersistentVolumeClaim>,
{
    let mut obs = Observation {
        listed_at: Some(scope.listed_at),
        ..Observation::default()
    };
    let mut intents: BTreeMap<String, Intent> = ledger
        .iter()
        .map(|i| (i.volume.clone(), i.clone()))
        .collect();
    // Claims: their intents, which claims exist (uid per namespace/name), unused ones.
    let mut claim_uids: BTreeMap<String, String> = BTreeMap::new();
    for claim in claims {
        let claim = claim.borrow();
        let key = format!(
            "{}/{}",
            claim.metadata.namespace.as_deref().unwrap_or_default(),
            claim.metadata.name.as_deref().unwrap_or_default()
        );
        if let Some(volume) = annotation(&claim.metadata, names::ANN_INTENT_VOLUME_NAME)
            && has_finalizer(&claim.metadata, names::FINALIZER_PROVISIONING_INTENT)
            && crate::model::claim::is_ours(claim, scope.driver)
        {
            intents.entry(volume.to_owned()).or_insert_with(|| Intent {
                volume: volume.to_owned(),
                claim: key.clone(),
                uid: claim.metadata.uid.clone().unwrap_or_default(),
                volume_id: annotation(&claim.metadata, names::ANN_INTENT_VOLUME_ID)
                    .map(str::to_owned),
                kept_in: "claim",
            });
        }
        if crate::model::claim::is_ours(claim, scope.driver)
            && let Some(unused) = unused_since(claim)
            && older_than(unused.0, scope.now, scope.unused_for)
        {
            obs.unused.push(Unused {
                claim: key.clone(),
                since: unused.0.to_string(),
                from: unused.1,
                age_seconds: scope.now.duration_since(unused.0).as_secs().max(0) as u64,
            });
        }
        claim_uids.insert(key, claim.metadata.uid.clone().unwrap_or_default());
    }
    let claim_exists = |pv: &PersistentVolume| {
        let Some(name) = claim_ref_name(pv) else {
            return false;
        };
        match (claim_uids.get(&name), crate::reclaim::plan::claim_uid(pv)) {
            (Some(found), Some(want)) => found == want,
            (found, _) => found.is_some(),
        }
    };
    let listed = match listing {
        Listing::Volumes(ids) => Some(ids),
        Listing::Unavailable(reason) => {
            obs.listing_error = Some(reason.clone());
            None
        }
    };
    obs.volumes_listed = listed.map_or(0, BTreeSet::len);
    let mut handles = BTreeSet::new();
    let stuck_after = scope.stuck_after;
    for pv in pvs {
        let pv = pv.borrow();
        if !in_scope(pv, scope) {
            continue;
        }
        obs.pvs += 1;
        let name = pv.metadata.name.clone().unwrap_or_default();
        let handle = volume_handle(pv).unwrap_or_default();
        handles.insert(handle.to_owned());
        let deleting = pv.metadata.deletion_timestamp.is_some();
        let released = phase(pv) == Some(names::PV_PHASE_RELEASED);
        let delete_policy = reclaim_policy(pv) == ReclaimPolicy::Delete;
        // A volume being deleted on purpose is not lost.
        if let Some(ids) = listed
            && !ids.contains(handle)
            && !deleting
            && !(released && delete_policy)
        {
            obs.lost.insert(
                name.clone(),
                Lost {
                    pv: name.clone(),
                    volume_handle: handle.to_owned(),
                    claim: claim_ref_name(pv),
                    phase: phase(pv).unwrap_or("").to_owned(),
                    created: pv.metadata.creation_timestamp.as_ref().map(|t| t.0),
                },
            );
        }
        let stuck_since = if let Some(t) = &pv.metadata.deletion_timestamp {
            Some(("Terminating", t.0))
        } else if released && delete_policy {
            pv.status
                .as_ref()
                .and_then(|s| s.last_phase_transition_time.as_ref())
                .map(|t| ("Released", t.0))
        } else {
            None
        };
        if let Some((state, since)) = stuck_since
            && older_than(since, scope.now, stuck_after)
        {
            obs.stuck.push(Stuck {
                pv: name.clone(),
                state,
                since: since.to_string(),
                reason: stuck_reason(pv, claim_exists(pv), scope.driver),
                last_warning: None,
            });
        }
        if matches!(ownership(pv, scope.driver), Ownership::Ours { .. })
            && delete_policy
            && !has_our_finalizer(pv)
            && !deleting
        {
            obs.unprotected.insert(
                name.clone(),
                Unprotected {
                    pv: name.clone(),
                    claim: claim_ref_name(pv),
                },
            );
        }
        // Its PV exists: the intent is resolved (the ledger drops it lazily).
        intents.remove(&name);
    }
    if let Some(ids) = listed {
        // A volume an intent names (by id, or by name where the driver uses it as the id) is
        // accounted for.
        let named: BTreeSet<&str> = intents
            .values()
            .flat_map(|i| [Some(i.volume.as_str()), i.volume_id.as_deref()])
            .flatten()
            .collect();
        obs.orphans = ids
            .iter()
            .filter(|id| !handles.contains(*id) && !named.contains(id.as_str()))
            .cloned()
            .collect();
    }
    obs.intents = intents;
    obs
}

/// With one observation only: whether the PV existed before ListVolumes started, so that its volume
/// had to be listed (creation times are whole seconds; a later PV is not lost, only younger than
/// its volume's listing). Two observations need no clock: the second listing came after the PV.
fn created_before(lost: &Lost, listed_at: Option<jiff::Timestamp>) -> bool {
    match (lost.created, listed_at) {
        (Some(created), Some(listed)) => created + jiff::SignedDuration::from_secs(1) <= listed,
        _ => false,
    }
}

/// The findings both observations agree on (`first` older by at least `--min-age`; one observation
/// passed twice is a quick audit). Where an intent without a volume id was open in both, a volume
/// without a PV may be that intent's answer: it is reported as unconfirmed, not leaked.
pub(crate) fn confirm(driver: &str, first: &Observation, second: &Observation) -> Report {
    let unresolved: Vec<Intent> = second
        .intents
        .values()
        .filter(|i| first.intents.get(&i.volume).is_some_and(|f| f.uid == i.uid))
        .cloned()
        .collect();
    let idless = unresolved.iter().any(|i| i.volume_id.is_none());
    let orphans = first.orphans.intersection(&second.orphans).cloned();
    let (unconfirmed, leaked): (Vec<String>, Vec<String>) = orphans.partition(|_| idless);
    Report {
        driver: driver.to_owned(),
        pvs: second.pvs,
        volumes: second
            .listing_error
            .is_none()
            .then_some(second.volumes_listed),
        volumes_not_checked: second
            .listing_error
            .clone()
            .or_else(|| first.listing_error.clone()),
        leaked,
        unconfirmed,
        lost: second
            .lost
            .values()
            .filter(|l| first.lost.get(&l.pv).is_some_and(|f| f == *l))
            .filter(|l| first.listed_at != second.listed_at || created_before(l, first.listed_at))
            .cloned()
            .collect(),
        stuck: second.stuck.clone(),
        missing_finalizer: second
            .unprotected
            .values()
            .filter(|u| first.unprotected.contains_key(&u.pv))
            .cloned()
            .collect(),
        unresolved_intents: unresolved,
        unused_claims: second.unused.clone(),
        deleted: Vec::new(),
    }
}

#[cfg(test)]
#[path = "audit_tests.rs"]
mod tests;
