//! Lease-based leader election (`--leader-election`), compatible with upstream's so that our
//! replicas and upstream's contend for one Lease during a rolling upgrade in either direction.
//!
//! This module owns:
//! - [`decide`]: the pure rules (client-go's), the Lease name and identity sanitising;
//! - [`elector`]: the effectful loop that reads and writes the Lease on its own client (its own
//!   request budget), records upstream's events and metric, feeds `/healthz/leader-election`,
//!   and gives the lease up on graceful shutdown;
//! - [`Leadership`]: the guard checked right before every CreateVolume, DeleteVolume and PV
//!   create, valid only until the last successful renewal's *start* plus the renew deadline, on
//!   the local monotonic clock; [`GuardedCsi`] applies it to every CreateVolume/DeleteVolume.
//!
//! Standbys run their watches (warm caches); only the controllers wait for leadership. A leader
//! that loses its lease exits with status 1 as upstream does: its guard is already closed, and a
//! fresh process starts as a standby with no state left over from the lost term.

pub(crate) mod decide;
pub(crate) mod elector;

use std::sync::Arc;

use tokio::sync::watch;
use tokio::time::Instant;

use crate::csi::v1;
use crate::csi::{CsiController, CsiFuture};

pub(crate) use elector::{LeaderElection, LeaderMetrics, lease_namespace, ledger_namespace};

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
#[path = "leader_tests.rs"]
mod tests;
