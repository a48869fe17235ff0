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
use std::fmt;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, VolumeNodeAffinity};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::k8s::errors::{ApiErrorClass, classify as classify_api_error};
use crate::names;
use crate::node::rendezvous;

/// The well-known label every kubelet sets to its host name.
pub const HOSTNAME_LABEL: &str = "kubernetes.io/hostname";
/// Only this many instances (the first in rendezvous order) track a volume: one actor and two
/// fallbacks. The rest hold no state for it, so memory does not grow with the number of nodes.
pub const MAX_ACTOR_RANKS: usize = 3;
/// Extra wait per rank before a fallback instance acts.
pub const DEFAULT_FALLBACK_DELAY: Duration = Duration::from_secs(120);
/// How soon to look again after a lookup that neither confirmed nor refuted absence.
pub const UNKNOWN_RECHECK: Duration = Duration::from_secs(30);

/// How the sidecar is deployed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// `--node-deployment`: one instance per node.
    Node,
    /// One (leader-elected) instance beside the controller plugin.
    Controller,
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

// === Which node a volume lives on ===

/// Node-affinity keys whose single `In` value identifies exactly one node: always
/// `kubernetes.io/hostname`, plus driver topology keys whose value is the node's name or host name
/// (e.g. `topology.hostpath.csi/node`). Zone or region keys never qualify, so zonal volumes are
/// never taken for node-local ones.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PerNodeKeys(BTreeSet<String>);

impl Default for PerNodeKeys {
    fn default() -> Self {
        Self([HOSTNAME_LABEL.to_owned()].into())
    }
}

impl PerNodeKeys {
    /// `kubernetes.io/hostname` plus `extra`.
    pub fn new<I, S>(extra: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let mut keys = Self::default();
        keys.0.extend(extra.into_iter().map(Into::into));
        keys
    }

    /// Derives the per-node keys from one node running our driver: its name, its
    /// `kubernetes.io/hostname` label, and its topology segments (node mode: our `NodeGetInfo`
    /// segments; controller mode: any CSINode's topology keys resolved against that Node's labels).
    pub fn from_node<'a, I>(node_name: &str, hostname: Option<&str>, segments: I) -> Self
    where
        I: IntoIterator<Item = (&'a String, &'a String)>,
    {
        Self::new(
            segments
                .into_iter()
                .filter(|(_, value)| {
                    value.as_str() == node_name || Some(value.as_str()) == hostname
                })
                .map(|(key, _)| key.clone()),
        )
    }

    /// Whether `key` identifies a single node.
    pub fn contains(&self, key: &str) -> bool {
        self.0.contains(key)
    }

    /// The keys (for the Node metadata stripping in [`crate::node::scope`]).
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.0.iter().map(String::as_str)
    }
}

/// How to find the node a volume lives on.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum NodeQuery {
    /// The Node named `name` (GET); with `uid`, a Node of that name with another UID is a new node.
    ByName {
        /// Node name.
        name: String,
        /// UID recorded at provisioning, when known.
        uid: Option<String>,
    },
    /// Any Node labelled `key=value` (label-selected LIST): PVs without our annotations.
    ByLabel {
        /// A [`PerNodeKeys`] key.
        key: String,
        /// Its value in the PV's node affinity.
        value: String,
    },
}

impl NodeQuery {
    /// The node's name as far as we know it (the label value for label lookups): for messages,
    /// logs, and the scoping label.
    pub fn node_name(&self) -> &str {
        match self {
            Self::ByName { name, .. } => name,
            Self::ByLabel { value, .. } => value,
        }
    }

    /// Label selector of the live LIST for [`NodeQuery::ByLabel`] (`None`: GET by name instead).
    pub fn label_selector(&self) -> Option<String> {
        match self {
            Self::ByName { .. } => None,
            Self::ByLabel { key, value } => Some(format!("{key}={value}")),
        }
    }

    /// Looks the node up in a synced Node cache (metadata is enough: readiness is never read).
    pub fn lookup_in<'a, I>(&self, nodes: I) -> NodeLookup
    where
        I: IntoIterator<Item = &'a ObjectMeta>,
    {
        let found = nodes.into_iter().find(|meta| match self {
            Self::ByName { name, .. } => meta.name.as_deref() == Some(name.as_str()),
            Self::ByLabel { key, value } => meta
                .labels
                .as_ref()
                .and_then(|l| l.get(key))
                .is_some_and(|v| v == value),
        });
        match found {
            Some(meta) => NodeLookup::Found {
                uid: meta.uid.clone(),
            },
            None => NodeLookup::NotFound,
        }
    }
}

