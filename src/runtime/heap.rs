//! Gives freed heap back to the operating system.
//!
//! Why: filling the caches and the first reconcile of every object allocate and free far more than
//! stays live (each object is parsed in full before it is packed, see [`crate::k8s::cache`]), and
//! glibc keeps such freed memory in its arenas: at 10,000 PV/PVC pairs about a fifth of the
//! process's resident memory was free heap nobody would use again. `malloc_trim` hands those
//! pages back; it walks the free lists only, so a pass costs a few milliseconds. Other C
//! libraries (musl) return memory on their own and get no trimming.

use std::time::Duration;

/// How often the heap is trimmed after the first pass.
const INTERVAL: Duration = Duration::from_secs(60);
/// The second pass, counted from the caches being filled: after the first reconciles have run.
const SECOND: Duration = Duration::from_secs(5);

/// Runs the trimming task until `shutdown`; started once the caches are filled (the first pass
/// runs at once: filling them is the largest churn of a sidecar's life).
pub(crate) async fn trim_periodically(shutdown: super::Shutdown) {
    let _ = tokio::task::spawn_blocking(trim).await;
    let mut next = tokio::time::Instant::now() + SECOND;
    loop {
        tokio::select! {
            () = tokio::time::sleep_until(next) => {}
            () = shutdown.clone().requested() => return,
        }
        // Blocking (it takes the allocator's locks), so off the async workers.
        let _ = tokio::task::spawn_blocking(trim).await;
        next = tokio::time::Instant::now() + INTERVAL;
    }
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)] // The crate's one exception (see Cargo.toml's lints).
fn trim() {
    // SAFETY: malloc_trim only releases free memory of the allocator; it has no preconditions.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn trim() {}
