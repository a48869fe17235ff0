//! Volumes whose node no longer exists: the per-PV state machine ([`NodeGoneTracker`]) that answers
//! them as deleted (PV object removed, our finalizer taken off, an event saying which node was
//! missing and since when), and, opt-in, deletes claims still bound to them.
//!
//! A volume is a candidate ([`classify`]) when it is ours (`spec.csi.driver`), its reclaim policy is
//! `Delete`, it is `Released` (which also covers "PV deleted first, then its claim"), and it is
//! *node-local*: its node affinity pins exactly one node ([`pin_of`]), or, in node mode, it has no
//! affinity but records the node it was provisioned on. With `--deleted-node-pvc-cleanup`, a
//! `Bound` volume is a candidate too: its claim is deleted, with a UID precondition.
//!
//! Safety — every one of these must hold before anything is removed:
//! 1. The node the volume lives on is absent. That node is the one its affinity pins; the
//!    recorded node (annotations [`names::ANN_NODE_NAME`] / [`names::ANN_NODE_UID`]) names it only
//!    where the affinity pins that very node, never where the claim merely asked to be (a volume
//!    a driver placed on another node than the selected one lives there: issue 28). Absent: it
//!    does not exist, or a Node of that name has another UID (node names are reused by cloud node
//!    pools; the old machine and its disk are gone). Without a record the pinned node is found
//!    by label (`kubernetes.io/hostname=<h>` or a per-node topology key); a re-created node of the
//!    same name then counts as present — a missed clean-up, never a wrong one.
//! 2. Absence has lasted the whole grace period (`--deleted-node-grace-period`, default 5m),
//!    measured from the first observation in this process (after a restart the period starts over).
//! 3. At the end of the period it is confirmed by a *live* API call: a GET answering 404 (or a
//!    Node with another UID), or an empty label-selected LIST. The cache only starts the timer.
//! 4. Any other answer (500, 503, 429, timeouts, 403, connection errors) is "unknown": it never
//!    counts as absence and the check is repeated later. A NotReady node is present: readiness is
//!    never read, only existence.
//! 5. A Node with the recorded UID (or, for label lookups, any matching Node) reappearing at any
//!    point cancels the clean-up.
//! 6. Only one instance acts: the caller passes this instance's `rank` among the live instances
//!    ([`actor_rank`]); rank `r` waits `r × fallback_delay` longer than rank 0, and before acting
//!    the shell re-reads the PV live, so a fallback finds the work already done. Instances ranked
//!    beyond [`MAX_ACTOR_RANKS`] do not even track the volume.
//! 7. No DeleteVolume is sent for such a volume: no instance can reach it, and the backend is
//!    considered gone with its node.

use std::collections::{BTreeSet, HashMap};
use std::time::Instant;

use k8s_openapi::api::core::v1::PersistentVolume;

use crate::model::locate::{NodeLookup, NodeQuery, PerNodeKeys};
use crate::names;

use super::candidates::{Answer, Candidate, ClaimToDelete, Skip, classify};
use super::policy::{GoneConfig, MAX_ACTOR_RANKS, Now, grace_deadline};

// === The tracker ===

/// One lookup fed to [`NodeGoneTracker::observe`], by where it came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum NodeCheck {
    /// From a watch-fed cache: may start the timer, never decides.
    Cached(NodeLookup),
    /// From a live API call made just now (together with a live read of the PV).
    Live(NodeLookup),
}

/// What the shell does next for one PV.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum GoneAction {
    /// Nothing to do or wait for.
    Nothing,
    /// Observe this PV again at `deadline` (idempotent: the same deadline is returned while waiting).
    StartTimer {
        /// When to look again.
        deadline: Instant,
    },
    /// The grace period is over: look `query` up live (GET by name, or label-selected LIST), re-read
    /// the PV live (404: forget it), and observe again with [`NodeCheck::Live`].
    ConfirmLive {
        /// The lookup to make.
        query: NodeQuery,
    },
    /// Absence confirmed live after the grace period: execute the plan.
    ActOnPv(GonePlan),
    /// Stop waiting (the PV's timer is dropped; nothing to do).
    Cancel(CancelReason),
}

/// Why tracking stopped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum CancelReason {
    /// The node exists (again), with the recorded UID when one was recorded.
    NodePresent,
    /// The PV is no longer a candidate.
    NotCandidate(Skip),
    /// Another instance ranks ahead (instances came or went).
    NotActor,
}