impl fmt::Display for NodeQuery {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::ByName {
                name,
                uid: Some(uid),
            } => write!(f, "node {name:?} (UID {uid})"),
            Self::ByName { name, uid: None } => write!(f, "node {name:?}"),
            Self::ByLabel { key, value } => write!(f, "node labelled {key}={value}"),
        }
    }
}

/// The answer to a node lookup.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NodeLookup {
    /// A matching Node exists (whatever its readiness), with its UID when known.
    Found {
        /// `metadata.uid`.
        uid: Option<String>,
    },
    /// No matching Node: absent from the synced cache, a live GET answered 404, or a live
    /// label-selected LIST came back empty.
    NotFound,
    /// Anything else: never evidence of absence.
    Failed {
        /// What went wrong, for the log.
        reason: String,
    },
}

impl NodeLookup {
    /// Maps a live `Api::get_opt` / `Api::get` result for [`NodeQuery::ByName`]. Only a 404 is
    /// absence; every other error is [`NodeLookup::Failed`].
    pub fn from_get<K: kube::Resource>(result: &Result<Option<K>, kube::Error>) -> Self {
        match result {
            Ok(Some(node)) => Self::Found {
                uid: node.meta().uid.clone(),
            },
            Ok(None) => Self::NotFound,
            Err(e) if classify_api_error(e) == ApiErrorClass::NotFound => Self::NotFound,
            Err(e) => Self::Failed {
                reason: format!("{} error: {e}", classify_api_error(e)),
            },
        }
    }

    /// Maps a live label-selected LIST (`Api::list_metadata` items) for [`NodeQuery::ByLabel`]: an
    /// empty list is absence, an error never is.
    pub fn from_list<K: kube::Resource>(result: &Result<Vec<K>, kube::Error>) -> Self {
        match result {
            Ok(items) => match items.first() {
                Some(node) => Self::Found {
                    uid: node.meta().uid.clone(),
                },
                None => Self::NotFound,
            },
            Err(e) => Self::Failed {
                reason: format!("{} error: {e}", classify_api_error(e)),
            },
        }
    }
}

/// What a node affinity says about where a volume lives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Pin {
    /// No required node affinity.
    NoAffinity,
    /// Every term pins the same single node (query without a UID).
    Node(NodeQuery),
    /// Some term can be satisfied by more than one node (zonal, or several nodes): not node-local.
    Spread,
}

/// Reads the single node a volume's affinity pins, if any. A term pins a node when it has
/// `matchFields metadata.name In [x]`, or a `matchExpressions` entry `k In [v]` with one value where
/// `k` is a [`PerNodeKeys`] key or `v` is the `recorded` node name. Every term must pin the same
/// node (terms are ORed: one unpinned term lets other nodes satisfy the affinity).
pub fn pin_of(
    affinity: Option<&VolumeNodeAffinity>,
    keys: &PerNodeKeys,
    recorded: Option<&str>,
) -> Pin {
    let terms = match affinity.and_then(|a| a.required.as_ref()) {
        Some(selector) if !selector.node_selector_terms.is_empty() => &selector.node_selector_terms,
        _ => return Pin::NoAffinity,
    };
    let mut pinned: Option<NodeQuery> = None;
    for term in terms {
        let by_name = term.match_fields.iter().flatten().find_map(|r| {
            (r.key == "metadata.name" && r.operator == "In")
                .then(|| single(r.values.as_deref()))
                .flatten()
                .map(|name| NodeQuery::ByName {
                    name: name.to_owned(),
                    uid: None,
                })
        });
        let mut by_label: Vec<NodeQuery> = term
            .match_expressions
            .iter()
            .flatten()
            .filter(|r| r.operator == "In")
            .filter_map(|r| {
                let value = single(r.values.as_deref())?;
                (keys.contains(&r.key) || recorded == Some(value)).then(|| NodeQuery::ByLabel {
                    key: r.key.clone(),
                    value: value.to_owned(),
                })
            })
            .collect();
        // Deterministic preference: the hostname label, then keys in order.
        by_label.sort_by_key(|q| match q {
            NodeQuery::ByLabel { key, .. } => (key != HOSTNAME_LABEL, key.clone()),
            NodeQuery::ByName { .. } => (false, String::new()),
        });
        let Some(this) = by_name.or_else(|| by_label.into_iter().next()) else {
            return Pin::Spread;
        };
        match &pinned {
            None => pinned = Some(this),
            Some(previous) if *previous == this => {}
            Some(_) => return Pin::Spread,
        }
    }
    pinned.map_or(Pin::NoAffinity, Pin::Node)
}

