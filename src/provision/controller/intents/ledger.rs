//! The intent ledger: intents kept in a few Leases, not on every claim (a claim record costs two
//! claim writes per volume). One Lease write commits every intent recorded while the previous one
//! was in flight (group commit). The [`Book`] is pure; the committer ([`Ledger::run_committer`])
//! writes it. See docs/intent-ledger.md.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{ListParams, PostParams};
use kube::{Api, Client};
use prost::Message;
use serde::{Deserialize, Serialize};
use tokio::sync::{Notify, oneshot};
use tracing::{debug, info, warn};

use crate::csi::v1::CreateVolumeRequest;
use crate::model::meta::annotation;
use crate::model::secrets::SecretRef;
use crate::names::{LEDGER_ENTRIES_ANNOTATION, LEDGER_NODE_ANNOTATION, LEDGER_NODE_LABEL};
use crate::retry::{ApiErrorClass, classify, describe};
use crate::runtime::Leadership;
use crate::sync::lock;

/// Encoded entries per Lease at most: below the API server's 256 KiB limit on all annotations of
/// one object, with room for the others. Large shards matter: a burst's intents are committed
/// together, one write per shard they fill (about 700 entries of a plain claim fit).
pub(crate) const SHARD_BYTES: usize = 192 * 1024;

/// An entry's share of its shard's annotation (its JSON and a separating comma).
fn entry_bytes(entry: &Entry) -> usize {
    serde_json::to_string(entry).map_or(0, |text| text.len()) + 1
}

/// The label every ledger Lease carries, valued with the ledger's name (one per driver, one per
/// node in node mode).
pub(crate) const LEDGER_LABEL: &str = "csi-provisioner.rs/intent-ledger";

/// The name of node `node`'s ledger for the driver whose Lease name is `lease`: the Lease name
/// and a hash of the node name, short enough to be a label value (63 characters).
pub(crate) fn node_ledger_base(lease: &str, node: &str) -> String {
    let hash = crate::rendezvous::fnv1a64_str(node) & 0xffff_ffff_ffff;
    let mut prefix: String = lease.chars().take(63 - 13).collect();
    while prefix.ends_with(['-', '.', '_']) {
        prefix.pop();
    }
    format!("{prefix}-{hash:012x}")
}

/// One volume whose CreateVolume may have been sent and whose PV may not exist yet.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Entry {
    /// The volume (and PV) name CreateVolume is called with.
    pub(crate) volume: String,
    /// The claim's namespace.
    pub(crate) namespace: String,
    /// The claim's name.
    pub(crate) claim: String,
    /// The claim's UID: a claim re-created under the same name is another claim.
    pub(crate) uid: String,
    /// The provisioner secret (`namespace/name`), for replay and DeleteVolume.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) secret: Option<String>,
    /// The volume id, once learned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) id: Option<String>,
    /// The CreateVolume request without secrets (protobuf, base64 in JSON).
    pub(crate) request: ByteString,
    /// The class's reclaim policy is Retain, or unknown (a claim record without its request):
    /// once its PV may have existed, the volume is the user's to keep ([`Entry::may_be_kept`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(crate) retain: bool,
}

impl Entry {
    /// The entry for a CreateVolume `request` about to be sent for `pvc`.
    pub(crate) fn new(
        pvc: &PersistentVolumeClaim,
        request: &CreateVolumeRequest,
        secret: Option<&SecretRef>,
        retain: bool,
    ) -> Self {
        let mut stored = request.clone();
        // Secrets never leave the process: the reference is kept, the data fetched again.
        stored.secrets.clear();
        Self {
            volume: request.name.clone(),
            namespace: pvc.metadata.namespace.clone().unwrap_or_default(),
            claim: pvc.metadata.name.clone().unwrap_or_default(),
            uid: pvc.metadata.uid.clone().unwrap_or_default(),
            secret: secret.map(|s| format!("{}/{}", s.namespace, s.name)),
            id: None,
            request: ByteString(stored.encode_to_vec()),
            retain,
        }
    }

