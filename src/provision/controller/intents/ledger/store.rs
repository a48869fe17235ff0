//! The ledger's shell: loads the ledger Leases, and one committer task writes what changed, one
//! write per shard for every intent recorded by then (group commit: what is recorded while a
//! write is in flight rides the next write). Removals ride along with the next write of their
//! shard, or are flushed at a quiet resolver pass, after a failed write, and at least every
//! minute ([`Ledger::flush_removals`]): a stale entry only costs a later look at its PV, a
//! missing one may cost a volume.
//!
//! The Lease objects too: a shard's entries read from and written into a Lease, and reading
//! another ledger whole (another node's, before clearing a claim's selected node).

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{ListParams, PostParams};
use kube::{Api, Client};
use tokio::sync::{Notify, oneshot};
use tracing::{debug, info, warn};

use super::{
    Book, ENTRIES_ANNOTATION, Entry, InBook, LEDGER_LABEL, NODE_ANNOTATION, NODE_LEDGER_LABEL,
    Removal, decode, shard_index,
};
use crate::k8s::errors::{ApiErrorClass, classify, describe};
use crate::leader::Leadership;
use crate::sync::lock;

/// Node mode: how long an intent commit of a node ledger written moments ago (within four of
/// these) waits for company. Claims reach a node one by one as the scheduler places their pods
/// (about three a second each on 50 nodes taking 1000 pods), too far apart for a write in flight
/// to group them; this bounds a busy node to about two writes a second, for at most this much
/// more per volume.
const NODE_COMMIT_WINDOW: Duration = Duration::from_millis(500);

/// Every this many resolver passes (a minute at 2 s) pending removals are written even while
/// intents keep being recorded (see [`Ledger::flush_removals`]).
const FLUSH_EVERY: u32 = 30;

/// What a commit is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Due {
    /// New or changed entries (workers wait), or a prompt removal.
    Intents,
    /// Removals only, lazily.
    Removals,
}

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

#[derive(Default)]
struct State {
    book: Book,
    /// Workers waiting for the next commit.
    waiters: Vec<oneshot::Sender<Result<(), LedgerError>>>,
    /// The last Lease seen per shard (`None`: not created yet).
    leases: Vec<Option<Lease>>,
    /// Entries this process recorded itself (not read from an earlier process's ledger), until
    /// they are dropped.
    recorded_here: std::collections::HashSet<String>,
}