/// The writes that answer a PV whose node is gone; the shell executes them in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum GonePlan {
    /// Delete the PV object (precondition `pv_uid`) if `delete_object`, then remove our finalizer
    /// (guarded patch) if `remove_finalizer`, then record `event`; on success increment
    /// `csi_provisioner_deleted_node_volumes_total` and [`NodeGoneTracker::forget`] the PV.
    RemovePv {
        /// PV name.
        pv: String,
        /// PV UID (delete precondition; the finalizer patch tests it too).
        pv_uid: String,
        /// Whether the PV object must be deleted.
        delete_object: bool,
        /// Whether our finalizer must be removed.
        remove_finalizer: bool,
        /// The event on the PV.
        event: GoneEvent,
    },
    /// Opt-in: read the claim fresh, check [`claim_bond_matches`], delete it with the UID
    /// precondition, record `event`, increment `csi_provisioner_deleted_node_claims_total`. Keep
    /// tracking the PV: once released it is answered at once (its grace period is already over).
    DeleteClaim {
        /// PV name.
        pv: String,
        /// The claim.
        claim: ClaimToDelete,
        /// The event on the PV (the claim is going away).
        event: GoneEvent,
    },
}

/// An event to record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct GoneEvent {
    /// Always [`names::EVENT_VOLUME_NODE_GONE`], type Normal.
    pub(crate) reason: &'static str,
    /// Which node was missing, since when, and what was done.
    pub(crate) message: String,
}

#[derive(Clone, Debug)]
struct TrackedVolume {
    pv_uid: String,
    query: NodeQuery,
    first_absent: Now,
    rank: usize,
}

/// Per-PV memory of when each volume's node was first seen absent (in memory only: after a restart
/// the grace period starts again, which only delays a clean-up).
#[derive(Clone, Debug)]
pub(crate) struct NodeGoneTracker {
    config: GoneConfig,
    entries: HashMap<String, TrackedVolume>,
}

/// What a lookup says of the node a volume lives on.
pub(crate) enum Verdict {
    Present,
    Absent(Absence),
    Unknown,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Absence {
    Missing,
    Replaced { current_uid: String },
}

impl NodeGoneTracker {
    /// An empty tracker.
    pub(crate) fn new(config: GoneConfig) -> Self {
        Self {
            config,
            entries: HashMap::new(),
        }
    }

    /// The settings.
    pub(crate) fn config(&self) -> &GoneConfig {
        &self.config
    }

    /// Feeds one observation of `pv` (with the lookup of its node made for [`node_query`] /
    /// [`Candidate::query`]) and this instance's `rank` ([`actor_rank`]; `None` = not an actor).
    pub(crate) fn observe(
        &mut self,
        pv: &PersistentVolume,
        lookup: &NodeCheck,
        rank: Option<usize>,
        now: Now,
    ) -> GoneAction {
        let Some(name) = pv.metadata.name.clone() else {
            return GoneAction::Nothing;
        };
        let candidate = match classify(pv, &self.config) {
            Ok(c) => c,
            Err(skip) => return self.cancel(&name, CancelReason::NotCandidate(skip)),
        };
        let Some(rank) = rank.filter(|r| *r < MAX_ACTOR_RANKS) else {
            return self.cancel(&name, CancelReason::NotActor);
        };
        let (NodeCheck::Cached(result) | NodeCheck::Live(result)) = lookup;
        let absence = match judge(&candidate.query, result) {
            Verdict::Present => return self.cancel(&name, CancelReason::NodePresent),
            Verdict::Unknown => {
                // Keep the first-absent time (only a Found resets it) and ask again later.
                let retry = now.instant + self.config.unknown_recheck;
                let deadline = self
                    .entries
                    .get(&name)
                    .map_or(retry, |e| self.deadline(e).max(retry));
                return GoneAction::StartTimer { deadline };
            }
            Verdict::Absent(absence) => absence,
        };
        let fresh = TrackedVolume {
            pv_uid: pv.metadata.uid.clone().unwrap_or_default(),
            query: candidate.query.clone(),
            first_absent: now,
            rank,
        };
        let entry = self.entries.entry(name.clone()).or_insert(fresh.clone());
        if entry.pv_uid != fresh.pv_uid || entry.query != fresh.query {
            // Another PV of the same name, or another node recorded: start over.
            *entry = fresh;
        }
        entry.rank = rank;
        let entry = entry.clone();
        let deadline = self.deadline(&entry);
        if now.instant < deadline {
            return GoneAction::StartTimer { deadline };
        }
        match lookup {
            NodeCheck::Cached(_) => GoneAction::ConfirmLive {
                query: candidate.query,
            },
            NodeCheck::Live(_) => {
                GoneAction::ActOnPv(self.plan(&name, &entry, &candidate, &absence))
            }
        }
    }