    /// Whether this entry's volume (claim and PV gone) may be one a user kept: only the process
    /// that recorded it (`recorded_here`) knows no PV was made; otherwise the volume is kept and
    /// reported, not deleted (issue 29).
    pub(crate) fn may_be_kept(&self, recorded_here: bool) -> bool {
        self.retain && !recorded_here
    }

    /// The provisioner secret reference.
    pub(crate) fn secret_ref(&self) -> Option<SecretRef> {
        let (namespace, name) = self.secret.as_deref()?.split_once('/')?;
        Some(SecretRef::new(name, namespace))
    }

    /// The stored CreateVolume request (no secrets), `None` when it cannot be decoded.
    pub(crate) fn request(&self) -> Option<CreateVolumeRequest> {
        if self.request.0.is_empty() {
            return None;
        }
        CreateVolumeRequest::decode(self.request.0.as_slice()).ok()
    }

    /// `namespace/name` of the claim, for logs.
    pub(crate) fn claim_name(&self) -> String {
        format!("{}/{}", self.namespace, self.claim)
    }
}

/// The entries of one shard, as stored in [`LEDGER_ENTRIES_ANNOTATION`].
pub(crate) fn encode(entries: &[&Entry]) -> String {
    serde_json::to_string(entries).unwrap_or_else(|_| "[]".to_owned())
}

/// Parses a shard's annotation; a malformed value is an error naming what is wrong (never
/// silently an empty ledger: that would forget in-flight volumes).
pub(crate) fn decode(value: &str) -> Result<Vec<Entry>, String> {
    serde_json::from_str(value).map_err(|e| format!("malformed {LEDGER_ENTRIES_ANNOTATION}: {e}"))
}

/// The name of shard `index` of the ledger `base` (the leader-election Lease name).
pub(crate) fn shard_name(base: &str, index: usize) -> String {
    format!("{base}-intents-{index}")
}

/// The shard index of a shard name of ledger `base`.
pub(crate) fn shard_index(base: &str, name: &str) -> Option<usize> {
    name.strip_prefix(base)?
        .strip_prefix("-intents-")?
        .parse()
        .ok()
}

/// The in-memory ledger: every entry, the shard it lives in, and what is not yet written.
#[derive(Debug, Default)]
pub(crate) struct Book {
    entries: BTreeMap<String, Slot>,
    /// Per shard: whether it changed since its last successful write.
    dirty: Vec<bool>,
    /// Per shard: the encoded size of its entries ([`SHARD_BYTES`] at most; 0 only when empty,
    /// as every entry takes at least a byte).
    bytes: Vec<usize>,
    /// A removal that must not wait for the resolver's flush ([`Removal::Prompt`]).
    prompt: bool,
}

#[derive(Debug, Clone)]
struct Slot {
    entry: Entry,
    shard: usize,
    /// [`entry_bytes`] of `entry`.
    bytes: usize,
    /// Written by a commit that succeeded (or loaded from the API server).
    committed: bool,
}

/// How an entry's removal is written ([`Book::forget`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Removal {
    /// Found stale (its PV exists): no write of its own, the next commit of its shard leaves it
    /// out. Keeping it written costs nothing but a later resolution, so a restart after a crash
    /// writes nothing for such entries.
    Stale,
    /// With the next commit of its shard or the resolver's flush.
    Lazy,
    /// Now, for a Retain PV: after a crash, an unwritten removal reads like a volume whose PV was
    /// never made ([`Entry::may_be_kept`]).
    Prompt,
}

impl Book {
    /// Entries loaded from the API server (committed), shard by shard.
    pub(crate) fn load(shards: Vec<(usize, Vec<Entry>)>) -> Self {
        let mut book = Self::default();
        for (shard, entries) in shards {
            book.grow(shard);
            for entry in entries {
                if let Some(old) = book.place(entry, shard, true) {
                    // The same volume in two shards (a crash between moving writes): keep one,
                    // and rewrite the shard that loses it.
                    book.dirty[old] = true;
                }
            }
        }
        book
    }