impl Ledger {
    fn with(state: State, target: Target, count: Arc<AtomicI64>) -> Self {
        Self(Arc::new(Inner {
            state: Mutex::new(state),
            wake: Notify::new(),
            flush: AtomicBool::new(false),
            recording: AtomicBool::new(false),
            skipped: Default::default(),
            failed: AtomicBool::new(false),
            target,
            count,
        }))
    }

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
            set_lease(&mut state.leases, index, lease);
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
        Some(Self::with(state, target, count))
    }

    /// Records `entry` and waits until a commit has written it. Only then may CreateVolume be
    /// sent.
    pub(crate) async fn record(&self, entry: Entry) -> Result<(), LedgerError> {
        let rx = {
            let mut state = lock(&self.0.state);
            state.recorded_here.insert(entry.volume.clone());
            if state.book.record(entry) == InBook::Committed {
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
        rx.await.unwrap_or_else(|_| {
            Err(LedgerError {
                // `namespace/name-intents` of the ledger's shards.
                lease: format!("{}/{}-intents", self.0.target.namespace, self.0.target.base),
                message: "the intent ledger's committer stopped".to_owned(),
                hint: String::new(),
            })
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
            let due = tokio::select! {
                () = &mut stop => break,
                due = self.wait_for_work() => due,
            };
            if due == Due::Intents
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
            self.commit_once(due == Due::Removals).await;
        }
        if lock(&self.0.state).book.is_dirty() && leadership.is_acting() {
            self.commit_once(true).await;
        }
    }

    /// Returns when a commit is due: a worker waits for its intent or a prompt removal is
    /// pending ([`Due::Intents`]), or the resolver asked for a flush of removals
    /// ([`Due::Removals`]).
    async fn wait_for_work(&self) -> Due {
        loop {
            let notified = self.0.wake.notified();
            {
                let state = lock(&self.0.state);
                if !state.waiters.is_empty() || state.book.has_prompt() {
                    return Due::Intents;
                }
                if self.0.flush.swap(false, Ordering::Relaxed) && state.book.is_dirty() {
                    return Due::Removals;
                }
            }
            notified.await;
        }
    }

    /// One commit: writes the shards holding new intents, with `removals` every dirty shard
    /// ([`Book::take_commit`]). Returns `false` after a failure other than a conflict (which is
    /// merged and written again at once).
    async fn commit_once(&self, removals: bool) -> bool {
        let target = &self.0.target;
        let (commit, waiters, leases) = {
            let mut state = lock(&self.0.state);
            let commit = state.book.take_commit(removals);
            let waiters = std::mem::take(&mut state.waiters);
            let leases = commit
                .shards
                .iter()
                .map(|s| state.leases.get(s.shard).cloned().flatten())
                .collect::<Vec<_>>();
            (commit, waiters, leases)
        };
        let mut failure: Option<LedgerError> = None;
        let mut conflict = false;
        for (write, known) in commit.shards.iter().zip(leases) {
            let name = super::shard_name(&target.base, write.shard);
            let lease = with_entries(
                known,
                &name,
                &target.base,
                target.node.as_deref(),
                &write.content,
            );
            let answer = if lease.metadata.resource_version.is_none() {
                target.api.create(&PostParams::default(), &lease).await
            } else {
                target
                    .api
                    .replace(&name, &PostParams::default(), &lease)
                    .await
            };
            match answer {
                Ok(saved) => {
                    let written = decode(&write.content).unwrap_or_default();
                    let mut state = lock(&self.0.state);
                    state.book.committed(write, &written);
                    set_lease(&mut state.leases, write.shard, saved);
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
                            match self.merge_remote(target, write.shard, &name).await {
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
                            failure = Some(LedgerError {
                                lease: format!("{}/{name}", target.namespace),
                                message: describe(&e),
                                hint,
                            });
                        }
                    }
                }
            }
        }
        if conflict && failure.is_none() {
            // Written again at once with what the API server has merged in; the waiters wait for
            // that write.
            lock(&self.0.state).waiters.extend(waiters);
            return true;
        }
        for waiter in waiters {
            let _ = waiter.send(failure.clone().map_or(Ok(()), Err));
        }
        failure.is_none()
    }

    /// After a conflict: reads the shard and takes in entries this process does not know. A
    /// Lease whose entries cannot be read is never overwritten (it may list volumes in flight):
    /// the commit fails, naming it, and so does each later commit of that shard (a PUT answered
    /// 409 and a GET, at most once a resolver pass or a claim's retry) until it is repaired or
    /// deleted. A read that fails fails the commit too.
    async fn merge_remote(
        &self,
        target: &Target,
        shard: usize,
        name: &str,
    ) -> Result<(), LedgerError> {
        match target.api.get_opt(name).await {
            Ok(Some(lease)) => match lease_entries(&lease) {
                Ok(remote) => {
                    let mut state = lock(&self.0.state);
                    state.book.merge_foreign(shard, remote);
                    set_lease(&mut state.leases, shard, lease);
                    self.publish(&state.book);
                }
                Err(e) => {
                    warn!(lease = %name, "{e}; it is not overwritten: repair or delete it");
                    return Err(LedgerError {
                        lease: format!("{}/{name}", target.namespace),
                        message: e,
                        hint: "; it is not overwritten, since it may list volumes being created: repair or delete it".to_owned(),
                    });
                }
            },
            Ok(None) => {
                if let Some(slot) = lock(&self.0.state).leases.get_mut(shard) {
                    *slot = None;
                }
            }
            // Fails this commit rather than writing again at once: each try would meet the
            // same conflict while the API server cannot answer the read.
            Err(e) => {
                return Err(LedgerError {
                    lease: format!("{}/{name}", target.namespace),
                    message: format!("reading it after a conflicting write: {}", describe(&e)),
                    hint: "; retrying".to_owned(),
                });
            }
        }
        Ok(())
    }
}

// === The Lease objects ===

fn set_lease(leases: &mut Vec<Option<Lease>>, shard: usize, lease: Lease) {
    if leases.len() <= shard {
        leases.resize(shard + 1, None);
    }
    leases[shard] = Some(lease);
}

/// The entries a ledger Lease holds (none when it has no annotation yet).
pub(crate) fn lease_entries(lease: &Lease) -> Result<Vec<Entry>, String> {
    match lease
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ENTRIES_ANNOTATION))
    {
        Some(value) => decode(value),
        None => Ok(Vec::new()),
    }
}

/// The Lease to write for a shard: the last one seen with new content, or a new one.
fn with_entries(
    known: Option<Lease>,
    name: &str,
    base: &str,
    node: Option<&str>,
    content: &str,
) -> Lease {
    let mut lease = known.unwrap_or_else(|| {
        let mut labels: std::collections::BTreeMap<String, String> = [
            (LEDGER_LABEL.to_owned(), base.to_owned()),
            (
                "app.kubernetes.io/managed-by".to_owned(),
                "csi-provisioner-rs".to_owned(),
            ),
        ]
        .into();
        let mut annotations = std::collections::BTreeMap::new();
        if let Some(node) = node {
            labels.insert(NODE_LEDGER_LABEL.to_owned(), base.to_owned());
            annotations.insert(NODE_ANNOTATION.to_owned(), node.to_owned());
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
        .insert(ENTRIES_ANNOTATION.to_owned(), content.to_owned());
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
#[path = "store_tests.rs"]
mod tests;
