//! The CPU profiler: one profile at a time, sampled at Go's rate.
//!
//! pprof-rs' sampler (a `SIGPROF` timer and a signal handler that walks the stack) costs nothing
//! until the first profile. That allocates its sample table, about 65 MiB (16,384 slots of
//! 128-frame stacks, all written when created), which pprof-rs keeps until the process exits;
//! docs/observability.md tells operators so.

use std::sync::atomic::{AtomicBool, Ordering};

use pprof::{ProfilerGuard, ProfilerGuardBuilder};

use super::encode;
use super::proto::Profile;

/// Go's `runtime.SetCPUProfileRate` default, so sample counts compare with Go profiles.
const HZ: i32 = 100;

/// Libraries the unwinder must not walk from a signal handler: unwinding through them can
/// deadlock on their locks (pprof-rs' advice).
const BLOCKLIST: [&str; 4] = ["libc", "libgcc", "pthread", "vdso"];

/// Set while a profile runs; the process has one `SIGPROF` timer.
static IN_USE: AtomicBool = AtomicBool::new(false);

/// Why a profile could not be taken.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CpuError {
    /// Another request is profiling; Go's wording.
    #[error("cpu profiling already in use")]
    InUse,
    /// pprof-rs could not create its sampler, whose only fallible part is a temporary file it
    /// spills samples to; it remembers the failure, so only a restart retries.
    #[error(
        "the profiler could not be created: it needs a writable temporary directory ($TMPDIR, \
         else /tmp; with a read-only root file system, mount an emptyDir there), then a restart"
    )]
    NoTempDir,
    /// The sampler could not start or report.
    #[error("{0}")]
    Profiler(#[from] pprof::Error),
}

/// A profile being taken; dropping it stops sampling.
pub(crate) struct Running {
    guard: Option<ProfilerGuard<'static>>,
}

impl std::fmt::Debug for Running {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Running").finish_non_exhaustive()
    }
}

/// Starts sampling, unless a profile is already running.
pub(crate) fn start() -> Result<Running, CpuError> {
    if IN_USE.swap(true, Ordering::AcqRel) {
        return Err(CpuError::InUse);
    }
    // From here on, `Running`'s drop releases the flag, including on the error path.
    let mut running = Running { guard: None };
    running.guard = Some(
        ProfilerGuardBuilder::default()
            .frequency(HZ)
            .blocklist(&BLOCKLIST)
            .build()
            .map_err(|err| match err {
                pprof::Error::CreatingError => CpuError::NoTempDir,
                other => CpuError::Profiler(other),
            })?,
    );
    Ok(running)
}

impl Running {
    /// Stops sampling and returns what was sampled, symbolized. Blocking: symbolization reads
    /// the binary's symbol tables.
    pub(crate) fn finish(mut self) -> Result<Profile, CpuError> {
        let Some(guard) = self.guard.take() else {
            return Err(CpuError::Profiler(pprof::Error::NotRunning));
        };
        let report = guard.report().build_unresolved()?;
        // Stopped before symbolizing, so the profile does not sample its own encoding. Stopping
        // swaps in a fresh sample table; the periodic heap trim (runtime::heap) returns the old
        // one's pages to the system.
        drop(guard);
        Ok(encode::profile(&report))
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        drop(self.guard.take());
        IN_USE.store(false, Ordering::Release);
    }
}