    fn grow(&mut self, shard: usize) {
        if self.dirty.len() <= shard {
            self.dirty.resize(shard + 1, false);
            self.bytes.resize(shard + 1, 0);
        }
    }

    /// Puts `entry` in `shard`, counted there; the shard of the slot it displaced, if any, no
    /// longer counts that one.
    fn place(&mut self, entry: Entry, shard: usize, committed: bool) -> Option<usize> {
        self.grow(shard);
        let bytes = entry_bytes(&entry);
        self.bytes[shard] += bytes;
        let slot = Slot {
            entry,
            shard,
            bytes,
            committed,
        };
        let old = self.entries.insert(slot.entry.volume.clone(), slot)?;
        self.bytes[old.shard] -= old.bytes;
        Some(old.shard)
    }

    /// Adds or updates `entry`; a new one goes to the first shard with room. `false`: the same
    /// entry is committed already (no write needed).
    pub(crate) fn record(&mut self, entry: Entry) -> bool {
        match self.entries.get(&entry.volume) {
            Some(slot) if slot.entry == entry && slot.committed => return false,
            Some(slot) if slot.entry == entry => self.dirty[slot.shard] = true,
            _ => self.replace(entry),
        }
        true
    }

    /// Puts a changed `entry` in place of the one of its volume, unwritten. One that outgrew its
    /// shard moves to a shard with room: the commit writes the shard gaining it before the one
    /// losing it ([`Book::take_commit`]), so no crash between the two writes loses it.
    fn replace(&mut self, entry: Entry) {
        let Some(slot) = self.entries.get_mut(&entry.volume) else {
            self.insert(entry);
            return;
        };
        let bytes = entry_bytes(&entry);
        let shard = slot.shard;
        // Moved only out of a shard it shares with others.
        if self.bytes[shard] > slot.bytes && self.bytes[shard] - slot.bytes + bytes > SHARD_BYTES {
            self.forget(&entry.volume, Removal::Lazy);
            self.insert(entry);
            return;
        }
        self.bytes[shard] = self.bytes[shard] - slot.bytes + bytes;
        slot.bytes = bytes;
        slot.entry = entry;
        slot.committed = false;
        self.dirty[shard] = true;
    }

    /// Adds a new `entry`, unwritten, to the first shard with room.
    fn insert(&mut self, entry: Entry) {
        let bytes = entry_bytes(&entry);
        // The first shard with room (an empty one always has room, whatever the entry's size).
        let shard = (0..)
            .find(|i| {
                (self.bytes.get(*i)).is_none_or(|used| *used == 0 || used + bytes <= SHARD_BYTES)
            })
            .unwrap_or_default();
        self.place(entry, shard, false);
        self.dirty[shard] = true;
    }

    /// Remembers the volume id of `volume`: the entry is unwritten until the next commit.
    pub(crate) fn set_id(&mut self, volume: &str, id: &str) {
        if let Some(slot) = self.entries.get(volume)
            && slot.entry.id.as_deref() != Some(id)
        {
            let mut entry = slot.entry.clone();
            entry.id = Some(id.to_owned());
            self.replace(entry);
        }
    }

    /// Drops `volume`'s entry, written as `removal` says. Whether it was there.
    pub(crate) fn forget(&mut self, volume: &str, removal: Removal) -> bool {
        let Some(slot) = self.entries.remove(volume) else {
            return false;
        };
        self.bytes[slot.shard] -= slot.bytes;
        self.dirty[slot.shard] |= removal != Removal::Stale;
        self.prompt |= removal == Removal::Prompt;
        true
    }

    /// Every entry, committed or not.
    pub(crate) fn entries(&self) -> impl Iterator<Item = &Entry> {
        self.entries.values().map(|s| &s.entry)
    }

    /// Number of entries.
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether any shard needs a write.
    pub(crate) fn is_dirty(&self) -> bool {
        self.dirty.iter().any(|d| *d)
    }

