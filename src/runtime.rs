//! What the controllers run on: the shared [`Context`] (clients, driver, caches, settings), the
//! [`Shutdown`] signal, [`VolumeLocks`], the leadership guard checked right before every
//! CreateVolume, DeleteVolume and PV create ([`Leadership`], applied to the driver by
//! [`GuardedCsi`]; `leader`'s election opens and closes it), the work [`queue`] and its driver
//! both controllers run on, and the [`heap`] trimming. The composition root ([`crate::app`]) builds
//! them; the controllers only use them, so nothing depends on the composition root.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::{CSINode, StorageClass};
use kube::Client;
use kube::runtime::reflector::Store;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::config::Config;
use crate::csi::v1;
use crate::csi::{CsiController, CsiFuture, DriverInfo};
use crate::k8s::cache::{AttachmentIndex, Cache};
use crate::k8s::events::Recorder;
use crate::metrics::Metrics;
use crate::metrics::node_gone::NodeGoneMetrics;

pub(crate) mod heap;
pub(crate) mod queue;

/// Everything the controllers share: clients, the driver, caches and process-wide settings.
pub(crate) struct Context {
    /// Validated flags.
    pub(crate) config: Arc<Config>,
    /// Rate-limited Kubernetes client.
    pub(crate) client: Client,
    /// The driver's controller service, with `--timeout` on every call.
    pub(crate) csi: Arc<dyn CsiController>,
    /// What the handshake learned about the driver.
    pub(crate) driver: Arc<DriverInfo>,
    /// Written into every PV's volume attributes (upstream's provisioner identity).
    pub(crate) identity: String,
    /// Whether the VolumeAttributesClass gate is on after start-up auto-disabling.
    pub(crate) volume_attributes_class: bool,
    /// Events with upstream's source component.
    pub(crate) events: Recorder,
    /// Upstream provisioning/deletion metrics.
    pub(crate) metrics: Arc<Metrics>,
    /// Dead-node metrics.
    pub(crate) node_metrics: NodeGoneMetrics,
    /// Caches.
    pub(crate) stores: Stores,
    /// Volume names with a CreateVolume or DeleteVolume in flight in this process.
    pub(crate) volume_locks: VolumeLocks,
    /// Whether this replica may act now (always without `--leader-election`); checked right
    /// before CreateVolume, DeleteVolume and PV create.
    pub(crate) leadership: Leadership,
}

/// Reflector stores the controllers read from.
#[derive(Clone)]
pub(crate) struct Stores {
    /// PersistentVolumeClaims.
    pub(crate) pvcs: Cache<PersistentVolumeClaim>,
    /// PersistentVolumes.
    pub(crate) pvs: Cache<PersistentVolume>,
    /// StorageClasses.
    pub(crate) classes: Store<StorageClass>,
    /// Nodes (topology or dead-node handling only).
    pub(crate) nodes: Option<Store<Node>>,
    /// CSINodes (topology or dead-node handling only).
    pub(crate) csinodes: Option<Store<CSINode>>,
    /// VolumeAttachments by PV (drivers with PUBLISH_UNPUBLISH_VOLUME only).
    pub(crate) attachments: Option<AttachmentIndex>,
}

/// Names of volumes with a CreateVolume or DeleteVolume in flight, so a claim's create and a PV's
/// delete for the same volume never overlap (upstream issue 1469).
#[derive(Clone, Default)]
pub(crate) struct VolumeLocks(Arc<Mutex<HashSet<String>>>);

/// Held while an operation on one volume name runs; released on drop.
pub(crate) struct VolumeLock {
    locks: VolumeLocks,
    name: String,
}

impl VolumeLocks {
    /// Takes the lock for `name`, or `None` when another operation on it is in flight.
    pub(crate) fn try_lock(&self, name: &str) -> Option<VolumeLock> {
        let mut held = crate::sync::lock(&self.0);
        held.insert(name.to_owned()).then(|| VolumeLock {
            locks: self.clone(),
            name: name.to_owned(),
        })
    }
}