    /// Replaces the per-node keys (controller mode learns them from CSINodes and Nodes, which can
    /// change). A volume whose node query changes with them starts its grace period over.
    pub(crate) fn set_per_node_keys(&mut self, keys: PerNodeKeys) {
        self.config.per_node_keys = keys;
    }

    /// Names of the PVs being tracked.
    #[cfg(test)]
    pub(crate) fn tracked(&self) -> impl Iterator<Item = &str> {
        self.entries.keys().map(String::as_str)
    }

    /// Drops a PV (deleted, answered, or this instance stopped running the clean-up).
    pub(crate) fn forget(&mut self, pv: &str) {
        self.entries.remove(pv);
    }

    /// Keeps only the PVs in `names` (after a re-list, drop volumes that disappeared meanwhile).
    pub(crate) fn retain<'a, I>(&mut self, names: I)
    where
        I: IntoIterator<Item = &'a str>,
    {
        let keep: BTreeSet<&str> = names.into_iter().collect();
        self.entries.retain(|name, _| keep.contains(name.as_str()));
    }

    /// PVs this instance waits on as the first-ranked actor: the value of
    /// `csi_provisioner_volumes_waiting_for_missing_node` (fallback ranks are not counted, so the
    /// sum over instances counts each volume once).
    pub(crate) fn waiting(&self) -> usize {
        self.entries.values().filter(|e| e.rank == 0).count()
    }

    /// When `pv`'s node was first seen absent, if it is being tracked.
    pub(crate) fn first_absent(&self, pv: &str) -> Option<Now> {
        self.entries.get(pv).map(|e| e.first_absent)
    }

    fn deadline(&self, entry: &TrackedVolume) -> Instant {
        grace_deadline(
            entry.first_absent.instant,
            self.config.grace_period,
            self.config.fallback_delay,
            entry.rank,
        )
    }

    fn cancel(&mut self, pv: &str, reason: CancelReason) -> GoneAction {
        let tracked = self.entries.remove(pv);
        tracked.map_or(GoneAction::Nothing, |_| GoneAction::Cancel(reason))
    }

    fn plan(
        &self,
        pv: &str,
        entry: &TrackedVolume,
        candidate: &Candidate,
        absence: &Absence,
    ) -> GonePlan {
        let what = match absence {
            Absence::Missing => format!("{} no longer exists", candidate.query),
            Absence::Replaced { current_uid } => format!(
                "{} was replaced by a new node of the same name (UID {current_uid})",
                candidate.query
            ),
        };
        let since = format!(
            "missing since {}, longer than the grace period of {}",
            entry.first_absent.wall,
            crate::gofmt::format_go_duration(self.config.grace_period)
        );
        let event = |message| GoneEvent {
            reason: names::EVENT_VOLUME_NODE_GONE,
            message,
        };
        match &candidate.target {
            Answer::Volume {
                delete_object,
                remove_finalizer,
            } => GonePlan::RemovePv {
                pv: pv.to_owned(),
                pv_uid: entry.pv_uid.clone(),
                delete_object: *delete_object,
                remove_finalizer: *remove_finalizer,
                event: event(format!(
                    "Volume answered as deleted without calling DeleteVolume: its {what} \
                     ({since}); its data is considered lost with the node"
                )),
            },
            Answer::Claim(claim) => GonePlan::DeleteClaim {
                pv: pv.to_owned(),
                claim: claim.clone(),
                event: event(format!(
                    "Deleted claim {}/{} (UID {}) bound to this volume because its {what} \
                     ({since}); --deleted-node-pvc-cleanup is on",
                    claim.namespace, claim.name, claim.uid
                )),
            },
        }
    }
}

/// Absent: not found, or a Node of the recorded name with another UID. A failure is unknown.
pub(crate) fn judge(query: &NodeQuery, result: &NodeLookup) -> Verdict {
    match (query, result) {
        (_, NodeLookup::Failed { .. }) => Verdict::Unknown,
        (_, NodeLookup::NotFound) => Verdict::Absent(Absence::Missing),
        (
            NodeQuery::ByName {
                uid: Some(recorded),
                ..
            },
            NodeLookup::Found { uid: Some(current) },
        ) if current != recorded => Verdict::Absent(Absence::Replaced {
            current_uid: current.clone(),
        }),
        (_, NodeLookup::Found { .. }) => Verdict::Present,
    }
}

#[cfg(test)]
#[path = "tracker_tests.rs"]
mod tests;