    /// What the next commit writes: per dirty shard, its full content, and clears their dirty
    /// flags; [`Book::committed`] or [`Book::failed`] must follow. With `removals` false (a commit
    /// for new intents) only shards holding an unwritten entry are written: a shard changed by
    /// removals alone waits for the resolver's flush. A prompt
    /// removal is written with any commit. Shards gaining entries come first: an entry that
    /// moved is in its new shard before it leaves the old one.
    pub(crate) fn take_commit(&mut self, removals: bool) -> Vec<ShardWrite> {
        let all = std::mem::take(&mut self.prompt) || removals;
        let mut fresh = vec![false; self.dirty.len()];
        for slot in self.entries.values().filter(|s| !s.committed) {
            fresh[slot.shard] = true;
        }
        let order = (0..self.dirty.len())
            .filter(|s| fresh[*s])
            .chain((0..self.dirty.len()).filter(|s| all && !fresh[*s]));
        let mut shards = Vec::new();
        for shard in order {
            if !std::mem::take(&mut self.dirty[shard]) {
                continue;
            }
            let entries: Vec<&Entry> = self
                .entries
                .values()
                .filter(|s| s.shard == shard)
                .map(|s| &s.entry)
                .collect();
            shards.push(ShardWrite {
                shard,
                content: encode(&entries),
            });
        }
        shards
    }

    /// `shard` was written: its entries, as written, are committed.
    pub(crate) fn committed(&mut self, shard: &ShardWrite, written: &[Entry]) {
        for entry in written {
            if let Some(slot) = self.entries.get_mut(&entry.volume)
                && slot.shard == shard.shard
                && slot.entry == *entry
            {
                slot.committed = true;
            }
        }
    }

    /// A shard's write failed: it is written again with the next commit or the resolver's flush.
    pub(crate) fn failed(&mut self, shard: usize) {
        debug_assert!(shard < self.dirty.len(), "a shard of take_commit");
        self.dirty[shard] = true;
    }

    /// A shard as the API server has it after a conflict: entries of it this process does not
    /// know (another writer's, an earlier leader's) are taken in, committed, so they are resolved
    /// like loaded ones. Entries this process removed come back too: resolving them again is
    /// harmless (their PV exists), forgetting a live one is not.
    pub(crate) fn merge_foreign(&mut self, shard: usize, remote: Vec<Entry>) {
        debug_assert!(shard < self.dirty.len(), "a shard of take_commit");
        for entry in remote {
            if !self.entries.contains_key(&entry.volume) {
                self.place(entry, shard, true);
            }
        }
        self.dirty[shard] = true;
    }
}

/// One shard's new content.
#[derive(Debug, Clone)]
pub(crate) struct ShardWrite {
    /// The shard index.
    pub(crate) shard: usize,
    /// The annotation value.
    pub(crate) content: String,
}

/// Node mode: how long an intent commit of a node ledger written moments ago (within four of
/// these) waits for company. Claims reach a node one by one as the scheduler places their pods
/// (about three a second each on 50 nodes taking 1000 pods), too far apart for a write in flight
/// to group them; this bounds a busy node to about two writes a second, for at most this much
/// more per volume.
const NODE_COMMIT_WINDOW: Duration = Duration::from_millis(500);

/// Every this many resolver passes (a minute at 2 s) pending removals are written even while
/// intents keep being recorded (see [`Ledger::flush_removals`]).
const FLUSH_EVERY: u32 = 30;

/// Why an intent was not recorded: the write failed; nothing may be sent to the driver yet.
#[derive(Debug, Clone, thiserror::Error)]
#[error("writing the intent ledger Lease {lease} failed: {message}{hint}")]
pub(crate) struct LedgerError {
    /// `namespace/name` of the Lease.
    lease: String,
    /// The API server's answer, or why the Lease cannot be read.
    message: String,
    /// What to do about it, when known (a missing permission, a Lease to repair).
    hint: String,
}

/// A handle on the ledger; cheap to clone.
#[derive(Clone)]
pub(crate) struct Ledger(Arc<Inner>);

