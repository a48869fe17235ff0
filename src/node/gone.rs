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
//! 1. The node is absent: the PV's recorded node (annotations [`names::ANN_NODE_NAME`] /
//!    [`names::ANN_NODE_UID`]) does not exist, or a Node of that name has another UID (node names
//!    are reused by cloud node pools; the old machine and its disk are gone). PVs written before
//!    those annotations existed fall back to the node pinned in their affinity, found by label
//!    (`kubernetes.io/hostname=<h>` or a per-node topology key); a re-created node of the same
//!    name then counts as present — a missed clean-up, never a wrong one.
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
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};

use crate::model::meta::non_empty_annotation as annotation;
use crate::names;
use crate::node::locate::{Mode, NodeLookup, NodeQuery, PerNodeKeys, Pin, pin_of};
use crate::node::rendezvous;

/// Only this many instances (the first in rendezvous order) track a volume: one actor and two
/// fallbacks. The rest hold no state for it, so memory does not grow with the number of nodes.
pub const MAX_ACTOR_RANKS: usize = 3;
/// Longest extra wait per rank before a fallback instance acts (see [`fallback_delay`]).
pub const MAX_FALLBACK_DELAY: Duration = Duration::from_secs(120);
/// How soon to look again after a lookup that neither confirmed nor refuted absence (at most; see
/// [`check_interval`]).
pub const UNKNOWN_RECHECK: Duration = Duration::from_secs(30);

/// How often the shell looks at the candidates, and how soon it asks again after an "unknown"
/// answer: a tenth of the grace period, between 1 s and [`UNKNOWN_RECHECK`] (30 s for the default
/// 5m grace period). Shorter grace periods (tests, impatient admins) get proportionally prompt checks
/// without a busy loop.
pub fn check_interval(grace_period: Duration) -> Duration {
    (grace_period / 10).clamp(Duration::from_secs(1), UNKNOWN_RECHECK)
}

/// When an absence first seen at `first_absent` may be acted on by the instance of rendezvous
/// `rank`: after the grace period, plus `fallback_delay` per rank. The one grace rule for a missing
/// node, for its volumes here and for provisioning intents left on it
/// (`provision::controller::gone_node`, where the actor is chosen per claim: rank 0).
pub fn grace_deadline(
    first_absent: Instant,
    grace_period: Duration,
    fallback_delay: Duration,
    rank: usize,
) -> Instant {
    let extra = fallback_delay.saturating_mul(u32::try_from(rank).unwrap_or(u32::MAX));
    first_absent + grace_period.saturating_add(extra)
}

/// Extra wait per rendezvous rank before a fallback instance acts: half the grace period, between
/// 1 s and [`MAX_FALLBACK_DELAY`] (2 minutes for the default 5m grace period). An admin who shortens
/// the grace period wants a prompt answer even when the first instance is stuck; the fallback
/// re-reads the PV before acting, so a late first instance and its fallback do not both act.
pub fn fallback_delay(grace_period: Duration) -> Duration {
    (grace_period / 2).clamp(Duration::from_secs(1), MAX_FALLBACK_DELAY)
}

/// Rendezvous key of the dead-node clean-up for one driver. In node mode each instance watches only
/// its own node's PVs, so nobody sees a dead node's PVs except the instance that lists them; the
/// clean-up therefore is one job per driver (discover, then act), handed to the first live instance
/// in rendezvous order for this key, with the next ones as fallbacks.
pub fn janitor_key(driver: &str) -> String {
    format!("{driver}/deleted-node-cleanup")
}

/// This instance's rank for `key` among `live` instances (the nodes whose CSINode lists our
/// driver). Controller mode has a single active instance: always rank 0. `None`: do not track.
pub fn actor_rank<'a, I>(mode: Mode, key: &str, me: &str, live: I) -> Option<usize>
where
    I: IntoIterator<Item = &'a str>,
{
    match mode {
        Mode::Controller => Some(0),
        Mode::Node => rendezvous::rank_of(key, me, live).filter(|r| *r < MAX_ACTOR_RANKS),
    }
}

/// How to find the node `pv` lives on, or why it is not node-local.
pub fn node_query(
    pv: &PersistentVolume,
    mode: Mode,
    keys: &PerNodeKeys,
) -> Result<NodeQuery, Skip> {
    let recorded = annotation(&pv.metadata, names::ANN_NODE_NAME);
    let affinity = pv.spec.as_ref().and_then(|s| s.node_affinity.as_ref());
    let by_record = |name: &str| NodeQuery::ByName {
        name: name.to_owned(),
        uid: annotation(&pv.metadata, names::ANN_NODE_UID).map(str::to_owned),
    };
    match (recorded, pin_of(affinity, keys, recorded)) {
        (_, Pin::Spread) => Err(Skip::NotNodeLocal),
        (Some(name), Pin::Node(_)) => Ok(by_record(name)),
        // Without affinity every instance may reach the volume in controller mode (one controller
        // plugin serves all nodes), so only node mode trusts the record alone.
        (Some(name), Pin::NoAffinity) if mode == Mode::Node => Ok(by_record(name)),
        (Some(_), Pin::NoAffinity) => Err(Skip::NotNodeLocal),
        (None, Pin::Node(query)) => Ok(query),
        (None, Pin::NoAffinity) => Err(Skip::NoNodeKnown),
    }
}

