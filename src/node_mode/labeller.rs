//! Node mode: labels our driver's PVs that someone else writes while the fleet runs (an admin's
//! static PV, a restore tool, upstream during a rolling upgrade, an in-tree PV of the plugin our
//! driver took over), within seconds, so that they enter their instance's scoped PV watch
//! ([`scope::own_pv_watch`]), which adds the deletion-protection finalizer and deletes them on
//! release as for the PVs we create.
//!
//! A watch of the PVs without our driver label ([`scope::unlabelled_pv_watch`]) that keeps
//! nothing: each PV is decoded, decided on ([`scope::labels_written_here`]: one writer per PV) and
//! dropped. PVs this sidecar creates carry the labels from the start and never pass here; the PVs
//! of other drivers do, at the cost of one event each per instance. Its initial list also labels
//! this node's PVs written before start-up (an upgrade from upstream or an older version). A PV
//! whose patch keeps failing is tried again at its next change or re-list, and by the clean-up
//! instances' sweep ([`scope::SWEEP_INTERVAL`]).

use std::collections::BTreeMap;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::PersistentVolume;
use k8s_openapi::api::storage::v1::CSINode;
use kube::api::{Patch, PatchParams};
use kube::runtime::reflector::Store;
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use tokio::task::JoinHandle;
use tracing::{Instrument, debug, info, info_span, trace, warn};

use super::scope;
use crate::k8s::cache::watch_events;
use crate::model::locate::PerNodeKeys;
use crate::model::topology::live_instances;
use crate::names;
use crate::retry::{ApiErrorClass, Attempt, classify, describe, retry_transient};

/// Who this instance is, for [`scope::labels_written_here`].
pub(crate) struct Labeller {
    /// The API client.
    pub(crate) client: Client,
    /// Our driver's name.
    pub(crate) driver: String,
    /// `NODE_NAME`.
    pub(crate) me: String,
    /// This node's label values, without [`names::LABEL_VALUE_ANY_NODE`].
    pub(crate) own: Vec<String>,
    /// The keys whose value names one node.
    pub(crate) keys: PerNodeKeys,
    /// Stripped CSINodes: the live instances, for PVs of no single node.
    pub(crate) csinodes: Store<CSINode>,
}

impl Labeller {
    /// Starts the watch on the worker pool; it runs as long as the process.
    pub(crate) fn spawn(self) -> JoinHandle<()> {
        tokio::spawn(self.run().instrument(info_span!("pv-labeller")))
    }

    async fn run(self) {
        debug!("watching PVs without our labels");
        let api: Api<PersistentVolume> = Api::all(self.client.clone());
        let events = watch_events(
            api.clone(),
            scope::unlabelled_pv_watch(),
            "unlabelled persistentvolumes",
        );
        futures::pin_mut!(events);
        while let Some(event) = events.next().await {
            let (watcher::Event::Apply(pv) | watcher::Event::InitApply(pv)) = event else {
                continue;
            };
            let live = || {
                let csinodes = self.csinodes.state();
                live_instances(csinodes.iter().map(AsRef::as_ref), &self.driver)
            };
            let Some(labels) = scope::labels_written_here(
                &pv,
                &self.driver,
                &self.keys,
                &self.own,
                &self.me,
                live,
            ) else {
                trace!(pv = %pv.name_any(), "not ours to label");
                continue;
            };
            self.label(&api, &pv.name_any(), &labels).await;
        }
    }

    /// Patches our labels on, a few quick attempts for transient failures.
    async fn label(
        &self,
        api: &Api<PersistentVolume>,
        name: &str,
        labels: &BTreeMap<String, String>,
    ) {
        let patch = scope::label_patch(labels);
        let patched = retry_transient(
            3,
            Duration::from_millis(200),
            Duration::from_secs(2),
            |_| {
                let patch = &patch;
                async move {
                    match api
                        .patch(name, &PatchParams::default(), &Patch::Merge(patch))
                        .await
                    {
                        Ok(_) => Attempt::Done(Ok(true)),
                        // Deleted meanwhile: nothing to label.
                        Err(e) if classify(&e) == ApiErrorClass::NotFound => {
                            Attempt::Done(Ok(false))
                        }
                        Err(e) if classify(&e).is_retryable() => Attempt::Transient {
                            error: describe(&e),
                            retry_after: classify(&e).retry_after(),
                        },
                        Err(e) => Attempt::Done(Err(describe(&e))),
                    }
                }
            },
        )
        .await;
        let node = labels.get(names::LABEL_PV_NODE).map_or("", String::as_str);
        match patched {
            Ok(true) => {
                info!(pv = %name, %node, "labelled a PV of the driver written without our labels")
            }
            Ok(false) => debug!(pv = %name, "PV deleted before it was labelled"),
            Err(error) => {
                warn!(pv = %name, %node, "labelling a PV of the driver failed (retried at its next change or by the clean-up sweep): {error}")
            }
        }
    }
}
