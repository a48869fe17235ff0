//! Worker slots: `--worker-threads` bounds the reconciles that *work* at one time (driver calls,
//! API requests), not those waiting for the intent ledger's next commit. A run that waits for a
//! commit gives its slot back ([`parked`]) and takes one again before it goes on, so one Lease
//! write carries the intent of every claim queued meanwhile, not at most `--worker-threads` of
//! them: under a tight rate limit that is the difference between a ledger write per hundred
//! volumes and one per burst.

use std::cell::RefCell;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use futures::FutureExt;

use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};

/// Runs in flight (working or parked) per slot at most: bounds what parked runs hold in memory.
pub(crate) const RUNS_PER_SLOT: usize = 10;

/// The slots of one controller; cheap to clone.
#[derive(Clone)]
pub(crate) struct Slots {
    permits: Arc<Semaphore>,
    /// Signalled when a parked run gives its slot back, so the controller starts another run.
    freed: Arc<Notify>,
    /// Set once the controller stops: a parked run should not start new work ([`stopping`]).
    stopping: Arc<AtomicBool>,
}

/// The slot a run holds, in its task-local cell while it works.
struct Held {
    permit: OwnedSemaphorePermit,
    slots: Slots,
}

tokio::task_local! {
    static HELD: RefCell<Option<Held>>;
}

impl Slots {
    /// `workers` slots.
    pub(crate) fn new(workers: usize) -> Self {
        Self {
            permits: Arc::new(Semaphore::new(workers.max(1))),
            freed: Arc::new(Notify::new()),
            stopping: Arc::new(AtomicBool::new(false)),
        }
    }

    /// The controller stops: runs coming out of [`parked`] learn it from [`stopping`].
    pub(crate) fn stop(&self) {
        self.stopping.store(true, Ordering::Relaxed);
    }

    /// A free slot, if any. Parked runs waiting to go on get freed slots first (the semaphore is
    /// fair), so new runs never starve them.
    pub(crate) fn try_take(&self) -> Option<OwnedSemaphorePermit> {
        self.permits.clone().try_acquire_owned().ok()
    }

    /// Completes once a parked run gave a slot back since the last call.
    pub(crate) async fn freed(&self) {
        self.freed.notified().await;
    }

    /// Runs `run` holding `permit`; the slot is free again when `run` completes.
    pub(crate) fn run<F: Future>(
        &self,
        permit: OwnedSemaphorePermit,
        run: F,
    ) -> impl Future<Output = F::Output> + use<F> {
        HELD.scope(
            RefCell::new(Some(Held {
                permit,
                slots: self.clone(),
            })),
            run,
        )
    }
}

/// Awaits `wait` without holding a worker slot, then takes a slot again. A `wait` that is ready
/// at once keeps the slot. Outside a run of [`Slots::run`] (tests calling a reconcile directly)
/// it just awaits `wait`.
pub(crate) async fn parked<F: Future>(wait: F) -> F::Output {
    let mut wait = std::pin::pin!(wait);
    if let Some(output) = wait.as_mut().now_or_never() {
        return output;
    }
    let held = HELD
        .try_with(|cell| cell.borrow_mut().take())
        .ok()
        .flatten();
    let Some(Held { permit, slots }) = held else {
        return wait.await;
    };
    drop(permit);
    slots.freed.notify_one();
    let output = wait.await;
    let permit = slots
        .permits
        .clone()
        .acquire_owned()
        .await
        .expect("the slots' semaphore is never closed");
    let _ = HELD.try_with(|cell| *cell.borrow_mut() = Some(Held { permit, slots }));
    output
}

/// Whether the controller of the current run is stopping: a run back from [`parked`] then ends
/// instead of starting work that would hold the shutdown up (up to ten runs per worker may be
/// parked). `false` outside a run.
pub(crate) fn stopping() -> bool {
    HELD.try_with(|cell| {
        cell.borrow()
            .as_ref()
            .is_some_and(|held| held.slots.stopping.load(Ordering::Relaxed))
    })
    .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_parked_run_frees_its_slot_and_takes_one_again_before_it_goes_on() {
        let slots = Slots::new(1);
        let first = slots.try_take().expect("one slot");
        assert!(slots.try_take().is_none(), "one worker at a time");
        let (commit, committed) = tokio::sync::oneshot::channel::<()>();
        let parked_run = tokio::spawn(slots.run(first, async {
            parked(committed).await.expect("sent");
            // Working again: the slot is held.
            "done"
        }));
        // The parked run gave the slot back: another run may start.
        tokio::time::timeout(std::time::Duration::from_secs(5), slots.freed())
            .await
            .expect("the controller is told");
        let second = slots.try_take().expect("the parked run's slot");
        commit.send(()).expect("parked run waits");
        tokio::task::yield_now().await;
        assert!(!parked_run.is_finished(), "it waits for a slot to go on");
        drop(second);
        assert_eq!(parked_run.await.expect("ran"), "done");
        assert!(slots.try_take().is_some(), "the slot is free after the run");
    }

    #[tokio::test]
    async fn outside_a_run_parking_only_waits() {
        assert_eq!(parked(async { 7 }).await, 7);
        assert!(!stopping());
    }

    #[tokio::test]
    async fn a_wait_ready_at_once_keeps_the_slot_and_a_stopping_controller_is_seen() {
        let slots = Slots::new(1);
        let permit = slots.try_take().expect("one slot");
        let probe = slots.clone();
        let (kept, stopped) = slots
            .run(permit, async move {
                assert_eq!(parked(async { 7 }).await, 7);
                let kept = probe.try_take().is_none();
                probe.stop();
                (kept, stopping())
            })
            .await;
        assert!(kept, "no other run could start meanwhile");
        assert!(stopped);
    }
}