// === Which volumes are candidates ===

/// Why a PV is not (or no longer) a dead-node candidate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Skip {
    /// Not a CSI volume of our driver.
    NotOurDriver,
    /// Reclaim policy other than `Delete`: the admin keeps it.
    NotDeletePolicy,
    /// Being deleted without our finalizer: someone else's business (upstream "already handled").
    AlreadyHandled,
    /// Bound, and `--deleted-node-pvc-cleanup` is off (or the claim reference has no UID).
    BoundClaimKept,
    /// `Pending`, `Available`, `Failed` or no phase.
    NotReleased,
    /// The affinity can be satisfied by more than one node (zonal volume), or in controller mode a
    /// volume without affinity: other nodes or the controller plugin can still reach it.
    NotNodeLocal,
    /// No node recorded and no affinity: where it lived is unknown.
    NoNodeKnown,
}

/// A claim to delete, with its UID as the delete precondition (local-static-provisioner does the
/// same): a claim re-created under the same name is another object and is never touched.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClaimToDelete {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// UID from the PV's `claimRef`: the `DeleteParams` precondition.
    pub uid: String,
}

/// What answering a candidate means.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// A released volume (or one deleted first, whose claim is gone).
    Volume {
        /// The PV object still has to be deleted (no deletionTimestamp yet).
        delete_object: bool,
        /// Our deletion-protection finalizer is on it.
        remove_finalizer: bool,
    },
    /// Opt-in: the claim still bound to it.
    Claim(ClaimToDelete),
}

/// A dead-node candidate: where its node is looked up and what answering it means.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Candidate {
    /// The lookup that decides absence.
    pub query: NodeQuery,
    /// The action once absence is confirmed.
    pub target: Target,
}

/// Whether `pv` is a dead-node candidate under `config` (independent of any node's existence).
pub fn classify(pv: &PersistentVolume, config: &GoneConfig) -> Result<Candidate, Skip> {
    let spec = pv.spec.as_ref().ok_or(Skip::NotOurDriver)?;
    if spec.csi.as_ref().map(|c| c.driver.as_str()) != Some(config.driver.as_str()) {
        return Err(Skip::NotOurDriver);
    }
    if spec.persistent_volume_reclaim_policy.as_deref() != Some("Delete") {
        return Err(Skip::NotDeletePolicy);
    }
    let has_finalizer = pv
        .metadata
        .finalizers
        .iter()
        .flatten()
        .any(|f| f == names::FINALIZER_PV_DELETION_PROTECTION);
    let deleting = pv.metadata.deletion_timestamp.is_some();
    if deleting && !has_finalizer {
        return Err(Skip::AlreadyHandled);
    }
    let phase = pv.status.as_ref().and_then(|s| s.phase.as_deref());
    let target = match phase {
        Some("Released") => Target::Volume {
            delete_object: !deleting,
            remove_finalizer: has_finalizer,
        },
        Some("Bound") => {
            let claim = spec.claim_ref.as_ref();
            match (
                config.pvc_cleanup,
                claim.and_then(|c| c.namespace.as_deref()),
                claim.and_then(|c| c.name.as_deref()),
                claim.and_then(|c| c.uid.as_deref()),
            ) {
                (true, Some(namespace), Some(name), Some(uid)) if !uid.is_empty() => {
                    Target::Claim(ClaimToDelete {
                        namespace: namespace.to_owned(),
                        name: name.to_owned(),
                        uid: uid.to_owned(),
                    })
                }
                _ => return Err(Skip::BoundClaimKept),
            }
        }
        _ => return Err(Skip::NotReleased),
    };
    let query = node_query(pv, config.mode, &config.per_node_keys)?;
    Ok(Candidate { query, target })
}

/// Whether `pvc` is the very claim `pv` is bound to: same UID as the PV's `claimRef` and
/// `spec.volumeName` naming the PV (local-static-provisioner's bond check). The shell checks this
/// on a fresh read before deleting a claim for [`Target::Claim`].
pub fn claim_bond_matches(pv: &PersistentVolume, pvc: &PersistentVolumeClaim) -> bool {
    let claim_uid = pv
        .spec
        .as_ref()
        .and_then(|s| s.claim_ref.as_ref())
        .and_then(|c| c.uid.as_deref());
    let volume_name = pvc.spec.as_ref().and_then(|s| s.volume_name.as_deref());
    claim_uid.is_some()
        && claim_uid == pvc.metadata.uid.as_deref()
        && volume_name.is_some()
        && volume_name == pv.metadata.name.as_deref()
}