struct Inner {
    state: Mutex<State>,
    wake: Notify,
    /// The resolver asked for a flush of pending removals ([`Ledger::flush_removals`]).
    flush: AtomicBool,
    /// An intent was recorded since the resolver's last pass: removals ride its commit instead.
    recording: AtomicBool,
    /// Resolver passes whose flush was left to the intent commits, in a row ([`FLUSH_EVERY`]).
    skipped: std::sync::atomic::AtomicU32,
    /// A write failed since the resolver's last pass: the next pass writes again.
    failed: AtomicBool,
    target: Target,
    /// Published entry count (`csi_provisioner_claims_with_intent` adds it).
    count: Arc<AtomicI64>,
}

struct Target {
    api: Api<Lease>,
    namespace: String,
    base: String,
    /// Node mode: the node this ledger belongs to.
    node: Option<String>,
}

impl Target {
    /// A failed write of Lease `name`: the API server's `message`, and what to do (`hint`).
    fn error(&self, name: &str, message: String, hint: &str) -> LedgerError {
        LedgerError {
            lease: format!("{}/{name}", self.namespace),
            message,
            hint: hint.to_owned(),
        }
    }
}

#[derive(Default)]
struct State {
    book: Book,
    /// Workers waiting for the next commit.
    waiters: Vec<oneshot::Sender<Result<(), LedgerError>>>,
    /// The last Lease seen per shard (none: not created yet).
    leases: BTreeMap<usize, Lease>,
    /// Entries this process recorded itself (not read from an earlier process's ledger), until
    /// they are dropped.
    recorded_here: std::collections::HashSet<String>,
}

impl Ledger {
    /// Loads the ledger `base` (the leader-election Lease name) of `namespace`, retrying
    /// transient errors until it is read. `None`: refused (RBAC), with a warning saying which
    /// permission is missing, or a Lease that cannot be read: intents go on the claims instead.
    pub(crate) async fn open(
        client: Client,
        namespace: &str,
        base: &str,
        node: Option<&str>,
        count: Arc<AtomicI64>,
    ) -> Option<Self> {
        let api: Api<Lease> = Api::namespaced(client, namespace);
        let listed = match list_shards(&api, base).await {
            Ok(leases) => leases,
            Err(e) => {
                warn!(
                    namespace,
                    "the intent ledger is off, provisioning intents go on each claim (two claim writes per volume): {}; grant get, list, create and update on leases (coordination.k8s.io) in namespace {namespace} to the sidecar's ServiceAccount, as upstream's Role does",
                    describe(&e)
                );
                return None;
            }
        };
        let mut state = State::default();
        let mut shards = Vec::new();
        for lease in listed {
            let name = lease.metadata.name.clone().unwrap_or_default();
            let Some(index) = shard_index(base, &name) else {
                continue;
            };
            let entries = match lease_entries(&lease) {
                Ok(entries) => entries,
                Err(e) => {
                    // Never overwrite what cannot be read: it may list in-flight volumes.
                    warn!(lease = %format!("{namespace}/{name}"), "{e}; the ledger is off until it is repaired or deleted");
                    return None;
                }
            };
            state.leases.insert(index, lease);
            shards.push((index, entries));
        }
        state.book = Book::load(shards);
        info!(namespace, ledger = %base, intents = state.book.len(), "intent ledger loaded");
        count.store(state.book.len() as i64, Ordering::Relaxed);
        let target = Target {
            api,
            namespace: namespace.to_owned(),
            base: base.to_owned(),
            node: node.map(str::to_owned),
        };
        Some(Self(Arc::new(Inner {
            state: Mutex::new(state),
            wake: Notify::new(),
            flush: AtomicBool::new(false),
            recording: AtomicBool::new(false),
            skipped: Default::default(),
            failed: AtomicBool::new(false),
            target,
            count,
        })))
    }