fn single(values: Option<&[String]>) -> Option<&str> {
    match values {
        Some([one]) if !one.is_empty() => Some(one.as_str()),
        _ => None,
    }
}

fn annotation<'a>(meta: &'a ObjectMeta, key: &str) -> Option<&'a str> {
    meta.annotations
        .as_ref()?
        .get(key)
        .map(String::as_str)
        .filter(|v| !v.is_empty())
}

/// The annotations recording the provisioning node on a new PV ([`names::ANN_NODE_NAME`],
/// [`names::ANN_NODE_UID`]). Node mode: our own Node; controller mode: the selected Node when it is
/// in the cache. They serve the node-name-reuse check and PVs without node affinity.
pub fn provisioning_node_annotations(
    node_name: &str,
    node_uid: Option<&str>,
) -> Vec<(&'static str, String)> {
    let mut out = vec![(names::ANN_NODE_NAME, node_name.to_owned())];
    if let Some(uid) = node_uid.filter(|u| !u.is_empty()) {
        out.push((names::ANN_NODE_UID, uid.to_owned()));
    }
    out
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
    /// Extra wait per rendezvous rank ([`DEFAULT_FALLBACK_DELAY`]).
    pub fallback_delay: Duration,
    /// `--deleted-node-pvc-cleanup`.
    pub pvc_cleanup: bool,
    /// Keys whose value identifies one node.
    pub per_node_keys: PerNodeKeys,
}