// === The tracker ===

/// Settings of the dead-node clean-up.
#[derive(Clone, Debug)]
pub struct GoneConfig {
    /// Our driver's name.
    pub driver: String,
    /// Deployment mode.
    pub mode: Mode,
    /// `--deleted-node-grace-period`.
    pub grace_period: Duration,
    /// Extra wait per rendezvous rank ([`fallback_delay`]).
    pub fallback_delay: Duration,
    /// `--deleted-node-pvc-cleanup`.
    pub pvc_cleanup: bool,
    /// Keys whose value identifies one node.
    pub per_node_keys: PerNodeKeys,
    /// How soon to ask again after an answer that is neither presence nor absence.
    pub unknown_recheck: Duration,
}

impl GoneConfig {
    /// Defaults for everything but the flags.
    pub fn new(driver: &str, mode: Mode, grace_period: Duration, pvc_cleanup: bool) -> Self {
        Self {
            driver: driver.to_owned(),
            mode,
            grace_period,
            fallback_delay: fallback_delay(grace_period),
            pvc_cleanup,
            per_node_keys: PerNodeKeys::default(),
            unknown_recheck: UNKNOWN_RECHECK,
        }
    }
}

/// A point in time on both clocks: the monotonic one decides (immune to wall-clock steps), the
/// wall one is only printed ("missing since ...").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Now {
    /// Monotonic time.
    pub instant: Instant,
    /// Wall time.
    pub wall: jiff::Timestamp,
}

impl Now {
    /// The current time.
    pub fn system() -> Self {
        Self {
            instant: Instant::now(),
            wall: jiff::Timestamp::now(),
        }
    }

    /// This time plus `d` on both clocks (tests and timers).
    pub fn after(self, d: Duration) -> Self {
        let wall = jiff::SignedDuration::try_from(d)
            .ok()
            .and_then(|sd| self.wall.checked_add(sd).ok())
            .unwrap_or(self.wall);
        Self {
            instant: self.instant + d,
            wall,
        }
    }
}

/// Where a [`NodeLookup`] came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LookupSource {
    /// A watch-fed cache: may start the timer, never decides.
    Cache,
    /// A live API call made just now (together with a live read of the PV).
    Live,
}

/// One lookup fed to [`NodeGoneTracker::observe`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lookup {
    /// Where it came from.
    pub source: LookupSource,
    /// What it said.
    pub result: NodeLookup,
}

impl Lookup {
    /// From a synced cache.
    pub fn cached(result: NodeLookup) -> Self {
        Self {
            source: LookupSource::Cache,
            result,
        }
    }

    /// From a live API call.
    pub fn live(result: NodeLookup) -> Self {
        Self {
            source: LookupSource::Live,
            result,
        }
    }
}

/// What the shell does next for one PV.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GoneAction {
    /// Nothing to do or wait for.
    Nothing,
    /// Observe this PV again at `deadline` (idempotent: the same deadline is returned while waiting).
    StartTimer {
        /// When to look again.
        deadline: Instant,
    },
    /// The grace period is over: look `query` up live (GET by name, or label-selected LIST), re-read
    /// the PV live (404: forget it), and observe again with [`Lookup::live`].
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
pub enum CancelReason {
    /// The node exists (again), with the recorded UID when one was recorded.
    NodePresent,
    /// The PV is no longer a candidate.
    NotCandidate(Skip),
    /// Another instance ranks ahead (instances came or went).
    NotActor,
}

/// The writes that answer a PV whose node is gone; the shell executes them in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GonePlan {
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
pub struct GoneEvent {
    /// Always [`names::EVENT_VOLUME_NODE_GONE`], type Normal.
    pub reason: &'static str,
    /// Which node was missing, since when, and what was done.
    pub message: String,
}

#[derive(Clone, Debug)]
struct Entry {
    pv_uid: String,
    query: NodeQuery,
    first_absent: Now,
    rank: usize,
}

/// Per-PV memory of when each volume's node was first seen absent (in memory only: after a restart
/// the grace period starts again, which only delays a clean-up).
#[derive(Clone, Debug)]
pub struct NodeGoneTracker {
    config: GoneConfig,
    entries: HashMap<String, Entry>,
}

enum Verdict {
    Present,
    Absent(Absence),
    Unknown,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Absence {
    Missing,
    Replaced { current_uid: String },
}

impl NodeGoneTracker {
    /// An empty tracker.
    pub fn new(config: GoneConfig) -> Self {
        Self {
            config,
            entries: HashMap::new(),
        }
    }

