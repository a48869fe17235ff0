//! VolumeAttachments indexed by the PV they attach, kept from one watch: the delete path asks
//! "is this PV attached?" in O(1), and learns when the last attachment of a PV goes.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, RwLock};

use futures::{Stream, StreamExt};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, ResourceExt};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tracing::{Instrument, debug, info_span, warn};

use crate::k8s::errors::describe_watch;

/// VolumeAttachments by the PV they attach, so the delete path asks "is this PV attached?" in O(1)
/// instead of scanning every attachment (upstream lists all of them on every delete).
#[derive(Clone, Default)]
pub(crate) struct AttachmentIndex {
    inner: Arc<RwLock<IndexState>>,
}

#[derive(Default)]
struct IndexState {
    /// PV name -> (VolumeAttachment name -> node name).
    by_pv: HashMap<String, BTreeMap<String, String>>,
    /// VolumeAttachment name -> PV name, to undo an entry when the attachment changes or goes.
    pv_of: HashMap<String, String>,
    /// Entries collected during a re-list, swapped in atomically when it completes.
    relist: Option<Vec<(String, String, String)>>,
    ready: bool,
    /// Told the name of every PV whose last attachment went away ([`AttachmentIndex::detachments`]).
    detached: Option<mpsc::UnboundedSender<String>>,
}

impl AttachmentIndex {
    /// The node of one attachment naming `pv`, if any exists.
    pub(crate) fn attached_node(&self, pv: &str) -> Option<String> {
        let state = crate::sync::read(&self.inner);
        state
            .by_pv
            .get(pv)
            .and_then(|vas| vas.values().next().cloned())
    }

    /// Whether the initial list has been seen (before that, "not attached" is not known).
    pub(crate) fn is_ready(&self) -> bool {
        crate::sync::read(&self.inner).ready
    }

    /// Completes once the initial list has been seen.
    pub(crate) async fn wait_until_ready(&self) {
        // Start-up only, and the list usually arrives within a round trip: a short poll is
        // simpler than a notification channel that every index would carry for its lifetime.
        while !self.is_ready() {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    }

    /// Applies one watcher event.
    pub(crate) fn apply(&self, event: &watcher::Event<VolumeAttachment>) {
        let mut state = crate::sync::write(&self.inner);
        match event {
            watcher::Event::Init => state.relist = Some(Vec::new()),
            watcher::Event::InitApply(va) => {
                if let (Some(list), Some(entry)) = (state.relist.as_mut(), entry_of(va)) {
                    list.push(entry);
                }
            }
            watcher::Event::InitDone => {
                let entries = state.relist.take().unwrap_or_default();
                let before: Vec<String> = state.by_pv.keys().cloned().collect();
                state.by_pv.clear();
                state.pv_of.clear();
                for (va, pv, node) in entries {
                    state.insert(va, pv, node);
                }
                state.ready = true;
                // Attachments deleted while the watch was down.
                for pv in before {
                    if !state.by_pv.contains_key(&pv) {
                        state.announce(pv);
                    }
                }
            }
            watcher::Event::Apply(va) => {
                let name = va.name_any();
                let known = state.pv_of.contains_key(&name);
                let freed = state.remove(&name);
                if let Some((va, pv, node)) = entry_of(va) {
                    if !known {
                        // Tests (and operators reading -v=5) wait on this before a deletion that
                        // must find the volume attached.
                        debug!(va = %va, pv = %pv, node = %node, "volume attachment observed");
                    }
                    state.insert(va, pv, node);
                }
                if let Some(pv) = freed.filter(|pv| !state.by_pv.contains_key(pv)) {
                    state.announce(pv);
                }
            }
            watcher::Event::Delete(va) => {
                if let Some(pv) = state.remove(&va.name_any()) {
                    state.announce(pv);
                }
            }
        }
    }

    /// Names of PVs as their last VolumeAttachment goes away, so a deletion waiting for the detach
    /// goes on at once instead of at its next retry. One consumer: a new call replaces the last.
    pub(crate) fn detachments(&self) -> impl Stream<Item = String> + Send + 'static {
        let (tx, rx) = mpsc::unbounded_channel();
        crate::sync::write(&self.inner).detached = Some(tx);
        tokio_stream::wrappers::UnboundedReceiverStream::new(rx)
    }

    /// Starts the watch that keeps this index current.
    pub(crate) fn spawn(&self, api: Api<VolumeAttachment>) -> JoinHandle<()> {
        let index = self.clone();
        tokio::spawn(
            async move {
                let stream = watcher(api, watcher::Config::default()).default_backoff();
                futures::pin_mut!(stream);
                while let Some(event) = stream.next().await {
                    match event {
                        Ok(event) => index.apply(&event),
                        Err(e) => warn!(error = %describe_watch(&e), "watch of volumeattachments failed; retrying"),
                    }
                }
            }
            .instrument(info_span!("watch", resource = "volumeattachments")),
        )
    }
}

impl IndexState {
    fn insert(&mut self, va: String, pv: String, node: String) {
        self.by_pv
            .entry(pv.clone())
            .or_default()
            .insert(va.clone(), node);
        self.pv_of.insert(va, pv);
    }

    /// Removes attachment `va`; returns its PV when that was the PV's last attachment.
    fn remove(&mut self, va: &str) -> Option<String> {
        let pv = self.pv_of.remove(va)?;
        let vas = self.by_pv.get_mut(&pv)?;
        vas.remove(va);
        if !vas.is_empty() {
            return None;
        }
        self.by_pv.remove(&pv);
        Some(pv)
    }

    fn announce(&self, pv: String) {
        if let Some(tx) = &self.detached {
            // A closed receiver means the reclaim controller stopped: nothing to tell.
            let _ = tx.send(pv);
        }
    }
}

fn entry_of(va: &VolumeAttachment) -> Option<(String, String, String)> {
    let pv = va.spec.source.persistent_volume_name.clone()?;
    Some((va.name_any(), pv, va.spec.node_name.clone()))
}

#[cfg(test)]
#[path = "attachments_tests.rs"]
pub(crate) mod tests;