    /// Records `entry` and waits until a commit has written it. Only then may CreateVolume be
    /// sent.
    pub(crate) async fn record(&self, entry: Entry) -> Result<(), LedgerError> {
        let rx = {
            let mut state = lock(&self.0.state);
            state.recorded_here.insert(entry.volume.clone());
            if !state.book.record(entry) {
                return Ok(());
            }
            self.0.recording.store(true, Ordering::Relaxed);
            self.publish(&state.book);
            let (tx, rx) = oneshot::channel();
            state.waiters.push(tx);
            rx
        };
        self.0.wake.notify_one();
        // The sender lives in the ledger's state, answered by every commit: never dropped
        // unanswered while the ledger exists.
        let target = &self.0.target;
        rx.await.unwrap_or_else(|_| {
            let shards = format!("{}-intents", target.base);
            Err(target.error(
                &shards,
                "the intent ledger's committer stopped".to_owned(),
                "",
            ))
        })
    }

    /// The resolver's pass (every few seconds) asks for pending removals to be written. While
    /// intents are recorded they ride the intent commits (each writes its shards whole), so the
    /// pass writes them only when no intent was recorded since the last one, after a failed
    /// write, or at every [`FLUSH_EVERY`]th pass whatever the load: a removal is never left
    /// unwritten for long (a stale entry of a volume reclaimed meanwhile would cost a replayed
    /// CreateVolume after a crash).
    pub(crate) fn flush_removals(&self) {
        let quiet = !self.0.recording.swap(false, Ordering::Relaxed);
        let failed = self.0.failed.swap(false, Ordering::Relaxed);
        let skipped = self.0.skipped.fetch_add(1, Ordering::Relaxed) + 1;
        if quiet || failed || skipped >= FLUSH_EVERY {
            self.0.skipped.store(0, Ordering::Relaxed);
            self.0.flush.store(true, Ordering::Relaxed);
            self.0.wake.notify_one();
        }
    }

    /// Drops `volume`'s entry: its PV exists, or the volume was deleted; written as `removal`
    /// says.
    pub(crate) fn forget(&self, volume: &str, removal: Removal) {
        let mut state = lock(&self.0.state);
        state.recorded_here.remove(volume);
        if state.book.forget(volume, removal) {
            self.publish(&state.book);
            drop(state);
            // A stale entry's removal waits for a write of its shard made for something else.
            if removal != Removal::Stale {
                self.0.wake.notify_one();
            }
        }
    }

    /// Remembers a learned volume id (written with the next commit): a retried clean-up needs no
    /// replay.
    pub(crate) fn set_id(&self, volume: &str, id: &str) {
        lock(&self.0.state).book.set_id(volume, id);
        self.0.wake.notify_one();
    }

    /// Whether this process recorded `volume`'s entry (not read it from an earlier process's
    /// ledger): then it alone made, or did not make, the volume's PV.
    pub(crate) fn recorded_here(&self, volume: &str) -> bool {
        lock(&self.0.state).recorded_here.contains(volume)
    }

    /// Every entry now.
    pub(crate) fn entries(&self) -> Vec<Entry> {
        lock(&self.0.state).book.entries().cloned().collect()
    }

    fn publish(&self, book: &Book) {
        self.0.count.store(book.len() as i64, Ordering::Relaxed);
    }

    /// Writes until `stop` completes; then one last flush of what is pending (removals), so a
    /// clean shutdown leaves no stale entries.
    pub(crate) async fn run_committer(
        self,
        leadership: Leadership,
        stop: impl std::future::Future<Output = ()>,
    ) {
        tokio::pin!(stop);
        let per_node = self.0.target.node.is_some();
        let mut last_write: Option<tokio::time::Instant> = None;
        loop {
            let removals = tokio::select! {
                () = &mut stop => break,
                removals = self.wait_for_work() => removals,
            };
            if !removals
                && per_node
                && last_write.is_some_and(|at| at.elapsed() < 4 * NODE_COMMIT_WINDOW)
            {
                tokio::select! {
                    () = &mut stop => break,
                    () = tokio::time::sleep(NODE_COMMIT_WINDOW) => {}
                }
            }
            // Only a leader writes: a deposed one must not overwrite its successor's ledger.
            leadership.acting().await;
            last_write = Some(tokio::time::Instant::now());
            // A failed write is retried when a worker records again (its claim's backoff) or at
            // the resolver's next flush: no pause of its own.
            self.commit_once(removals).await;
        }
        if lock(&self.0.state).book.is_dirty() && leadership.is_acting() {
            self.commit_once(true).await;
        }
    }