impl GoneConfig {
    /// Defaults for everything but the flags.
    pub fn new(driver: &str, mode: Mode, grace_period: Duration, pvc_cleanup: bool) -> Self {
        Self {
            driver: driver.to_owned(),
            mode,
            grace_period,
            fallback_delay: DEFAULT_FALLBACK_DELAY,
            pvc_cleanup,
            per_node_keys: PerNodeKeys::default(),
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
                let retry = now.instant + UNKNOWN_RECHECK;
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
        let extra = self
            .config
            .fallback_delay
            .saturating_mul(u32::try_from(entry.rank).unwrap_or(u32::MAX));
        entry.first_absent.instant + self.config.grace_period.saturating_add(extra)
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
            go_duration(self.config.grace_period)
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

/// A duration the way Go prints it for whole seconds (`5m0s`, `1h0m0s`, `45s`), matching how
/// the flag's value is written.
pub fn go_duration(d: Duration) -> String {
    let total = d.as_secs();
    let (h, m, s) = (total / 3600, (total / 60) % 60, total % 60);
    match (h, m) {
        (0, 0) => format!("{s}s"),
        (0, _) => format!("{m}m{s}s"),
        _ => format!("{h}h{m}m{s}s"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{PvBuilder, node, pv, pvc};
    use k8s_openapi::api::core::v1::{
        NodeCondition, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, NodeStatus,
    };
    use kube::core::Status;

    const DRIVER: &str = crate::testing::DRIVER;
    const GRACE: Duration = Duration::from_secs(300);

    fn config() -> GoneConfig {
        GoneConfig::new(DRIVER, Mode::Node, GRACE, false)
    }

    fn t0() -> Now {
        Now {
            instant: Instant::now(),
            wall: jiff::Timestamp::from_second(1_700_000_000).unwrap(),
        }
    }

    /// A released PV of our driver pinned to `node` by hostname, recording `node` with `uid`.
    fn released_on(node: &str, uid: &str) -> PvBuilder {
        pv("pv-1")
            .reclaim("Delete")
            .phase("Released")
            .finalizer(names::FINALIZER_PV_DELETION_PROTECTION)
            .node_affinity([(HOSTNAME_LABEL, node)])
            .annotation(names::ANN_NODE_NAME, node)
            .annotation(names::ANN_NODE_UID, uid)
    }

    fn api_error(code: u16) -> kube::Error {
        kube::Error::Api(Status::failure("boom", "").with_code(code).boxed())
    }

    fn get(result: Result<Option<k8s_openapi::api::core::v1::Node>, kube::Error>) -> NodeLookup {
        NodeLookup::from_get(&result)
    }

    /// Runs the happy path to the end of the grace period and returns the tracker there.
    fn waited_out(volume: &PersistentVolume) -> (NodeGoneTracker, Now) {
        let mut t = NodeGoneTracker::new(config());
        let start = t0();
        let first = t.observe(
            volume,
            &Lookup::cached(NodeLookup::NotFound),
            Some(0),
            start,
        );
        assert_eq!(
            first,
            GoneAction::StartTimer {
                deadline: start.instant + GRACE
            }
        );
        (t, start.after(GRACE))
    }

    #[test]
    fn a_missing_node_starts_the_grace_period_then_is_confirmed_live_then_acted_on() {
        let volume = released_on("n1", "u1").build();
        let (mut t, end) = waited_out(&volume);
        assert_eq!(t.waiting(), 1);

        let halfway = t0().after(GRACE / 2);
        assert!(matches!(
            t.observe(
                &volume,
                &Lookup::cached(NodeLookup::NotFound),
                Some(0),
                halfway
            ),
            GoneAction::StartTimer { .. }
        ));

        let confirm = t.observe(&volume, &Lookup::cached(NodeLookup::NotFound), Some(0), end);
        assert_eq!(
            confirm,
            GoneAction::ConfirmLive {
                query: NodeQuery::ByName {
                    name: "n1".into(),
                    uid: Some("u1".into())
                }
            },
            "the cache alone never decides"
        );
        let live = Lookup::live(get(Err(api_error(404))));
        let GoneAction::ActOnPv(GonePlan::RemovePv {
            pv,
            pv_uid,
            delete_object,
            remove_finalizer,
            event,
        }) = t.observe(&volume, &live, Some(0), end)
        else {
            panic!("expected the PV to be answered as deleted");
        };
        assert_eq!((pv.as_str(), pv_uid.as_str()), ("pv-1", "uid-pv-1"));
        assert!(delete_object && remove_finalizer);
        assert_eq!(event.reason, "VolumeNodeGone");
        assert!(
            event
                .message
                .contains("node \"n1\" (UID u1) no longer exists"),
            "{}",
            event.message
        );
        assert!(
            event.message.contains("missing since 2023-11-14T22:13:20Z"),
            "{}",
            event.message
        );
        assert!(
            event.message.contains("grace period of 5m0s"),
            "{}",
            event.message
        );
        t.forget("pv-1");
        assert_eq!(t.waiting(), 0);
    }

    #[test]
    fn a_live_404_before_the_grace_period_ends_only_waits() {
        let volume = released_on("n1", "u1").build();
        let mut t = NodeGoneTracker::new(config());
        let live = Lookup::live(NodeLookup::NotFound);
        let start = t0();
        assert!(matches!(
            t.observe(&volume, &live, Some(0), start),
            GoneAction::StartTimer { .. }
        ));
        let almost = start.after(GRACE - Duration::from_secs(1));
        assert_eq!(
            t.observe(&volume, &live, Some(0), almost),
            GoneAction::StartTimer {
                deadline: start.instant + GRACE
            }
        );
    }

    #[test]
    fn a_node_recreated_with_the_recorded_uid_within_the_grace_period_cancels() {
        let volume = released_on("n1", "u1").build();
        let mut t = NodeGoneTracker::new(config());
        let start = t0();
        t.observe(
            &volume,
            &Lookup::cached(NodeLookup::NotFound),
            Some(0),
            start,
        );
        let back = NodeLookup::Found {
            uid: Some("u1".into()),
        };
        assert_eq!(
            t.observe(
                &volume,
                &Lookup::cached(back.clone()),
                Some(0),
                start.after(GRACE / 2)
            ),
            GoneAction::Cancel(CancelReason::NodePresent)
        );
        assert_eq!(t.waiting(), 0);
        // Absent again later: a fresh, full grace period.
        let later = start.after(GRACE);
        assert_eq!(
            t.observe(
                &volume,
                &Lookup::cached(NodeLookup::NotFound),
                Some(0),
                later
            ),
            GoneAction::StartTimer {
                deadline: later.instant + GRACE
            }
        );
    }

    #[test]
    fn a_node_that_reappears_at_the_live_check_cancels() {
        let volume = released_on("n1", "u1").build();
        let (mut t, end) = waited_out(&volume);
        let found = node("n1").uid("u1").build();
        assert_eq!(
            t.observe(&volume, &Lookup::live(get(Ok(Some(found)))), Some(0), end),
            GoneAction::Cancel(CancelReason::NodePresent)
        );
    }

    #[test]
    fn a_node_of_the_same_name_with_another_uid_counts_as_gone() {
        let volume = released_on("n1", "u1").build();
        let (mut t, end) = waited_out(&volume);
        // The cache shows a new n1 the whole time; still gone.
        let new_n1 = node("n1").uid("u2").build();
        let cached = NodeQuery::ByName {
            name: "n1".into(),
            uid: Some("u1".into()),
        }
        .lookup_in([&new_n1.metadata]);
        assert_eq!(
            cached,
            NodeLookup::Found {
                uid: Some("u2".into())
            }
        );
        assert!(matches!(
            t.observe(&volume, &Lookup::cached(cached), Some(0), end),
            GoneAction::ConfirmLive { .. }
        ));
        let action = t.observe(&volume, &Lookup::live(get(Ok(Some(new_n1)))), Some(0), end);
        let GoneAction::ActOnPv(GonePlan::RemovePv { event, .. }) = action else {
            panic!("expected the PV to be answered as deleted, got {action:?}");
        };
        assert!(
            event
                .message
                .contains("was replaced by a new node of the same name (UID u2)"),
            "{}",
            event.message
        );
    }

    #[test]
    fn server_errors_and_timeouts_never_count_as_absence() {
        let volume = released_on("n1", "u1").build();
        let timeout = kube::Error::Service(Box::new(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            "deadline exceeded",
        )));
        for error in [
            api_error(500),
            api_error(503),
            api_error(429),
            api_error(403),
            timeout,
        ] {
            let lookup = get(Err(error));
            assert!(matches!(lookup, NodeLookup::Failed { .. }), "{lookup:?}");

            // Never starts a clean-up on its own...
            let mut t = NodeGoneTracker::new(config());
            let start = t0();
            for minute in 0..30 {
                let now = start.after(Duration::from_secs(60 * minute));
                let action = t.observe(&volume, &Lookup::live(lookup.clone()), Some(0), now);
                assert!(
                    matches!(action, GoneAction::StartTimer { .. }),
                    "minute {minute}: {action:?}"
                );
            }
            assert_eq!(t.waiting(), 0);

            // ...and never confirms one that the cache started.
            let (mut t, end) = waited_out(&volume);
            let action = t.observe(&volume, &Lookup::live(lookup), Some(0), end);
            assert_eq!(
                action,
                GoneAction::StartTimer {
                    deadline: end.instant + UNKNOWN_RECHECK
                }
            );
            assert_eq!(t.waiting(), 1, "the first-absent time is kept");
        }
    }

    #[test]
    fn an_empty_label_list_is_absence_and_a_failed_list_is_not() {
        let found: Result<Vec<k8s_openapi::api::core::v1::Node>, kube::Error> =
            Ok(vec![node("n1").build()]);
        assert!(matches!(
            NodeLookup::from_list(&found),
            NodeLookup::Found { .. }
        ));
        let empty: Result<Vec<k8s_openapi::api::core::v1::Node>, kube::Error> = Ok(vec![]);
        assert_eq!(NodeLookup::from_list(&empty), NodeLookup::NotFound);
        let failed: Result<Vec<k8s_openapi::api::core::v1::Node>, kube::Error> =
            Err(api_error(503));
        assert!(matches!(
            NodeLookup::from_list(&failed),
            NodeLookup::Failed { .. }
        ));
    }

    #[test]
    fn a_not_ready_node_is_not_absent() {
        let mut not_ready = node("n1").uid("u1").build();
        not_ready.status = Some(NodeStatus {
            conditions: Some(vec![NodeCondition {
                type_: "Ready".into(),
                status: "False".into(),
                ..NodeCondition::default()
            }]),
            ..NodeStatus::default()
        });
        let query = NodeQuery::ByName {
            name: "n1".into(),
            uid: Some("u1".into()),
        };
        assert_eq!(
            query.lookup_in([&not_ready.metadata]),
            NodeLookup::Found {
                uid: Some("u1".into())
            }
        );
        let volume = released_on("n1", "u1").build();
        let mut t = NodeGoneTracker::new(config());
        let lookup = Lookup::live(get(Ok(Some(not_ready))));
        assert_eq!(
            t.observe(&volume, &lookup, Some(0), t0()),
            GoneAction::Nothing
        );
        assert_eq!(
            t.observe(&volume, &lookup, Some(0), t0().after(GRACE * 10)),
            GoneAction::Nothing
        );
    }

    #[test]
    fn only_released_delete_policy_volumes_of_our_driver_pinned_to_one_node_are_candidates() {
        let cfg = config();
        let ok = released_on("n1", "u1").build();
        assert!(classify(&ok, &cfg).is_ok());
        let cases = [
            (
                released_on("n1", "u1").driver("other.csi").build(),
                Skip::NotOurDriver,
            ),
            (
                released_on("n1", "u1").reclaim("Retain").build(),
                Skip::NotDeletePolicy,
            ),
            (
                released_on("n1", "u1")
                    .phase("Bound")
                    .claim_ref("ns", "c", "cu")
                    .build(),
                Skip::BoundClaimKept,
            ),
            (
                released_on("n1", "u1").phase("Available").build(),
                Skip::NotReleased,
            ),
            (
                pv("pv-1")
                    .reclaim("Delete")
                    .phase("Released")
                    .node_affinity([("topology.kubernetes.io/zone", "z1")])
                    .annotation(names::ANN_NODE_NAME, "n1")
                    .build(),
                Skip::NotNodeLocal,
            ),
            (
                pv("pv-1").reclaim("Delete").phase("Released").build(),
                Skip::NoNodeKnown,
            ),
            (
                pv("pv-1")
                    .reclaim("Delete")
                    .phase("Released")
                    .deleting()
                    .build(),
                Skip::AlreadyHandled,
            ),
        ];
        for (volume, skip) in cases {
            assert_eq!(classify(&volume, &cfg), Err(skip));
        }
    }

    #[test]
    fn a_volume_that_stops_being_a_candidate_is_cancelled() {
        let volume = released_on("n1", "u1").build();
        let mut t = NodeGoneTracker::new(config());
        t.observe(
            &volume,
            &Lookup::cached(NodeLookup::NotFound),
            Some(0),
            t0(),
        );
        let retained = released_on("n1", "u1").reclaim("Retain").build();
        assert_eq!(
            t.observe(
                &retained,
                &Lookup::cached(NodeLookup::NotFound),
                Some(0),
                t0()
            ),
            GoneAction::Cancel(CancelReason::NotCandidate(Skip::NotDeletePolicy))
        );
    }

    #[test]
    fn a_volume_deleted_first_only_loses_our_finalizer() {
        let volume = released_on("n1", "u1").deleting().build();
        let (mut t, end) = waited_out(&volume);
        let action = t.observe(&volume, &Lookup::live(NodeLookup::NotFound), Some(0), end);
        assert!(matches!(
            action,
            GoneAction::ActOnPv(GonePlan::RemovePv {
                delete_object: false,
                remove_finalizer: true,
                ..
            })
        ));
    }

    #[test]
    fn legacy_volumes_are_found_by_their_pinned_hostname_and_a_reused_name_counts_as_present() {
        let legacy = pv("pv-1")
            .reclaim("Delete")
            .phase("Released")
            .node_affinity([(HOSTNAME_LABEL, "host-1")])
            .build();
        let candidate = classify(&legacy, &config()).unwrap();
        let query = NodeQuery::ByLabel {
            key: HOSTNAME_LABEL.into(),
            value: "host-1".into(),
        };
        assert_eq!(candidate.query, query);
        assert_eq!(
            query.label_selector().as_deref(),
            Some("kubernetes.io/hostname=host-1")
        );
        let reused = node("host-1")
            .uid("new")
            .labels([(HOSTNAME_LABEL, "host-1")])
            .build();
        assert!(matches!(
            query.lookup_in([&reused.metadata]),
            NodeLookup::Found { .. }
        ));
        let other = node("host-2").labels([(HOSTNAME_LABEL, "host-2")]).build();
        assert_eq!(query.lookup_in([&other.metadata]), NodeLookup::NotFound);
    }

    #[test]
    fn driver_topology_keys_count_as_per_node_only_when_their_value_names_the_node() {
        let segments: std::collections::BTreeMap<String, String> = [
            ("topology.hostpath.csi/node".to_owned(), "n1".to_owned()),
            ("topology.kubernetes.io/zone".to_owned(), "z1".to_owned()),
        ]
        .into();
        let keys = PerNodeKeys::from_node("n1", Some("n1.example"), &segments);
        assert!(keys.contains("topology.hostpath.csi/node"));
        assert!(keys.contains(HOSTNAME_LABEL));
        assert!(!keys.contains("topology.kubernetes.io/zone"));

        let by_topology = pv("pv-1")
            .node_affinity([
                ("topology.hostpath.csi/node", "n7"),
                ("topology.kubernetes.io/zone", "z1"),
            ])
            .build();
        let affinity = by_topology.spec.as_ref().unwrap().node_affinity.as_ref();
        assert_eq!(
            pin_of(affinity, &keys, None),
            Pin::Node(NodeQuery::ByLabel {
                key: "topology.hostpath.csi/node".into(),
                value: "n7".into()
            })
        );
        assert_eq!(pin_of(affinity, &PerNodeKeys::default(), None), Pin::Spread);
    }

    #[test]
    fn affinities_with_several_nodes_or_match_fields_pin_accordingly() {
        let keys = PerNodeKeys::default();
        let two = pv("pv")
            .node_affinity([(HOSTNAME_LABEL, "a")])
            .node_affinity([(HOSTNAME_LABEL, "b")])
            .build();
        assert_eq!(
            pin_of(
                two.spec.as_ref().unwrap().node_affinity.as_ref(),
                &keys,
                None
            ),
            Pin::Spread
        );
        let same = pv("pv")
            .node_affinity([(HOSTNAME_LABEL, "a")])
            .node_affinity([(HOSTNAME_LABEL, "a"), ("zone", "z")])
            .build();
        assert!(matches!(
            pin_of(
                same.spec.as_ref().unwrap().node_affinity.as_ref(),
                &keys,
                None
            ),
            Pin::Node(_)
        ));
        let fields = VolumeNodeAffinity {
            required: Some(NodeSelector {
                node_selector_terms: vec![NodeSelectorTerm {
                    match_expressions: None,
                    match_fields: Some(vec![NodeSelectorRequirement {
                        key: "metadata.name".into(),
                        operator: "In".into(),
                        values: Some(vec!["n3".into()]),
                    }]),
                }],
            }),
        };
        assert_eq!(
            pin_of(Some(&fields), &keys, None),
            Pin::Node(NodeQuery::ByName {
                name: "n3".into(),
                uid: None
            })
        );
        let multi_value = pv("pv").build();
        assert_eq!(
            pin_of(
                multi_value.spec.as_ref().unwrap().node_affinity.as_ref(),
                &keys,
                None
            ),
            Pin::NoAffinity
        );
    }

    #[test]
    fn a_volume_without_affinity_relies_on_the_record_in_node_mode_only() {
        let volume = pv("pv-1")
            .reclaim("Delete")
            .phase("Released")
            .annotation(names::ANN_NODE_NAME, "n1")
            .annotation(names::ANN_NODE_UID, "u1")
            .build();
        assert_eq!(
            node_query(&volume, Mode::Node, &PerNodeKeys::default()),
            Ok(NodeQuery::ByName {
                name: "n1".into(),
                uid: Some("u1".into())
            })
        );
        assert_eq!(
            node_query(&volume, Mode::Controller, &PerNodeKeys::default()),
            Err(Skip::NotNodeLocal)
        );
    }

    #[test]
    fn controller_mode_acts_on_node_local_volumes_as_the_single_instance() {
        let mut t = NodeGoneTracker::new(GoneConfig::new(DRIVER, Mode::Controller, GRACE, false));
        let volume = released_on("n1", "u1").build();
        let rank = actor_rank(Mode::Controller, &janitor_key(DRIVER), "controller-pod", []);
        assert_eq!(rank, Some(0));
        let start = t0();
        t.observe(&volume, &Lookup::cached(NodeLookup::NotFound), rank, start);
        assert!(matches!(
            t.observe(
                &volume,
                &Lookup::live(NodeLookup::NotFound),
                rank,
                start.after(GRACE)
            ),
            GoneAction::ActOnPv(_)
        ));
    }

    #[test]
    fn fallback_instances_wait_one_delay_per_rank_and_the_rest_do_not_track() {
        let volume = released_on("n1", "u1").build();
        let start = t0();
        let delay = config().fallback_delay;
        for rank in 0..MAX_ACTOR_RANKS {
            let mut t = NodeGoneTracker::new(config());
            let expected = start.instant + GRACE + delay * u32::try_from(rank).unwrap();
            assert_eq!(
                t.observe(
                    &volume,
                    &Lookup::live(NodeLookup::NotFound),
                    Some(rank),
                    start
                ),
                GoneAction::StartTimer { deadline: expected }
            );
            let just_before =
                start.after(GRACE + delay * u32::try_from(rank).unwrap() - Duration::from_secs(1));
            assert!(matches!(
                t.observe(
                    &volume,
                    &Lookup::live(NodeLookup::NotFound),
                    Some(rank),
                    just_before
                ),
                GoneAction::StartTimer { .. }
            ));
            assert_eq!(
                t.waiting(),
                usize::from(rank == 0),
                "only the primary counts in the gauge"
            );
        }
        let mut t = NodeGoneTracker::new(config());
        assert_eq!(
            t.observe(
                &volume,
                &Lookup::live(NodeLookup::NotFound),
                Some(MAX_ACTOR_RANKS),
                start
            ),
            GoneAction::Nothing
        );
        assert_eq!(
            t.observe(&volume, &Lookup::live(NodeLookup::NotFound), None, start),
            GoneAction::Nothing
        );
    }

    #[test]
    fn the_next_instance_in_rendezvous_order_becomes_the_actor_when_the_first_leaves() {
        let live = ["n1", "n2", "n3", "n4", "n5"];
        let key = janitor_key(DRIVER);
        let order = rendezvous::rendezvous_order(&key, live);
        let ranks: Vec<Option<usize>> = order
            .iter()
            .map(|me| actor_rank(Mode::Node, &key, me, live))
            .collect();
        assert_eq!(ranks, vec![Some(0), Some(1), Some(2), None, None]);
        let without_first: Vec<&str> = live.iter().copied().filter(|n| *n != order[0]).collect();
        assert_eq!(
            actor_rank(Mode::Node, &key, order[1], without_first),
            Some(0)
        );
        assert_eq!(actor_rank(Mode::Node, &key, "not-live", live), None);
    }

    #[test]
    fn claims_are_deleted_only_when_opted_in_and_the_bond_matches_by_uid() {
        let claim = pvc("ns", "data-0").volume_name("pv-1").build();
        let bound = released_on("n1", "u1").phase("Bound").claim(&claim).build();

        // Off by default.
        assert_eq!(classify(&bound, &config()), Err(Skip::BoundClaimKept));
        let (mut t, end) = waited_out(&released_on("n1", "u1").build());
        assert!(matches!(
            t.observe(&bound, &Lookup::live(NodeLookup::NotFound), Some(0), end),
            GoneAction::Cancel(CancelReason::NotCandidate(Skip::BoundClaimKept))
        ));

        // Opted in.
        let mut cfg = config();
        cfg.pvc_cleanup = true;
        let mut t = NodeGoneTracker::new(cfg);
        let start = t0();
        t.observe(
            &bound,
            &Lookup::cached(NodeLookup::NotFound),
            Some(0),
            start,
        );
        let GoneAction::ActOnPv(GonePlan::DeleteClaim {
            claim: target,
            event,
            ..
        }) = t.observe(
            &bound,
            &Lookup::live(NodeLookup::NotFound),
            Some(0),
            start.after(GRACE),
        )
        else {
            panic!("expected the claim to be deleted");
        };
        assert_eq!(
            target,
            ClaimToDelete {
                namespace: "ns".into(),
                name: "data-0".into(),
                uid: "uid-ns-data-0".into()
            }
        );
        assert!(
            event.message.contains("Deleted claim ns/data-0"),
            "{}",
            event.message
        );
        assert!(claim_bond_matches(&bound, &claim));
        let replaced = pvc("ns", "data-0")
            .uid("another")
            .volume_name("pv-1")
            .build();
        assert!(
            !claim_bond_matches(&bound, &replaced),
            "same name, other UID"
        );
        let elsewhere = pvc("ns", "data-0").volume_name("pv-2").build();
        assert!(
            !claim_bond_matches(&bound, &elsewhere),
            "bound to another volume"
        );

        // Once released, it is answered without a second grace period.
        let released = released_on("n1", "u1").claim(&claim).build();
        let later = start.after(GRACE + Duration::from_secs(5));
        assert!(matches!(
            t.observe(
                &released,
                &Lookup::cached(NodeLookup::NotFound),
                Some(0),
                later
            ),
            GoneAction::ConfirmLive { .. }
        ));
    }

    #[test]
    fn a_new_pv_under_the_same_name_starts_over() {
        let volume = released_on("n1", "u1").build();
        let (mut t, end) = waited_out(&volume);
        let successor = released_on("n1", "u1").uid("other-uid").build();
        assert_eq!(
            t.observe(
                &successor,
                &Lookup::live(NodeLookup::NotFound),
                Some(0),
                end
            ),
            GoneAction::StartTimer {
                deadline: end.instant + GRACE
            }
        );
        t.retain(["pv-other"]);
        assert_eq!(t.waiting(), 0);
    }

    #[test]
    fn provisioning_annotations_record_name_and_uid() {
        assert_eq!(
            provisioning_node_annotations("n1", Some("u1")),
            vec![
                ("csi-provisioner.rs/node-name", "n1".to_owned()),
                ("csi-provisioner.rs/node-uid", "u1".to_owned())
            ]
        );
        assert_eq!(provisioning_node_annotations("n1", Some("")).len(), 1);
    }

    #[test]
    fn durations_print_like_go() {
        assert_eq!(go_duration(Duration::from_secs(300)), "5m0s");
        assert_eq!(go_duration(Duration::from_secs(45)), "45s");
        assert_eq!(go_duration(Duration::from_secs(3723)), "1h2m3s");
    }
}
