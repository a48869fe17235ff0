//! The intent ledger: the durable record that a CreateVolume may be in flight, kept in a few Lease
//! objects of the sidecar's namespace instead of a finalizer and annotations on every claim.
//!
//! Why: the per-claim record cost two claim writes per volume (intent on, intent off), under the
//! same rate limit as the PV create, which made provisioning several times slower than upstream.
//! Here one Lease write commits the intents recorded while the previous write was in flight (group
//! commit), and removals ride along with the next commit or the resolver's flush, so a burst of
//! volumes costs a small fraction of a write each. Leases are in upstream's RBAC (the leader-election Role).
//!
//! What an entry holds is enough to finish the volume without its claim: the volume name, the
//! claim (namespace, name, UID), the provisioner secret reference, the volume id once learned, and
//! the exact CreateVolume request (secrets removed) to replay when the id is unknown.
//!
//! This module is pure: entries, their layout over shards (one Lease holds at most
//! [`SHARD_BYTES`] of entries, below the API server's 256 KiB annotation limit), the encoding
//! (an entry's fate is decided by `intents::resolution`). The committer and the Lease
//! encoding are in [`store`].

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use prost::Message;
use serde::{Deserialize, Serialize};

use crate::csi::v1::CreateVolumeRequest;
use crate::model::secrets::SecretRef;

pub(crate) mod store;

/// Encoded entries per Lease at most: below the API server's 256 KiB limit on all annotations of
/// one object, with room for the others. Large shards matter: a burst's intents are committed
/// together, one write per shard they fill (about 700 entries of a plain claim fit).
pub(crate) const SHARD_BYTES: usize = 192 * 1024;

/// An entry's share of its shard's annotation (its JSON and a separating comma).
fn entry_bytes(entry: &Entry) -> usize {
    serde_json::to_string(entry).map_or(0, |text| text.len()) + 1
}