    /// Returns when a commit is due: a worker waits for its intent or a prompt removal is
    /// pending (`false`), or the resolver asked for a flush of removals (`true`).
    async fn wait_for_work(&self) -> bool {
        loop {
            let notified = self.0.wake.notified();
            {
                let state = lock(&self.0.state);
                if !state.waiters.is_empty() || state.book.prompt {
                    return false;
                }
                if self.0.flush.swap(false, Ordering::Relaxed) && state.book.is_dirty() {
                    return true;
                }
            }
            notified.await;
        }
    }

    /// One commit: writes the shards holding new intents, with `removals` every dirty shard
    /// ([`Book::take_commit`]). A conflict is merged and written again at once.
    async fn commit_once(&self, removals: bool) {
        let target = &self.0.target;
        let (commit, waiters, leases) = {
            let mut state = lock(&self.0.state);
            let commit = state.book.take_commit(removals);
            let waiters = std::mem::take(&mut state.waiters);
            let leases = commit
                .iter()
                .map(|s| state.leases.get(&s.shard).cloned())
                .collect::<Vec<_>>();
            (commit, waiters, leases)
        };
        let mut failure: Option<LedgerError> = None;
        let mut conflict = false;
        let params = PostParams::default();
        for (write, known) in commit.iter().zip(leases) {
            let name = shard_name(&target.base, write.shard);
            let lease = with_entries(known, &name, target, &write.content);
            let answer = if lease.metadata.resource_version.is_none() {
                target.api.create(&params, &lease).await
            } else {
                target.api.replace(&name, &params, &lease).await
            };
            match answer {
                Ok(saved) => {
                    let written = decode(&write.content).unwrap_or_default();
                    let mut state = lock(&self.0.state);
                    state.book.committed(write, &written);
                    state.leases.insert(write.shard, saved);
                }
                Err(e) => {
                    let class = classify(&e);
                    lock(&self.0.state).book.failed(write.shard);
                    self.0.failed.store(true, Ordering::Relaxed);
                    match class {
                        // NotFound: the Lease was deleted under us; it is created again with
                        // this process's entries.
                        ApiErrorClass::Conflict
                        | ApiErrorClass::AlreadyExists
                        | ApiErrorClass::NotFound => {
                            match self.merge_remote(write.shard, &name).await {
                                Ok(()) => conflict = true,
                                Err(unreadable) => failure = Some(unreadable),
                            }
                        }
                        _ => {
                            debug!(lease = %name, "intent ledger write failed: {}", describe(&e));
                            let hint = match class {
                                ApiErrorClass::Forbidden => format!(
                                    "; grant create and update on leases (coordination.k8s.io) in namespace {} to the sidecar's ServiceAccount, as upstream's Role does",
                                    target.namespace
                                ),
                                _ => "; retrying".to_owned(),
                            };
                            failure = Some(target.error(&name, describe(&e), &hint));
                        }
                    }
                }
            }
        }
        if conflict && failure.is_none() {
            // Written again at once with what the API server has merged in; the waiters wait for
            // that write.
            lock(&self.0.state).waiters.extend(waiters);
            return;
        }
        for waiter in waiters {
            let _ = waiter.send(failure.clone().map_or(Ok(()), Err));
        }
    }