    /// The settings.
    pub fn config(&self) -> &GoneConfig {
        &self.config
    }

    /// Feeds one observation of `pv` (with the lookup of its node made for [`node_query`] /
    /// [`Candidate::query`]) and this instance's `rank` ([`actor_rank`]; `None` = not an actor).
    pub fn observe(
        &mut self,
        pv: &PersistentVolume,
        lookup: &Lookup,
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
        let absence = match judge(&candidate.query, &lookup.result) {
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
        let pv_uid = pv.metadata.uid.clone().unwrap_or_default();
        let entry = self.entries.entry(name.clone()).or_insert_with(|| Entry {
            pv_uid: pv_uid.clone(),
            query: candidate.query.clone(),
            first_absent: now,
            rank,
        });
        if entry.pv_uid != pv_uid || entry.query != candidate.query {
            // Another PV of the same name, or another node recorded: start over.
            *entry = Entry {
                pv_uid,
                query: candidate.query.clone(),
                first_absent: now,
                rank,
            };
        }
        entry.rank = rank;
        let entry = entry.clone();
        let deadline = self.deadline(&entry);
        if now.instant < deadline {
            return GoneAction::StartTimer { deadline };
        }
        match lookup.source {
            LookupSource::Cache => GoneAction::ConfirmLive {
                query: candidate.query,
            },
            LookupSource::Live => {
                GoneAction::ActOnPv(self.plan(&name, &entry, &candidate, &absence))
            }
        }
    }

    /// Replaces the per-node keys (controller mode learns them from CSINodes and Nodes, which can
    /// change). A volume whose node query changes with them starts its grace period over.
    pub fn set_per_node_keys(&mut self, keys: PerNodeKeys) {
        self.config.per_node_keys = keys;
    }

    /// Names of the PVs being tracked.
    pub fn tracked(&self) -> impl Iterator<Item = &str> {
        self.entries.keys().map(String::as_str)
    }

    /// Drops a PV (deleted, answered, or this instance stopped running the clean-up).
    pub fn forget(&mut self, pv: &str) {
        self.entries.remove(pv);
    }

    /// Keeps only the PVs in `names` (after a re-list, drop volumes that disappeared meanwhile).
    pub fn retain<'a, I>(&mut self, names: I)
    where
        I: IntoIterator<Item = &'a str>,
    {
        let keep: BTreeSet<&str> = names.into_iter().collect();
        self.entries.retain(|name, _| keep.contains(name.as_str()));
    }

    /// PVs this instance waits on as the first-ranked actor: the value of
    /// `csi_provisioner_volumes_waiting_for_missing_node` (fallback ranks are not counted, so the
    /// sum over instances counts each volume once).
    pub fn waiting(&self) -> usize {
        self.entries.values().filter(|e| e.rank == 0).count()
    }

    /// When `pv`'s node was first seen absent, if it is being tracked.
    pub fn first_absent(&self, pv: &str) -> Option<Now> {
        self.entries.get(pv).map(|e| e.first_absent)
    }

    fn deadline(&self, entry: &Entry) -> Instant {
        grace_deadline(
            entry.first_absent.instant,
            self.config.grace_period,
            self.config.fallback_delay,
            entry.rank,
        )
    }

    fn cancel(&mut self, pv: &str, reason: CancelReason) -> GoneAction {
        match self.entries.remove(pv) {
            Some(_) => GoneAction::Cancel(reason),
            None => GoneAction::Nothing,
        }
    }

    fn plan(&self, pv: &str, entry: &Entry, candidate: &Candidate, absence: &Absence) -> GonePlan {
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
        match &candidate.target {
            Target::Volume {
                delete_object,
                remove_finalizer,
            } => GonePlan::RemovePv {
                pv: pv.to_owned(),
                pv_uid: entry.pv_uid.clone(),
                delete_object: *delete_object,
                remove_finalizer: *remove_finalizer,
                event: GoneEvent {
                    reason: names::EVENT_VOLUME_NODE_GONE,
                    message: format!(
                        "Volume answered as deleted without calling DeleteVolume: its {what} \
                         ({since}); its data is considered lost with the node"
                    ),
                },
            },
            Target::Claim(claim) => GonePlan::DeleteClaim {
                pv: pv.to_owned(),
                claim: claim.clone(),
                event: GoneEvent {
                    reason: names::EVENT_VOLUME_NODE_GONE,
                    message: format!(
                        "Deleted claim {}/{} (UID {}) bound to this volume because its {what} \
                         ({since}); --deleted-node-pvc-cleanup is on",
                        claim.namespace, claim.name, claim.uid
                    ),
                },
            },
        }
    }
}

fn judge(query: &NodeQuery, result: &NodeLookup) -> Verdict {
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
#[path = "gone_tests.rs"]
mod tests;