/// The Lease annotation holding a shard's entries (JSON list).
pub(crate) const ENTRIES_ANNOTATION: &str = crate::names::LEDGER_ENTRIES_ANNOTATION;
/// The label every ledger Lease carries, valued with the ledger's name (one per driver, one per
/// node in node mode).
pub(crate) const LEDGER_LABEL: &str = "csi-provisioner.rs/intent-ledger";
/// Node mode: the label (valued with the ledger's name) that marks a node's ledger, so the
/// dead-node clean-up can list every node's ledger at once.
pub(crate) const NODE_LEDGER_LABEL: &str = crate::names::LEDGER_NODE_LABEL;
/// Node mode: the annotation naming the node a ledger belongs to (names are too long for labels).
pub(crate) const NODE_ANNOTATION: &str = crate::names::LEDGER_NODE_ANNOTATION;

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
    /// The class's reclaim policy is Retain: once its PV may have existed, the volume is the
    /// user's to keep (see [`Entry::may_be_kept`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(crate) retain: bool,
    /// `request` is not the one sent but what the claim alone says (a claim record written before
    /// requests were kept): a refusal of its replay proves nothing.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(crate) approximate: bool,
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
            approximate: false,
        }
    }

    /// Whether the volume of this entry, whose claim is gone and whose PV does not exist, may be
    /// one a user chose to keep. A Retain PV carries no finalizer, so an admin may delete it
    /// after its claim while the entry's removal is not written yet (a crash, a held write): the
    /// entry then looks exactly like a CreateVolume whose PV was never made. Only a process that
    /// recorded the entry itself and never made its PV (`recorded_here`) knows there was none;
    /// otherwise the volume is kept, and reported, rather than deleted (issue 29).
    /// `class_retains`: for an approximate entry (a claim record of an earlier version, which did
    /// not record the policy), whether the claim's class retains as cached now; a class that is
    /// gone cannot tell, so that volume may be kept too.
    pub(crate) fn may_be_kept(&self, recorded_here: bool, class_retains: Option<bool>) -> bool {
        let retain = self.retain || (self.approximate && class_retains.unwrap_or(true));
        retain && !recorded_here
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

/// The entries of one shard, as stored in [`ENTRIES_ANNOTATION`].
pub(crate) fn encode(entries: &[&Entry]) -> String {
    serde_json::to_string(entries).unwrap_or_else(|_| "[]".to_owned())
}

/// Parses a shard's annotation; a malformed value is an error naming what is wrong (never
/// silently an empty ledger: that would forget in-flight volumes).
pub(crate) fn decode(value: &str) -> Result<Vec<Entry>, String> {
    serde_json::from_str(value).map_err(|e| format!("malformed {ENTRIES_ANNOTATION}: {e}"))
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
    /// Now rather than lazily. For a PV with reclaim `Retain`: a crash before the removal is
    /// written leaves an entry a restarted resolver sees with no PV (an admin may delete a kept PV
    /// while the sidecar is down) and no claim, and it cannot tell that from a volume whose PV
    /// was never made, so it deletes the volume. With `Delete`, that DeleteVolume only repeats
    /// the reclaim's, so the lazy write is fine there.
    Prompt,
}

/// Where [`Book::record`] left an entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum InBook {
    /// The same entry is committed already: no write needed.
    Committed,
    /// Added or changed: wait for the next commit.
    Unwritten,
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

    /// Adds or updates `entry`; a new one goes to the first shard with room.
    pub(crate) fn record(&mut self, entry: Entry) -> InBook {
        match self.entries.get(&entry.volume) {
            Some(slot) if slot.entry == entry && slot.committed => return InBook::Committed,
            Some(slot) if slot.entry == entry => self.dirty[slot.shard] = true,
            Some(_) => self.replace(entry),
            None => self.insert(entry),
        }
        InBook::Unwritten
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

    /// The entry of `volume`.
    #[cfg(test)]
    pub(crate) fn get(&self, volume: &str) -> Option<&Entry> {
        self.entries.get(volume).map(|s| &s.entry)
    }

    /// Every entry, committed or not.
    pub(crate) fn entries(&self) -> impl Iterator<Item = &Entry> {
        self.entries.values().map(|s| &s.entry)
    }

    /// Number of entries.
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether a removal asked for a prompt write. Other removals wait for the next commit of
    /// their shard or the resolver's flush.
    pub(crate) fn has_prompt(&self) -> bool {
        self.prompt
    }

    /// Whether anything waits for a write: an unwritten entry or a prompt removal.
    #[cfg(test)]
    pub(crate) fn has_uncommitted(&self) -> bool {
        self.prompt || self.entries.values().any(|s| !s.committed)
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
    pub(crate) fn take_commit(&mut self, removals: bool) -> Commit {
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
        Commit { shards }
    }

    /// The shards of `commit` were written: their entries, as written, are committed.
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

    /// A shard's write failed: it is written again with the next commit.
    pub(crate) fn failed(&mut self, shard: usize) {
        self.grow(shard);
        // Written again with the next commit or the resolver's flush, whichever comes first.
        self.dirty[shard] = true;
    }

    /// A shard as the API server has it after a conflict: entries of it this process does not
    /// know (another writer's, an earlier leader's) are taken in, committed, so they are resolved
    /// like loaded ones. Entries this process removed come back too: resolving them again is
    /// harmless (their PV exists), forgetting a live one is not.
    pub(crate) fn merge_foreign(&mut self, shard: usize, remote: Vec<Entry>) {
        self.grow(shard);
        for entry in remote {
            if !self.entries.contains_key(&entry.volume) {
                self.place(entry, shard, true);
            }
        }
        self.dirty[shard] = true;
    }
}

/// The writes of one commit.
#[derive(Debug, Default)]
pub(crate) struct Commit {
    /// One write per dirty shard.
    pub(crate) shards: Vec<ShardWrite>,
}

/// One shard's new content.
#[derive(Debug, Clone)]
pub(crate) struct ShardWrite {
    /// The shard index.
    pub(crate) shard: usize,
    /// The annotation value.
    pub(crate) content: String,
}

#[cfg(test)]
#[path = "ledger_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "ledger_props_tests.rs"]
mod props_tests;