impl Drop for VolumeLock {
    fn drop(&mut self) {
        let mut held = crate::sync::lock(&self.locks.0);
        held.remove(&self.name);
    }
}

/// A shutdown signal every task can wait on.
#[derive(Clone)]
pub(crate) struct Shutdown(watch::Receiver<bool>);

impl Shutdown {
    /// A shutdown signalled by `true` on this channel.
    pub(crate) fn new(receiver: watch::Receiver<bool>) -> Self {
        Self(receiver)
    }

    /// Completes once shutdown was requested.
    pub(crate) async fn requested(mut self) {
        // An error means the sender is gone, which only happens at process exit: stop as well.
        let _ = self.0.wait_for(|stop| *stop).await;
    }

    /// The raw receiver, for APIs that take one.
    pub(crate) fn receiver(&self) -> watch::Receiver<bool> {
        self.0.clone()
    }
}

/// Whether this replica may act right now. Cheap to clone.
#[derive(Clone, Debug, Default)]
pub(crate) struct Leadership {
    /// `None`: no leader election, always allowed. Else the instant until which the last
    /// successful renewal lets us act (`None` inside: not leading).
    until: Option<watch::Receiver<Option<Instant>>>,
}

impl Leadership {
    /// Without leader election: always allowed.
    pub(crate) fn always() -> Self {
        Self::default()
    }

    pub(crate) fn from_receiver(until: watch::Receiver<Option<Instant>>) -> Self {
        Self { until: Some(until) }
    }

    /// Whether an operation may be issued now.
    pub(crate) fn is_acting(&self) -> bool {
        match &self.until {
            None => true,
            Some(rx) => rx.borrow().is_some_and(|until| Instant::now() < until),
        }
    }

    /// Returns once an operation may be issued; waits while this replica does not hold a valid
    /// lease. A leader whose window closed is about to exit (or, with a stuck renewal loop, to
    /// fail its health check), so the wait does not end in that term: nothing is sent that a new
    /// leader could race with.
    pub(crate) async fn acting(&self) {
        let Some(rx) = &self.until else { return };
        let mut rx = rx.clone();
        loop {
            let until = *rx.borrow_and_update();
            if until.is_some_and(|until| Instant::now() < until) {
                return;
            }
            if rx.changed().await.is_err() {
                // The election ended (process exit): never act again.
                std::future::pending::<()>().await;
            }
        }
    }
}

/// A [`CsiController`] whose CreateVolume and DeleteVolume wait for [`Leadership::acting`] right
/// before the call goes out; other calls pass through.
pub(crate) struct GuardedCsi {
    /// The driver's controller service.
    pub(crate) inner: Arc<dyn CsiController>,
    /// Waited for before CreateVolume and DeleteVolume.
    pub(crate) leadership: Leadership,
}

impl CsiController for GuardedCsi {
    fn create_volume(
        &self,
        request: v1::CreateVolumeRequest,
        migrated: bool,
    ) -> CsiFuture<'_, v1::CreateVolumeResponse> {
        Box::pin(async move {
            self.leadership.acting().await;
            self.inner.create_volume(request, migrated).await
        })
    }

    fn delete_volume(
        &self,
        request: v1::DeleteVolumeRequest,
        migrated: bool,
    ) -> CsiFuture<'_, v1::DeleteVolumeResponse> {
        Box::pin(async move {
            self.leadership.acting().await;
            self.inner.delete_volume(request, migrated).await
        })
    }

    fn get_capacity(
        &self,
        request: v1::GetCapacityRequest,
    ) -> CsiFuture<'_, v1::GetCapacityResponse> {
        self.inner.get_capacity(request)
    }

    fn list_volumes(
        &self,
        request: v1::ListVolumesRequest,
    ) -> CsiFuture<'_, v1::ListVolumesResponse> {
        self.inner.list_volumes(request)
    }

    fn controller_get_capabilities(&self) -> CsiFuture<'_, v1::ControllerGetCapabilitiesResponse> {
        self.inner.controller_get_capabilities()
    }
}

#[cfg(test)]
#[path = "runtime_tests.rs"]
mod tests;