    /// After a conflict: reads the shard and takes in entries this process does not know. A
    /// Lease whose entries cannot be read is never overwritten (it may list volumes in flight):
    /// the commit fails, naming it, and so does each later commit of that shard (a PUT answered
    /// 409 and a GET, at most once a resolver pass or a claim's retry) until it is repaired or
    /// deleted. A read that fails fails the commit too.
    async fn merge_remote(&self, shard: usize, name: &str) -> Result<(), LedgerError> {
        let target = &self.0.target;
        match target.api.get_opt(name).await {
            Ok(Some(lease)) => match lease_entries(&lease) {
                Ok(remote) => {
                    let mut state = lock(&self.0.state);
                    state.book.merge_foreign(shard, remote);
                    state.leases.insert(shard, lease);
                    self.publish(&state.book);
                }
                Err(e) => {
                    warn!(lease = %name, "{e}; it is not overwritten: repair or delete it");
                    let hint = "; it is not overwritten, since it may list volumes being created: repair or delete it";
                    return Err(target.error(name, e, hint));
                }
            },
            Ok(None) => {
                lock(&self.0.state).leases.remove(&shard);
            }
            // Fails this commit rather than writing again at once: each try would meet the
            // same conflict while the API server cannot answer the read.
            Err(e) => {
                let message = format!("reading it after a conflicting write: {}", describe(&e));
                return Err(target.error(name, message, "; retrying"));
            }
        }
        Ok(())
    }
}

// === The Lease objects ===

/// The entries a ledger Lease holds (none when it has no annotation yet).
pub(crate) fn lease_entries(lease: &Lease) -> Result<Vec<Entry>, String> {
    annotation(&lease.metadata, LEDGER_ENTRIES_ANNOTATION).map_or(Ok(Vec::new()), decode)
}

/// The Lease to write for a shard: the last one seen with new content, or a new one.
fn with_entries(known: Option<Lease>, name: &str, target: &Target, content: &str) -> Lease {
    let mut lease = known.unwrap_or_else(|| {
        let mut labels: std::collections::BTreeMap<String, String> = [
            (LEDGER_LABEL.to_owned(), target.base.clone()),
            (
                "app.kubernetes.io/managed-by".to_owned(),
                "csi-provisioner-rs".to_owned(),
            ),
        ]
        .into();
        let mut annotations = std::collections::BTreeMap::new();
        if let Some(node) = &target.node {
            labels.insert(LEDGER_NODE_LABEL.to_owned(), target.base.clone());
            annotations.insert(LEDGER_NODE_ANNOTATION.to_owned(), node.clone());
        }
        Lease {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                labels: Some(labels),
                annotations: Some(annotations),
                ..ObjectMeta::default()
            },
            spec: None,
        }
    });
    lease
        .metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert(LEDGER_ENTRIES_ANNOTATION.to_owned(), content.to_owned());
    lease
}

/// Every entry of ledger `base` in `namespace` as the API server has it (another node's ledger,
/// read by the instance that would clear a claim's selected node). Unreadable shards are skipped
/// with a warning: their owner repairs or deletes them.
pub(crate) async fn read_ledger(
    client: &Client,
    namespace: &str,
    base: &str,
) -> Result<Vec<Entry>, kube::Error> {
    let api: Api<Lease> = Api::namespaced(client.clone(), namespace);
    let list = api
        .list(&ListParams::default().labels(&format!("{LEDGER_LABEL}={base}")))
        .await?;
    let mut entries = Vec::new();
    for lease in list.items {
        match lease_entries(&lease) {
            Ok(mut e) => entries.append(&mut e),
            Err(e) => warn!(lease = %lease.metadata.name.unwrap_or_default(), "{e}"),
        }
    }
    Ok(entries)
}

/// The Leases of ledger `base` in `api`'s namespace, retrying (with backoff, without end) every
/// failure but a refusal, which is returned: what to grant depends on the caller.
pub(crate) async fn list_shards(api: &Api<Lease>, base: &str) -> Result<Vec<Lease>, kube::Error> {
    let selector = format!("{LEDGER_LABEL}={base}");
    let mut pause = std::time::Duration::from_millis(200);
    loop {
        match api.list(&ListParams::default().labels(&selector)).await {
            Ok(list) => return Ok(list.items),
            Err(e) if classify(&e) == ApiErrorClass::Forbidden => return Err(e),
            Err(e) => {
                warn!(ledger = %base, "reading the intent ledger's Leases failed, retrying: {}", describe(&e));
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(std::time::Duration::from_secs(10));
            }
        }
    }
}

#[cfg(test)]
#[path = "ledger_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "ledger_props_tests.rs"]
mod props_tests;

#[cfg(test)]
#[path = "ledger_store_tests.rs"]
mod store_tests;
